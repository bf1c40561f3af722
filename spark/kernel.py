"""The running kernel's rules: which kernels break the fabric's RDMA, and which packages would
move a box to another kernel."""

from __future__ import annotations

# Kernels 7.0 and later as Ubuntu builds them enable kexec handover (KHO) at boot
# (CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=y): the nvidia flavour DGX OS 7.6 ships,
# 7.0.0-1019-nvidia, and the generic HWE 7.0.0-30/-31. KHO hands ~9.3 GiB back as MIGRATE_CMA
# pageblocks, which long-term pins refuse, so RDMA memory registration fails under GPU memory
# pressure (`ibv_reg_mr_iova2 failed with error Cannot allocate memory`: NCCL errors, ranks
# lost) where 6.17.0-1032 passes (NVIDIA/NV-Kernels PRs 590 and 591, open; MiaAI-Lab
# DeepSeek-v4.1-Flash-DGX-Sparks#14; supabase/postgres PR 2472 for 7.0.0-30-generic). 6.17
# compiles KHO in but leaves it off unless booted with kho=on. No fixed 7.x is released: every
# 7.x counts until one is.
KHO_DEFAULT_FROM = (7, 0)
# The workaround both PRs measured: zero KHO pageblocks, every registration passing. The kernel
# reads `kho=` with kstrtobool, its last occurrence winning (kernel/kexec_handover.c).
KHO_OFF = "kho=off"
# Debian's and Ubuntu's grub-mkconfig (update-grub) sources /etc/default/grub.d/*.cfg in order
# after /etc/default/grub: a late name appends after any image's own drop-in (Ubuntu's
# 50-cloudimg-settings.cfg sets GRUB_CMDLINE_LINUX_DEFAULT outright).
GRUB_DROPIN = "/etc/default/grub.d/99-spark-kho-off.cfg"

# The packages that move a box to another kernel: Ubuntu's kernel metapackages, each depending on
# the newest ABI's linux-image-<abi>-<flavour> (the nvidia flavour's, and the generic ones where
# installed). Their versions begin with the ABI (linux-nvidia-64k-hwe-24.04 6.17.0-1032.32 for
# kernel 6.17.0-1032: dsx-ai-factory/infra-controller PR 6049), so apt can be pinned to the ABI
# the box runs. The driver's kernel modules (linux-modules-nvidia-580-open-*) are the driver's.
KERNEL_METAPACKAGES = (
    "linux-nvidia*",
    "linux-image-nvidia*",
    "linux-headers-nvidia*",
    "linux-tools-nvidia*",
    "linux-generic*",
    "linux-image-generic*",
    "linux-headers-generic*",
    "linux-tools-generic*",
)

"""Defaults for every host; an inventory's host data overrides them key by key.

Every key here is checked by operations/config.py (HostSettings) before any host is
contacted. Per host, the inventory sets `spark_role` ("head"/"worker") and
`fabric_addresses` ({ifname: "A.B.C.D/prefix"}).
"""

# Branch 580 only: 590.x has a confirmed CUDA-graph deadlock on GB10 (seed 001).
driver_branch = 580

# Installed when no 580 driver package is present; DeepOps installs the -open flavour on
# DGX OS 7 (NVIDIA/deepops roles/nvidia-dgx/vars/ubuntu-24.04.yml).
driver_package = "nvidia-driver-580-open"

# Fabric interface -> its RDMA device: one QSFP DAC shows two ~200 Gb/s twins; NCCL needs
# both in NCCL_IB_HCA or runs at ~3 GB/s (seed 001; dgx-spark-playbooks#102).
fabric_hcas = {"enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}

# Jumbo frames on every fabric interface, equal on all hosts (seed 001; NVIDIA's own
# two-Spark guide leaves 1500: dgx-spark-playbooks#25).
fabric_mtu = 9000

# RoCE v2 + IPv4 GID entry NCCL uses (seed 001); the deploy checks the host's table,
# since another index was seen in the field (GLM-5.3-Flash-EXL3-2x-DGX-Sparks PR#26).
roce_gid_index = 3

# The cluster environment file units and login shells read (no secrets go in it).
env_file = "/etc/spark/cluster.env"

# nvidia-container-toolkit version, as NVIDIA's install guide pins it (Debian version).
toolkit_version = "1.19.0-1"

# NVIDIA's apt repository and signing key for the container toolkit (NVIDIA's install
# guide); $(ARCH) is left for apt to fill in.
toolkit_repo_url = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
toolkit_repo_key_url = "https://nvidia.github.io/libnvidia-container/gpgkey"

# NCCL_DEBUG=INFO shows whether NCCL uses NET/IB or silently fell back to NET/Socket
# (vllm PR#42075); off by default because it is verbose.
nccl_debug = False

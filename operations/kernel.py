"""The running kernel: kexec handover off where the fabric's RDMA runs; held where the owner
says so."""

from __future__ import annotations

import re

from pyinfra import host, logger
from pyinfra.api import FactBase, operation

from operations import util
from operations.asked import Question, answer, question
from operations.debpkg import PackageStates, query

RELEASE = re.compile(r"(\d+)\.(\d+)")
ABI = re.compile(r"(\d+\.\d+\.\d+-\d+)-[a-z]")  # 7.0.0-1019-nvidia: Ubuntu's ABI 7.0.0-1019
ABI_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)-(\d+)")
HOLD_PIN = "/etc/apt/preferences.d/spark-kernel-hold.pref"
GRUB_CFG = "/boot/grub/grub.cfg"  # what update-grub writes (Debian's and Ubuntu's grub-mkconfig)


def kstrtobool(value: str) -> bool | None:
    """A boot option's value as the kernel's kstrtobool reads it (lib/kstrtox.c): y/t/1 and on
    are true, n/f/0 and off false; None for anything else (the option is then ignored)."""
    first, second = value[:1].lower(), value[1:2].lower()
    if first in ("y", "t", "1") or (first, second) == ("o", "n"):
        return True
    if first in ("n", "f", "0") or (first, second) == ("o", "f"):
        return False
    return None


class RunningKernel(FactBase):
    """The running kernel's release, series and ABI (an Ubuntu kernel's
    <version>-<abi>-<flavour>; None for another), kexec handover as its command line sets it
    (`kho=`, the last one: None when absent or unreadable, the kernel's default then), and the
    `kho=` options of GRUB's generated configuration.

    .. code:: python

        {"release": "7.0.0-1019-nvidia", "series": (7, 0), "abi": "7.0.0-1019", "kho": None,
         "grub": ["kho=off"]}
    """

    def command(self) -> str:
        # The release `uname -r` prints (proc(5), /proc/sys/kernel/osrelease), read from the
        # file so that the simulated lab can present another kernel's (tests/simlab/hardware).
        return (
            "printf 'release %s\\n' \"$(cat /proc/sys/kernel/osrelease)\";"
            " printf 'cmdline %s\\n' \"$(cat /proc/cmdline)\";"
            f" grep -hso 'kho=[^[:space:]]*' {GRUB_CFG} | sed 's/^/grub /'; true"
        )

    def process(self, output: list[str]) -> dict[str, object]:
        lines = [line.split(" ", 1) for line in output if " " in line]
        fields = dict(lines)
        release = fields.get("release", "").strip()
        series = RELEASE.match(release)
        abi = ABI.match(release)
        values = [
            word.split("=", 1)[1] for word in fields.get("cmdline", "").split()
            if word.startswith("kho=")
        ]  # fmt: skip
        return {
            "release": release,
            "series": (int(series[1]), int(series[2])) if series else (0, 0),
            "abi": abi[1] if abi else None,
            "kho": kstrtobool(values[-1]) if values else None,
            "grub": sorted({value.strip() for key, value in lines if key == "grub"}),
        }


class KernelPackages(PackageStates):
    """Installed packages of the patterns asked for (the kernel metapackages), with version and
    hold, as PackageStates reads them."""


def abi_key(version: str) -> tuple[int, ...]:
    """The ABI a kernel package's version begins with, comparable: 6.17.0-1032.32 (6, 17, 0,
    1032); () for a version that begins with none."""
    match = ABI_VERSION.match(version)
    return tuple(int(part) for part in match.groups()) if match else ()


def handover_on(found: dict[str, object], default_from: tuple[int, int]) -> bool:
    """Whether the running kernel has kexec handover on: asked for on its command line, or
    left to the default of a series from ``default_from`` on."""
    return found["kho"] is True or (found["kho"] is None and found["series"] >= default_from)


@operation()
def handover_off(
    fix: str,
    default_from: tuple[int, int],
    boot_option: str,
    grub_dropin: str,
):
    """
    Keep kexec handover off on a box of the fabric: RDMA memory registration fails with it.

    + fix: "grub" adds ``boot_option`` to the kernel command line through ``grub_dropin`` and
      update-grub (a reboot applies it: the deploy says so), "refuse" stops the box with the fix
    + default_from: the first kernel series that turns it on at boot, e.g. (7, 0)
    + boot_option: the option that turns it off, kho=off
    + grub_dropin: a file under /etc/default/grub.d/, which update-grub reads

    Nothing is done where the running kernel has it off.
    """
    found = answer(RunningKernel)
    release = found["release"]
    if not handover_on(found, default_from):
        host.noop(f"kernel {release}: kexec handover off, RDMA registration unaffected")
        return
    why = (
        f"kernel {release} boots with kexec handover on, which breaks RDMA memory registration"
        " on the fabric (ibv_reg_mr_iova2 failed with error Cannot allocate memory; NCCL fails:"
        " NVIDIA/NV-Kernels PRs 590, 591)"
    )
    if fix != "grub":
        yield from util.refused(
            f"{host.name}: {why}. Add {boot_option} to the kernel command line"
            " (GRUB_CMDLINE_LINUX_DEFAULT in a file under /etc/default/grub.d/, update-grub,"
            " reboot), boot a 6.17 kernel, or set fabric_kernel_kho_off = True for the deploy"
            " to add it"
        )
        return
    changes = util.template("grub-kho-off.cfg.j2", grub_dropin, boot_option=boot_option)
    yield from changes
    if changes or boot_option not in found["grub"]:
        yield "update-grub"
    host.log(
        f"{why}: {boot_option} is set for the next boot; reboot this box to apply it. Until"
        " then the NCCL test fails.",
        log_func=logger.warning,
    )


@operation()
def held(packages: tuple[str, ...], pin_path: str = HOLD_PIN):
    """
    Hold the running kernel: the kernel metapackages installed held (apt-mark), and apt pinned
    so that none of them moves to another ABI than the running kernel's.

    + packages: dpkg-query patterns of the kernel metapackages, e.g. linux-nvidia*; () when the
      owner holds no kernel: the pin file this wrote before is removed (apt-mark's holds stay:
      which of them the owner made is not known; `apt-mark unhold` them to move the kernel)
    + pin_path: the apt preferences file: the patterns at <abi>.* get 990, at any other version
      -1 (as the driver's branch pin does)

    Refuses a kernel that is no Ubuntu build (no ABI to pin to). A metapackage already at a newer
    ABI (installed, not yet booted) is left as it is and named: the next boot may start it.
    """
    if not packages:
        if util.on_box(pin_path)[pin_path] is None:
            host.noop("the kernel is not held (kernel_hold off)")
        else:
            yield f"rm -f {pin_path}"
        return
    found = answer(RunningKernel)
    release, abi = found["release"], found["abi"]
    if abi is None:
        yield from util.refused(
            f"{host.name}: kernel {release} is no Ubuntu build (<version>-<abi>-<flavour>):"
            " kernel_hold pins Ubuntu's kernel metapackages to the running ABI; set kernel_hold"
            " = False for this box"
        )
        return
    yield from util.template(
        "apt-preferences-kernel-hold.j2",
        pin_path,
        release=release,
        abi=abi,
        patterns=" ".join(packages),
    )
    installed = answer(KernelPackages, patterns=packages)
    running = abi_key(abi)
    elsewhere = sorted(
        f"{name} {state['version']}"
        for name, state in installed.items()
        if abi_key(str(state["version"])) > running
    )
    if elsewhere:
        host.log(
            f"kernel {release} held, but {', '.join(elsewhere)} already installed: the next"
            " boot may start that kernel (GRUB boots the newest)",
            log_func=logger.warning,
        )
    if all(state["held"] for state in installed.values()):
        host.noop(f"kernel metapackages of {release} held ({len(installed)} installed)")
        return
    yield (
        f"{query(packages)} 2>/dev/null"
        " | awk -F'\\t' '$1 ~ /^.i/ {print $2}' | xargs -r apt-mark hold"
    )


def handover_questions(grub_dropin: str) -> list[Question]:
    """What ``handover_off`` reads (operations/asked.py)."""
    return [question(RunningKernel), question(util.RootFiles, paths=(grub_dropin,))]


def held_questions(packages: tuple[str, ...], pin_path: str = HOLD_PIN) -> list[Question]:
    """What ``held`` reads for these metapackages (operations/asked.py)."""
    pin = question(util.RootFiles, paths=(pin_path,))
    if not packages:
        return [pin]
    return [question(RunningKernel), pin, question(KernelPackages, patterns=packages)]

"""Keep the GB10 on NVIDIA driver branch 580."""

from __future__ import annotations

import re
import shlex

from pyinfra import host, logger
from pyinfra.api import FactBase, operation

from operations import util
from operations.asked import Question, answer, question
from operations.debpkg import PackageStates, apt_install, query

# Packages whose version is the driver's version, in Ubuntu's and NVIDIA's naming (branch
# suffixed, like libnvidia-compute-580, and the unsuffixed names used from 590 on, like
# nvidia-driver-open). Metapackages not listed (cuda-drivers, nvidia-open...) cannot bring another
# branch either: what they depend on is listed. Never add a pattern that also matches the
# container toolkit (nvidia-container-toolkit*, libnvidia-container*), whose versions are 1.x.
DRIVER_FAMILY = (
    "nvidia-driver-[0-9]*",
    "nvidia-driver-open*",
    "nvidia-dkms*",
    "nvidia-kernel-common*",
    "nvidia-kernel-source*",
    "nvidia-utils*",
    "nvidia-compute-utils*",
    "nvidia-firmware*",
    "xserver-xorg-video-nvidia*",
    "libnvidia-cfg1*",
    "libnvidia-common*",
    "libnvidia-compute*",
    "libnvidia-decode*",
    "libnvidia-encode*",
    "libnvidia-extra*",
    "libnvidia-fbc1*",
    "libnvidia-gl*",
)
BRANCH_IN_NAME = re.compile(r"-(\d{3})(?=-|$)")  # nvidia-driver-590-open, libnvidia-gl-590
# A package whose name carries its build (Ubuntu's nvidia-firmware-580-580.95.05): a newer build
# is another package, brought by the driver's dependencies, never the same name moved.
BUILD_IN_NAME = re.compile(r"-\d+\.\d+[\d.]*$")
PIN_PATH = "/etc/apt/preferences.d/nvidia-driver-branch.pref"
SMI_QUERY = "nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader"
# nvidia-smi's first line when the driver's libraries differ from the loaded kernel module (the
# packages upgraded since the boot), then "NVML library version: 570.124":
# tinygrad/open-gpu-kernel-modules#47; a reboot loads the installed module,
# oddmario/NVIDIA-Ubuntu-Driver-Guide#4; until then a new container's GPU fails the same way
# ("nvml error: driver/library version mismatch", NVIDIA/nvidia-container-toolkit#394).
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
NVML_LIBRARY = "NVML library version: "


class DriverPackages(PackageStates):
    """Installed NVIDIA driver packages (DRIVER_FAMILY), with version and hold.

    .. code:: python

        {"nvidia-driver-580-open": {"version": "580.142-0ubuntu0.24.04.1", "held": True}}
    """

    patterns = DRIVER_FAMILY


class NvidiaSmi(FactBase):
    """What nvidia-smi reports of the first GPU, or None when it is absent or cannot reach a
    driver (it then prints its complaint on stdout, which does not parse as the CSV).

    .. code:: python

        {"name": "NVIDIA GB10", "driver_version": "580.142", "compute_cap": "12.1"}
    """

    def command(self) -> str:
        return f"{SMI_QUERY} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, str] | None:
        fields = [field.strip() for field in output[0].split(",")] if output else []
        if len(fields) != 3 or not re.fullmatch(r"\d+\.[\d.]+", fields[1]):
            return None
        return dict(zip(("name", "driver_version", "compute_cap"), fields, strict=True))


class NvmlMismatch(FactBase):
    """The NVML library version nvidia-smi names when the installed driver's libraries differ
    from the loaded kernel module (the driver upgraded since the boot): "" if it names none;
    None when there is no such mismatch.

    .. code:: python

        "580.159"
    """

    def command(self) -> str:
        return f"{SMI_QUERY} 2>&1 || true"

    def process(self, output: list[str]) -> str | None:
        if MISMATCH not in (line.strip() for line in output):
            return None
        named = [line.strip()[len(NVML_LIBRARY) :] for line in output if NVML_LIBRARY in line]
        return named[0] if named else ""


def _on_branch(version: str, branch: int) -> bool:
    return version.startswith(f"{branch}.")


def _names_other_branch(name: str, branch: int) -> bool:
    named = BRANCH_IN_NAME.search(name)
    return named is not None and named[1] != str(branch)


def _other_smi_version(smi: dict[str, str] | None, branch: int) -> str | None:
    """Why this box is refused when nvidia-smi reports a driver of another branch; None if not."""
    if smi and not _on_branch(smi["driver_version"], branch):
        return (
            f"{host.name}: nvidia-smi reports driver {smi['driver_version']} loaded, not branch"
            f" {branch}. If the {branch} packages were just installed, reboot; otherwise another"
            f" driver is loaded: remove it, install the {branch} package and reboot."
        )
    return None


@operation()
def branch_held(
    branch: int,
    package: str,
    version: str | None = None,
    pin_path: str = PIN_PATH,
):
    """
    Install and hold the driver of one branch; pin apt so nothing brings another branch.

    + branch: the driver branch, e.g. 580
    + package: the driver package to install when no driver of the branch is, e.g.
      nvidia-driver-580-open (DGX OS 7 ships the -open flavour; an installed one is kept)
    + version: None (the build apt installs first, kept), or the Debian version of the branch
      every installed driver package is moved to, up or down, past its hold, and held again
    + pin_path: the apt preferences file: DRIVER_FAMILY at version <branch>.* gets 990, at any
      other version -1, so `apt upgrade` and metapackages such as nvidia-driver-open (590)
      cannot move the box to another branch

    Refuses (never downgrades) when a driver package or the loaded driver is of another branch.

    **Example:**

    .. code:: python

        driver.branch_held(name="Hold driver branch 580", branch=580,
                           package="nvidia-driver-580-open")
    """
    # Arguments the inventory's checks refuse before any box is contacted (spark/inventory/box.py:
    # driver_package, driver_version); here they stop this box alone.
    wrong = []
    if _names_other_branch(package, branch):
        wrong.append(
            f"driver_package {package} is not of branch {branch}; use nvidia-driver-{branch}-open"
        )
    if version is not None and not _on_branch(version, branch):
        wrong.append(
            f"driver_version {version} is not of branch {branch}; use None or a {branch}.x build"
        )
    if wrong:
        yield from util.refused(f"{host.name}: " + "; ".join(wrong))
        return
    installed = answer(DriverPackages)
    others = {
        name: state["version"]
        for name, state in installed.items()
        if not _on_branch(str(state["version"]), branch) or _names_other_branch(name, branch)
    }
    if others:
        listed = ", ".join(f"{name} {version}" for name, version in sorted(others.items()))
        yield from util.refused(
            f"{host.name}: driver packages not on branch {branch} are installed: {listed}."
            f" Branch {branch} is required (590 deadlocks CUDA graphs on GB10); this deploy"
            " will not downgrade a driver by itself. To go back: apt-get purge"
            f" {' '.join(sorted(others))}; apt-get install {package}; reboot; run the deploy"
            " again."
        )
        return
    if other := _other_smi_version(answer(NvidiaSmi), branch):
        yield from util.refused(other)
        return

    # The pin first, so that the install below cannot pull another branch.
    yield from util.template(
        "apt-preferences-nvidia-driver.j2",
        pin_path,
        branch=branch,
        patterns=" ".join(DRIVER_FAMILY),
    )
    install = not any(
        name == package or name.startswith(f"nvidia-driver-{branch}") for name in installed
    )
    # Each driver package at the version asked (they are built together: one version for all).
    moved = sorted(
        name
        for name, state in installed.items()
        if state["version"] != version and not BUILD_IN_NAME.search(name)
    )
    move = bool(version and moved and not install)
    if install:
        yield apt_install(f"{package}={version}" if version else package)
    if move:
        yield apt_install(
            "--allow-downgrades",
            "--allow-change-held-packages",
            *(f"{name}={version}" for name in moved),
        )
    if install or move or not all(state["held"] for state in installed.values()):
        # The packages the install brought are not known before it runs: ask dpkg afterwards.
        yield (
            f"{query(DRIVER_FAMILY)} 2>/dev/null"
            f" | awk -F'\\t' '$1 ~ /^.i/ && $3 ~ /^{branch}\\./ {{print $2}}'"
            " | xargs -r apt-mark hold"
        )
    else:
        at = f" at {version}" if version else ""
        host.noop(f"driver packages of branch {branch} are installed{at} and held")


@operation()
def running(branch: int):
    """
    Check that the loaded driver is of the branch (nvidia-smi answers with its version).

    + branch: the driver branch, e.g. 580

    Refuses another branch. When the driver's packages moved since the boot (nvidia-smi:
    Driver/library version mismatch) it changes nothing and says, at every run until then, that
    the box needs a reboot. When nvidia-smi does not answer (before the driver is installed, in
    a dry run) it yields a check that runs after the install: it passes when the driver
    answers then and fails otherwise, asking for the reboot a fresh install needs on real boxes.
    """
    smi = answer(NvidiaSmi)
    if other := _other_smi_version(smi, branch):
        yield from util.refused(other)
        return
    if smi:
        host.noop(f"{smi['name']} runs driver {smi['driver_version']}")
        return
    library = answer(NvmlMismatch)
    if library is not None:
        host.log(
            f"the driver's packages (NVML {library or 'library'}) differ from the kernel module"
            " loaded at boot: reboot this box to load the installed driver. Until then nvidia-smi"
            " fails and new containers cannot use the GPU.",
            log_func=logger.warning,
        )
        return
    message = shlex.quote(
        f"driver {branch} does not answer nvidia-smi: reboot to load it (a fresh install needs"
        " one on a real box), then run the deploy again"
    )
    yield (
        f"nvidia-smi --query-gpu=driver_version --format=csv,noheader | grep -q '^{branch}\\.'"
        f" || {{ echo {message} >&2; false; }}"
    )


def questions() -> list[Question]:
    """What ``branch_held`` and ``running`` read (operations/asked.py)."""
    return [
        question(DriverPackages),
        question(NvidiaSmi),
        question(NvmlMismatch),
        question(util.RootFiles, paths=(PIN_PATH,)),
    ]

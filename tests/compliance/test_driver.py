"""The driver promise: branch 580 installed, held, running, apt kept off other branches, and
every box of the inventory (those checked: --limit narrows it) running the same driver, the one
driver_version names where it names one (docs/reference.md: "A newer driver")."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from fnmatch import fnmatch
from typing import TYPE_CHECKING

from operations.driver import DRIVER_FAMILY, branch_held

if TYPE_CHECKING:
    from tests.compliance.conftest import Box

PIN_PATH = inspect.signature(branch_held).parameters["pin_path"].default
# What would bring another branch: the metapackage that follows the newest branch, the branch
# known to deadlock CUDA graphs on GB10, and any upgrade.
SIMULATIONS = ("install nvidia-driver-open", "install nvidia-driver-590-open", "dist-upgrade")
# Simulated, with empty cache paths: apt keeps its package cache in memory and writes nothing.
APT_SIMULATE = "apt-get -s -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache="
SMI = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
SMI_FAILED = "nvidia-smi failed:"  # its complaint (NVML's version mismatch) is on stdout
INST = re.compile(r"^Inst (\S+) (?:\[\S+\] )?\((\S+)", re.M)  # "Inst name [old] (new suite..."


def _family(name: str) -> bool:
    return any(fnmatch(name, pattern) for pattern in DRIVER_FAMILY)


def test_driver_packages_held(box: Box, found: Callable[[object], None]) -> None:
    """driver packages on the branch, held"""
    branch = box.plan.driver.branch
    installed = box.packages(*DRIVER_FAMILY)
    off_branch = [f"{n} {v}" for n, (v, _) in installed.items() if not v.startswith(f"{branch}.")]
    unheld = [name for name, (_, held) in installed.items() if not held]
    problems = []
    if not any(name.startswith(f"nvidia-driver-{branch}") for name in installed):
        problems.append(f"no nvidia-driver-{branch}* installed")
    if off_branch:
        problems.append(f"off branch: {', '.join(off_branch)}")
    if unheld:
        problems.append(f"not held: {', '.join(unheld)}")
    found("; ".join(problems))
    assert not problems, (
        f"expected the driver packages of branch {branch} installed and held, found:"
        f" {'; '.join(problems)}"
    )


def test_nvidia_smi_reports_the_branch(box: Box, found: Callable[[object], None]) -> None:
    """nvidia-smi driver branch"""
    branch = box.plan.driver.branch
    smi = box.run(SMI)
    version = smi.stdout.strip() if smi.rc == 0 else f"nvidia-smi failed: {smi.stderr.strip()}"
    found(version)
    assert version.startswith(f"{branch}."), f"expected a {branch}.x driver, found {version}"


def _smi_version(box: Box) -> str:
    smi = box.run(SMI)
    return smi.stdout.strip() if smi.rc == 0 else f"{SMI_FAILED} {smi.stdout.strip()}"


def test_every_box_runs_the_same_driver(
    box: Box, every_box: list[Box], found: Callable[[object], None]
) -> None:
    """driver the same on every box"""
    versions = {other.name: _smi_version(other) for other in every_box}
    mine = versions[box.name]
    # nvidia-smi reports the driver's upstream version: the Debian version's part before "-".
    asked = box.plan.driver.version
    wanted = asked.split("-")[0] if asked else mine
    others = {
        name: version
        for name, version in versions.items()
        if version != wanted or version.startswith(SMI_FAILED)
    }
    found(", ".join(f"{name} {version}" for name, version in others.items()))
    assert not others, (
        f"expected every box on driver {wanted}, found {others}; deploy (driver_version moves"
        " every box to one build) and reboot the boxes whose nvidia-smi fails"
    )


def test_apt_would_not_install_another_branch(box: Box, found: Callable[[object], None]) -> None:
    """apt refuses other driver branches"""
    branch = box.plan.driver.branch
    others = []
    for simulation in SIMULATIONS:
        # A package apt cannot install (pinned away, or unknown) prints no Inst line.
        output = box.run(f"{APT_SIMULATE} {simulation} 2>&1").stdout
        others += [
            f"{name} {version}"
            for name, version in INST.findall(output)
            if _family(name) and not version.startswith(f"{branch}.")
        ]
    listed = ", ".join(sorted(set(others)))
    found(f"would install {listed}")
    assert not others, (
        f"expected apt to install no driver package off branch {branch}, found that"
        f" apt-get {' / '.join(SIMULATIONS)} would install {listed}"
    )


def test_apt_pin_file(box: Box, found: Callable[[object], None]) -> None:
    """apt pin file for the branch"""
    branch = box.plan.driver.branch
    pin = box.host.file(PIN_PATH)
    text = pin.content_string if pin.is_file else ""
    lines = [f"Pin: version {branch}.*", "Pin-Priority: -1"]  # prefer the branch, refuse others
    missing = [line for line in lines if line not in text.splitlines()]
    state = "absent" if not pin.is_file else "; ".join(f"no {line!r}" for line in missing)
    found(state)
    assert pin.is_file and not missing, f"expected {PIN_PATH} with {lines}, found {state}"

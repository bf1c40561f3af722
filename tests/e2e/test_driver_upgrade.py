"""A newer driver within the held branch, on the deployed pair (docs/reference.md: "A newer
driver"): the
lab's DGX OS archive gains a newer 580 build (its dgx-updates repository added to the boxes'
apt sources, as an archive update would bring it), the owner asks for it (driver_version),
every box moves to it and holds it, and is told to reboot (its nvidia-smi now fails with NVML's
version mismatch, as a real box's does); a second run changes nothing. The boxes are then put
back on the lab's default build (the later modules check nvidia-smi) without the new source."""

from __future__ import annotations

import shlex

import pytest

from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import INVENTORY, output_of
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab
from tests.simlab import standins

pytestmark = pytest.mark.lab

NEW = standins.DRIVER_UPDATES["580"][0]
OLD = standins.DRIVER_BRANCHES["580"][0]
SOURCE = "/etc/apt/sources.list.d/dgx-os-updates.list"
# The lab's own sources line for its archive (tests/simlab/lab.py), for the updates repository.
UPDATES = (
    "deb [signed-by=/usr/share/keyrings/dgx-os-archive-keyring.gpg]"
    f" file:{simlab.REPOS_MOUNT}/{standins.DGX_UPDATES} /"
)
PACKAGES = ("nvidia-driver-580-open", "libnvidia-compute-580")  # the stand-in's 580 packages
SMI = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
# operations/driver.py running()'s warning, on the box's own line ("[spark-1] ...").
REBOOT = "reboot this box to load the installed driver"


def told_to_reboot(output: str) -> set[str]:
    return {line.split("]")[0].strip(" [") for line in output.splitlines() if REBOOT in line}


def driver(host: simlab.Host) -> tuple[set[str], bool]:
    """The versions of the 580 packages, and whether all of them are held."""
    names = " ".join(PACKAGES)
    lines = run_on(host, f"dpkg-query -W -f='${{Version}}\\n' {names}").split()
    held = set(run_on(host, "apt-mark showhold").split())
    return set(lines), held >= set(PACKAGES)


def deploy(version: str) -> str:
    return output_of(pyinfra(INVENTORY, "deploy.py", "--data", f"driver_version={version}"))


def test_a_newer_580_build_asked_for_is_installed_held_and_needs_a_reboot(
    deployed_lab: Deployed,
) -> None:
    hosts = deployed_lab.lab.hosts
    for host in hosts:
        assert driver(host) == ({OLD}, True)
        run_on(host, f"echo {shlex.quote(UPDATES)} | sudo tee {SOURCE} >/dev/null")
        run_on(host, "sudo apt-get update -qq")
        assert NEW in run_on(host, "apt-cache madison nvidia-driver-580-open")
    try:
        first = deploy(NEW)
        for host in hosts:
            assert driver(host) == ({NEW}, True), host.name
            smi = run_on(host, SMI, check=False)
            assert "Driver/library version mismatch" in smi, smi
        assert told_to_reboot(first) == {host.name for host in hosts}, first
        # Compliance names it: no box answers with a driver until it reboots.
        code, table, output = compliance("-k", "every_box_runs_the_same_driver")
        assert code == 1, output
        assert set(not_passing(table)) == {
            (host.name, "driver the same on every box") for host in hosts
        }, output
        second = pyinfra(INVENTORY, "deploy.py", "--data", f"driver_version={NEW}")
        assert changes(second) == 0
        # Said at every run until the reboot.
        assert told_to_reboot(output_of(second)) == {host.name for host in hosts}
    finally:
        for host in hosts:
            run_on(host, f"sudo rm -f {SOURCE}")
        deploy(OLD)
    for host in hosts:
        assert driver(host) == ({OLD}, True), host.name
        assert run_on(host, SMI).strip() == OLD.split("-")[0]  # the module loaded all along

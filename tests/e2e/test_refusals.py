"""States the deploy must refuse on the lab: loudly, naming the box, before it does harm."""

from __future__ import annotations

import time

import pytest

from tests.conftest import pyinfra, run_on
from tests.simlab import lab as simlab

pytestmark = pytest.mark.lab


def test_a_590_driver_stops_the_run_before_anything_else(lab: simlab.Lab) -> None:
    host = simlab.reimage(lab.hosts[1].name)
    simlab.write_ssh_files(lab)
    simlab.wait_ready(host, time.monotonic() + simlab.BOOT_TIMEOUT)
    run_on(host, "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive "
                 "apt-get install -y -qq nvidia-driver-open")  # fmt: skip
    result = pyinfra("inventories/sim.py", "deploy.py", "--limit", host.name, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert host.name in output and "590" in output
    # Refused before any change: no fabric profile, no toolkit, nothing held.
    assert "nvidia-container-toolkit" not in run_on(host, "dpkg-query -W 'nvidia*' || true")
    assert run_on(host, "apt-mark showhold").strip() == ""


def test_a_new_users_slips_are_refused_at_once_before_any_box_is_contacted(
    lab: simlab.Lab,
) -> None:
    """Issue 37's slips, as a new user makes them on the lab's inventory: a key file that is not
    there, nvidia-smi's form of a driver version, a misspelt twin, two workers and a --limit
    naming no box. Each is named, with its fix, the first time; pyinfra connects to no box."""
    names = [host.name for host in lab.hosts]
    twins = '{"enp1s0f1np0": "192.168.100.11/24", "enP2p1s0f1np1": "192.168.101.11/24"}'
    result = pyinfra(
        "inventories/sim.py", "deploy.py", "--limit", "spark-2.local",
        "--key", "/nonexistent/id_ed25519", "--data", "driver_version=580.159.03",
        "--data", f"fabric_addresses={twins}", "--data", "spark_role=worker", check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr

    assert result.returncode == 1
    assert (
        f"--limit spark-2.local: no box or group of the inventory matches; the boxes:"
        f" {', '.join(names)} (groups: sim, spark); give one of them"
    ) in output
    for name in names:
        for slip in (
            f"{name}: ssh_key: no file '/nonexistent/id_ed25519' on this machine",
            f"{name}: driver_version: 580.159.03 has no Debian revision (it is the driver's own"
            " version, as nvidia-smi prints it), and apt has no such version; use the version"
            " `apt-cache madison nvidia-driver-580-open` lists for it, e.g. 580.159.03-0ubuntu1",
            f"{name}: fabric_addresses: 'enp1s0f1np0' is not one of the box's twins for its"
            " cabling (pair, port 1: enp1s0f1np1, enP2p1s0f1np1); use those names",
        ):
            assert slip in output
    assert (
        f"{', '.join(names)}: spark_role: no host is the head; set spark_role = 'head' on exactly"
        " one host"
    ) in output
    assert f"the inventory data has {3 * len(names) + 1} problem(s)" in output
    assert "No box was contacted." in output
    assert "Connecting to hosts" not in output
    assert "Traceback" not in output

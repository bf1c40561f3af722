"""States the deploy must refuse on the lab: loudly, naming the box, before it does harm."""

from __future__ import annotations

import time

import pytest

from tests.conftest import pyinfra, run_on
from tests.simlab import lab as simlab

pytestmark = pytest.mark.lab


def test_gid_entry_at_index_4_stops_the_run_naming_host_hca_and_index(lab: simlab.Lab) -> None:
    host = lab.hosts[1]
    simlab.set_gid_index(host, 4)
    try:
        time.sleep(1)
        result = pyinfra("inventories/sim.py", "deploy.py", check=False)
        output = result.stdout + result.stderr
        assert result.returncode != 0
        assert host.name in output
        assert "rocep1s0f1" in output
        assert "index 4" in output or "at 4" in output, output
    finally:
        simlab.set_gid_index(host, 3)


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

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

"""A box set up as NVIDIA's two-Spark guide has owners do it: its twins in netplan's
/etc/netplan/40-cx7.yaml (tests/unit/captured/public-netplan-40-cx7-node2.yaml: the guide's
node 2 file, NVIDIA/dgx-spark-playbooks connect-two-sparks, Step 3, Option 1), which netplan
turns into NetworkManager profiles of its own (`netplan-<twin>`). The deploy refuses it, naming
the option; with `fabric_take_over_netplan` it moves the file aside, its profiles go, and the
box's own survive a reboot (addresses, MTU 9000); the deploy after changes nothing."""

from __future__ import annotations

import re

import pytest

from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import INVENTORY, converged, output_of
from tests.e2e.test_reboot import came_back
from tests.simlab import lab as simlab
from tests.unit.harness import captured

pytestmark = pytest.mark.lab

CX7 = "/etc/netplan/40-cx7.yaml"


def netplan_profiles(host: simlab.Host) -> list[str]:
    names = run_on(host, "nmcli -g NAME connection show").split()
    return sorted(name for name in names if name.startswith("netplan-"))


def test_nvidias_netplan_file_refused_then_taken_over_and_a_reboot_keeps_the_fabric(
    deployed_lab: Deployed,
) -> None:
    head, worker = deployed_lab.lab.hosts
    twins = [twin for twin, _hca in simlab.FABRIC_TWINS]
    run_on(
        worker,
        f"sudo tee {CX7} >/dev/null <<'EOF'\n{captured('public-netplan-40-cx7-node2.yaml')}EOF",
    )
    run_on(worker, f"sudo chmod 600 {CX7}")
    # What netplan's boot generator does (`netplan apply` stops NetworkManager in the lab's
    # container): a profile per twin, which the owner's box runs on them.
    run_on(worker, "sudo netplan generate && sudo nmcli connection reload")
    for twin in twins:
        run_on(worker, f"sudo nmcli connection up id netplan-{twin}")
    assert netplan_profiles(worker) == sorted(f"netplan-{twin}" for twin in twins)

    refused = pyinfra(INVENTORY, "deploy.py", "--limit", worker.name, check=False)
    output = output_of(refused)
    assert refused.returncode != 0
    assert re.search(
        f"{worker.name}: {CX7} configure.s. .*set fabric_take_over_netplan = True", output
    )

    taken = pyinfra(INVENTORY, "deploy.py", "--data", "fabric_take_over_netplan=True")
    assert "netplan files naming them moved aside" in output_of(taken)
    (moved,) = run_on(worker, "ls /etc/netplan").split()
    assert re.fullmatch(r"40-cx7\.yaml\.moved-aside-by-spark-\d{8}T\d{6}Z", moved)
    assert netplan_profiles(worker) == []

    simlab.reboot(worker.name)
    came_back(worker, head)  # the fabric profiles up at MTU 9000, the lanes serving
    assert netplan_profiles(worker) == []
    for twin, address in (
        ("enp1s0f1np1", "192.168.100.11/24"),
        ("enP2p1s0f1np1", "192.168.101.11/24"),
    ):
        assert run_on(worker, f"ip -4 -o address show dev {twin}").split()[3] == address
    converged()

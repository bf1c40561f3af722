"""Four boxes through a switch (fabric_topology "switch"): the lab puts each box's port 1 twins
into a switch, one L2 segment per twin; the inventory gives no lanes and no fabric addresses, so
the deploy derives .10 to .13 on each twin's subnet, writes the switch's NCCL environment,
joins the four boxes in one Ray cluster, runs the NCCL test on all four and converges; every box
reaches every other on each twin with full-size frames, compliance passes and a second run
changes nothing.

Times on the 2-core machine, beside another lab's full suite (four boxes, no lanes): the
converging deploy 27 and 47 s in two runs before the NCCL test stage, 23 and 55 s in two with
it; the deploy that changes nothing 5-8 s; the module 2-3 min (two lab boots, Ray's four nodes
joining, compliance).

It boots four bare boxes through a switch and leaves them up (conftest.cabled).
"""

from __future__ import annotations

import re
import time

import pytest

from operations import ray
from tests.conftest import cabled, pyinfra, run_on
from tests.e2e.runs import output_of
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab

pytestmark = [pytest.mark.lab, pytest.mark.recabled]

INVENTORY = "tests/e2e/fabric_inventory.py"
BOXES = 4
# One subnet per twin for every box, .10 for the first and on (README, Fabric shapes).
SUBNETS = {"enp1s0f1np1": "192.168.100", "enP2p1s0f1np1": "192.168.101"}


@pytest.fixture(scope="module")
def switched(lab: simlab.Lab) -> simlab.Lab:
    switch_lab = cabled(lab, "switch", count=BOXES)
    start = time.monotonic()
    result = pyinfra(INVENTORY, "deploy.py")
    print(f"switch: the converging deploy took {time.monotonic() - start:.0f} s")
    assert changes(result) > 0
    return switch_lab


def test_every_box_reaches_every_other_on_each_twin(switched: simlab.Lab) -> None:
    for host in switched.hosts:
        for twin, subnet in SUBNETS.items():
            own = f"{subnet}.{9 + host.index}/24"
            assert own in run_on(host, f"ip -4 -br address show {twin}"), (host.name, twin)
            others = [f"{subnet}.{9 + other.index}" for other in switched.hosts if other != host]
            pings = "; ".join(
                f"ping -c 1 -W 2 -M do -s 8972 -I {twin} {peer} >/dev/null && echo {peer}"
                for peer in others
            )
            answered = run_on(host, pings, check=False).split()
            assert answered == others, (host.name, twin, answered)


def test_nccl_environment_of_a_switch(switched: simlab.Lab) -> None:
    for host in switched.hosts:
        env = run_on(host, "cat /etc/spark/cluster.env")
        expected = {
            "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
            "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
            "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
            "VLLM_HOST_IP": f"192.168.100.{9 + host.index}",
            "MASTER_ADDR": "192.168.100.10",
        }
        for key, value in expected.items():
            assert re.search(rf'^{key}="{value}"$', env, re.M), (host.name, key, env)
        assert "NCCL_IB_MERGE_NICS" not in env  # NCCL's default on a switch


def test_the_four_boxes_are_one_ray_cluster(switched: simlab.Lab) -> None:
    head = switched.hosts[0]
    # The workers join as they come (each retries every 10 s): it waits up to two minutes.
    said = run_on(head, f"sudo {ray.NODES_COMMAND} {BOXES} 120 2>&1").strip()
    assert said.splitlines()[-1] == f"{BOXES} of {BOXES} Ray nodes are alive", said


def test_compliance_passes_and_a_second_deploy_changes_nothing(switched: simlab.Lab) -> None:
    code, table, output = compliance("--inventory", INVENTORY)
    assert code == 0 and not not_passing(table), output
    assert {box for row in table.values() for box in row} == {h.name for h in switched.hosts}
    assert set(table["NCCL test passed"].values()) == {"PASS"}, table  # all four ranks
    start = time.monotonic()
    again = pyinfra(INVENTORY, "deploy.py")
    print(f"switch: the deploy that changes nothing took {time.monotonic() - start:.0f} s")
    assert changes(again) == 0, output_of(again)

"""Three boxes in a ring (fabric_topology "ring3"): the lab cables port 0 of each box to port 1 of
the next (NVIDIA's connect-three-sparks), the inventory gives no lanes and no fabric addresses;
the deploy derives one subnet per twin per cable, so each box's two ports sit on its two
neighbours' subnets, writes the ring's NCCL environment, leaves Ray out (docs/reference.md, Fabric
shapes),
runs the NCCL test (its rendezvous at the head's management address) and converges; the test
passes on every box over NET/IB on all four twins, compliance passes and a second run changes
nothing. A cable pulled out of a port the ring needs stops both its ends, each naming its port.

Times on the 2-core CI machine (three boxes, no lanes), with the NCCL test: the converging
deploy 16 s, the deploy that changes nothing 5 s, the module 106 s (an idle machine; 116 s and
25 s were seen without the test on a busy one).

It boots three bare boxes cabled as a ring and leaves them up (conftest.cabled).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.conftest import cabled, pyinfra, run_on
from tests.e2e.runs import output_of
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab

pytestmark = [pytest.mark.lab, pytest.mark.recabled]

INVENTORY = "tests/e2e/fabric_inventory.py"
PORT0 = ("enp1s0f0np0", "enP2p1s0f0np0")
PORT1 = ("enp1s0f1np1", "enP2p1s0f1np1")
# Cable i runs from spark-(i+1)'s port 0 to the next box's port 1, its twins on 192.168.(100 +
# 2i) and (101 + 2i); each box is .10, .11, .12 in the inventory's order (docs/reference.md, Fabric
# shapes).
CABLES = [("spark-1", "spark-2", 100), ("spark-2", "spark-3", 102), ("spark-3", "spark-1", 104)]
LAST_OCTET = {"spark-1": 10, "spark-2": 11, "spark-3": 12}


def address(box: str, third_octet: int) -> str:
    return f"192.168.{third_octet}.{LAST_OCTET[box]}"


@pytest.fixture(scope="module")
def ring(lab: simlab.Lab) -> tuple[simlab.Lab, str]:
    ring_lab = cabled(lab, "ring3", count=3)
    start = time.monotonic()
    result = pyinfra(INVENTORY, "deploy.py")
    print(f"ring3: the converging deploy took {time.monotonic() - start:.0f} s")
    assert changes(result) > 0
    return ring_lab, output_of(result)


def test_each_port_is_on_the_subnets_of_the_neighbour_it_is_cabled_to(ring) -> None:
    lab, _output = ring
    hosts = {host.name: host for host in lab.hosts}
    for from_box, to_box, first in CABLES:
        for twin, (port0, port1) in enumerate(zip(PORT0, PORT1, strict=True)):
            octet = first + twin
            mine = run_on(hosts[from_box], f"ip -4 -br address show {port0}")
            theirs = run_on(hosts[to_box], f"ip -4 -br address show {port1}")
            assert f"{address(from_box, octet)}/24" in mine, (from_box, port0, mine)
            assert f"{address(to_box, octet)}/24" in theirs, (to_box, port1, theirs)
            ping = f"ping -c 1 -W 2 -M do -s 8972 -I {port0} {address(to_box, octet)}"
            assert "1 received" in run_on(hosts[from_box], ping), (from_box, port0, to_box)


def test_nccl_environment_of_a_ring(ring) -> None:
    lab, _output = ring
    for host in lab.hosts:
        env = run_on(host, "cat /etc/spark/cluster.env")
        expected = {
            "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1,rocep1s0f0,roceP2p1s0f0",
            "NCCL_IB_MERGE_NICS": "0",  # each port reaches another neighbour
            "NCCL_NET_PLUGIN": "none",
            "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
            # No fabric subnet reaches every box: sockets on the management port.
            "NCCL_SOCKET_IFNAME": "enP7s7",
            "GLOO_SOCKET_IFNAME": "enP7s7",
            # ... and so the rendezvous: the head's management address, each box's own for vLLM.
            "MASTER_ADDR": lab.hosts[0].mgmt_ip,
            "VLLM_HOST_IP": host.mgmt_ip,
        }
        for key, value in expected.items():
            assert re.search(rf'^{key}="{value}"$', env, re.M), (host.name, key, env)
        assert "NCCL_IB_GID_INDEX" not in env


def test_ray_is_left_out_and_said_so(ring) -> None:
    lab, output = ring
    for host in lab.hosts:
        assert f"{host.name}: fabric_topology ring3: the fabric, NCCL's environment and the" in (
            output
        )
        state = run_on(host, "systemctl is-active spark-ray", check=False).strip()
        assert state == "inactive", (host.name, state)


def test_the_nccl_test_passes_on_every_box_over_all_four_twins(ring) -> None:
    lab, _output = ring
    twins = {"rocep1s0f1", "roceP2p1s0f1", "rocep1s0f0", "roceP2p1s0f0"}
    for host in lab.hosts:
        kept = json.loads(run_on(host, "sudo cat /var/lib/spark/nccl-test/verdict.json"))
        print(f"ring3, {host.name} (the lab's stand-in, not a Spark's numbers):")
        print(run_on(host, "sudo cat /var/lib/spark/nccl-test/run/report.txt"))
        assert kept["passed"], (host.name, kept["problems"])
        # every box judges every rank's log: the verdict is the cluster's
        assert [rank["host"] for rank in kept["ranks"]] == [box.name for box in lab.hosts]
        for rank in kept["ranks"]:
            assert set(rank["ib_devices"]) == twins, rank
            # A channel on each twin: to the next box over port 0, from the one before over 1.
            assert set(rank["channels"]) == {f"NET/IB/{i}" for i in range(4)}, rank


def test_compliance_passes_and_a_second_deploy_changes_nothing(ring) -> None:
    code, table, output = compliance(inventory=INVENTORY)
    left = not_passing(table)
    # Ray's and its firewall's checks skip on a ring: the deploy leaves them out.
    assert code == 0 and all(cell.startswith("SKIP a ring") for cell in left.values()), output
    assert ("spark-1", "Ray nodes all joined") in left, table
    assert table["NCCL test passed"].keys() == set(LAST_OCTET), table
    assert {box for row in table.values() for box in row} == set(LAST_OCTET)
    assert any("enp1s0f0np0" in check for check in table), table
    start = time.monotonic()
    again = pyinfra(INVENTORY, "deploy.py")
    print(f"ring3: the deploy that changes nothing took {time.monotonic() - start:.0f} s")
    assert changes(again) == 0, output_of(again)


def test_a_cable_pulled_stops_both_its_ends_naming_their_ports(ring) -> None:
    # Cable 2: spark-3's port 0 to spark-1's port 1. Both boxes come back from a reboot without
    # that port's twins or RDMA devices, as a Spark shows no ConnectX functions without a cable.
    spark_3, spark_1 = simlab.unplug("spark-3", 0)
    assert "rocep1s0f1" not in run_on(spark_1, "ls /sys/class/infiniband")
    assert "rocep1s0f0" not in run_on(spark_3, "ls /sys/class/infiniband")
    result = pyinfra(INVENTORY, "deploy.py", check=False)
    output = output_of(result)
    assert result.returncode == 1, output
    for box, port, twins in (("spark-3", 0, PORT0), ("spark-1", 1, PORT1)):
        assert (
            f"{box}: no cable on port {port} (or its ConnectX missing): {' and '.join(twins)} do"
            " not exist"
        ) in output, output
    assert "spark-2: no cable" not in output

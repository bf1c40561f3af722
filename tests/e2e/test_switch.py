"""Four boxes through a switch on both ports (fabric_topology "switch", fabric_switch_ports
[1, 0]): the lab puts each box's four twins into a switch, one L2 segment per twin of each port;
the inventory gives no lanes and no fabric addresses, so the deploy derives .10 to .13 on each
twin's subnet (port 1's twins on the first two, port 0's on the next two), writes the switch's
NCCL environment naming all four devices, joins the four boxes in one Ray cluster, runs the NCCL
test on all four over all four twins and converges; every box reaches every other on each twin
with full-size frames, compliance passes and a second run changes nothing.

Then port 0 alone, on a pair through the same switch (fabric_switch_ports [0]): spark-3 and
spark-4 powered off, spark-1 and spark-2 unplugged from the switch's port 1 segments and
reimaged; the deploy derives port 0's twins on 192.168.100.0/24 and 192.168.101.0/24, the
sockets go over port 0's first twin, the NCCL test passes over both port 0 devices, compliance
passes and a second run changes nothing.

Times on the 2-core machine, beside other labs (load average 5-6.5), in two runs of the module
alone: on both ports, the converging deploy 73 and 80 s (port 1 alone, earlier: 23-55 s with
the NCCL test) and the deploy that changes nothing 3 and 8 s; the pair on port 0: reimaging it
7 s, its converging deploy 42 and 46 s, the deploy that changes nothing 2 s, its part of the
module 71 and 74 s (its fixture 50 and 54 s, compliance and the second deploy 16-17 s); the
module 3 min 9 s and 3 min 32 s (two lab boots, Ray's four nodes joining, two compliance runs).

It boots four bare boxes through a switch on both ports and leaves them up (conftest.cabled),
spark-3 and spark-4 off at its end.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from operations import nccl, ray
from tests.conftest import cabled, pyinfra, run_on
from tests.e2e.runs import output_of, power_cut
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab

pytestmark = [pytest.mark.lab, pytest.mark.recabled]

INVENTORY = "tests/e2e/fabric_inventory.py"
BOXES = 4
PORTS = (1, 0)  # fabric_switch_ports: both ports in the switch
# One subnet per twin of each port for every box, .10 for the first and on, the first port's
# twins first (docs/reference.md, Fabric shapes; spark/topology.py links: a switch's port is one
# "cable").
SUBNETS = {
    "enp1s0f1np1": "192.168.100",
    "enP2p1s0f1np1": "192.168.101",
    "enp1s0f0np0": "192.168.102",
    "enP2p1s0f0np0": "192.168.103",
}
HCAS = ["rocep1s0f1", "roceP2p1s0f1", "rocep1s0f0", "roceP2p1s0f0"]  # the twins' devices
PAIR_INVENTORY = "tests/e2e/switch_port0_inventory.py"
PORT0_SUBNETS = {"enp1s0f0np0": "192.168.100", "enP2p1s0f0np0": "192.168.101"}


def reaches_every_other(hosts: list[simlab.Host], subnets: dict[str, str]) -> None:
    """Each box has its derived address on each twin and reaches every other box there with
    9000-byte frames (8972 bytes of ICMP payload, fragmenting forbidden)."""
    for host in hosts:
        for twin, subnet in subnets.items():
            own = f"{subnet}.{9 + host.index}/24"
            assert own in run_on(host, f"ip -4 -br address show {twin}"), (host.name, twin)
            others = [f"{subnet}.{9 + other.index}" for other in hosts if other != host]
            pings = "; ".join(
                f"ping -c 1 -W 2 -M do -s 8972 -I {twin} {peer} >/dev/null && echo {peer}"
                for peer in others
            )
            answered = run_on(host, pings, check=False).split()
            assert answered == others, (host.name, twin, answered)


def switch_environment(host: simlab.Host, hcas: list[str], socket_twin: str) -> None:
    """The box's cluster environment file names ``hcas`` and a switch's routing, its sockets
    on ``socket_twin`` whose subnet is the first (192.168.100.0/24), the head spark-1 (.10),
    and leaves NCCL_IB_MERGE_NICS at NCCL's default."""
    env = run_on(host, "cat /etc/spark/cluster.env")
    expected = {
        "NCCL_IB_HCA": ",".join(hcas),
        "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
        "NCCL_SOCKET_IFNAME": socket_twin,
        "VLLM_HOST_IP": f"192.168.100.{9 + host.index}",
        "MASTER_ADDR": "192.168.100.10",
    }
    for key, value in expected.items():
        assert re.search(rf'^{key}="{value}"$', env, re.M), (host.name, key, env)
    assert "NCCL_IB_MERGE_NICS" not in env, (host.name, env)


def kept_verdict_uses(host: simlab.Host, hcas: list[str], ranks: int) -> None:
    """The NCCL test's verdict kept on the box passed, every rank on NET/IB over ``hcas``, one
    channel per device to the next rank and one from the one before (the stand-in opens a
    channel per device whose subnet the peer shares, as NCCL's ring does)."""
    kept = json.loads(run_on(host, f"sudo cat {nccl.VERDICT}"))
    assert kept["passed"], (host.name, kept["problems"])
    assert len(kept["ranks"]) == ranks, kept
    for rank, me in enumerate(kept["ranks"]):
        assert (me["rank"], me["network"], sorted(me["ib_devices"])) == (
            rank, "IB", sorted(hcas)
        ), (host.name, me)  # fmt: skip
        assert me["channels"] == {f"NET/IB/{index}": 2 for index in range(len(hcas))}, me


@pytest.fixture(scope="module")
def switched(lab: simlab.Lab) -> simlab.Lab:
    switch_lab = cabled(lab, "switch", count=BOXES, switch_ports=PORTS)
    start = time.monotonic()
    result = pyinfra(INVENTORY, "deploy.py")
    print(f"switch: the converging deploy took {time.monotonic() - start:.0f} s")
    assert changes(result) > 0
    return switch_lab


def test_every_box_reaches_every_other_on_each_twin_of_both_ports(switched: simlab.Lab) -> None:
    reaches_every_other(switched.hosts, SUBNETS)


def test_nccl_environment_of_a_switch_on_both_ports(switched: simlab.Lab) -> None:
    # All four devices, port 1's first (NCCL_IB_HCA: every twin used); subnet-aware routing,
    # which NVIDIA's cluster script passes on every run, switch included (spark_cluster_setup.py
    # run_nccl_test); merging left at NCCL's default: behind a switch every twin reaches every
    # peer, so a merged NIC cannot send a channel towards the wrong box (a ring's problem,
    # spark/topology.py RING_VARIABLES); the sockets on the first port's first twin.
    for host in switched.hosts:
        switch_environment(host, HCAS, "enp1s0f1np1")


def test_the_nccl_test_passed_over_all_four_twins_of_every_box(switched: simlab.Lab) -> None:
    for host in switched.hosts:  # every box keeps the verdict of all four ranks
        kept_verdict_uses(host, HCAS, BOXES)


def test_the_four_boxes_are_one_ray_cluster(switched: simlab.Lab) -> None:
    head = switched.hosts[0]
    # The workers join as they come (each retries every 10 s): it waits up to two minutes.
    said = run_on(head, f"sudo {ray.NODES_COMMAND} {BOXES} 120 2>&1").strip()
    assert said.splitlines()[-1] == f"{BOXES} of {BOXES} Ray nodes are alive", said


def test_compliance_passes_and_a_second_deploy_changes_nothing(switched: simlab.Lab) -> None:
    code, table, output = compliance(inventory=INVENTORY)
    assert code == 0 and not not_passing(table), output
    assert {box for row in table.values() for box in row} == {h.name for h in switched.hosts}
    assert set(table["NCCL test passed"].values()) == {"PASS"}, table  # all four ranks
    start = time.monotonic()
    again = pyinfra(INVENTORY, "deploy.py")
    print(f"switch: the deploy that changes nothing took {time.monotonic() - start:.0f} s")
    assert changes(again) == 0, output_of(again)


@pytest.fixture(scope="module")
def port0_pair(switched: simlab.Lab) -> list[simlab.Host]:
    """spark-1 and spark-2 with port 0 alone in the switch, bare, deployed as a pair; spark-3
    and spark-4 off (the next module's reimage_all boots the session's boxes again)."""
    pair, rest = switched.hosts[:2], switched.hosts[2:]
    for host in rest:
        power_cut(host)
    lab = simlab.Lab.load()
    for host in pair:
        simlab.unplug_port(lab, lab.host(host.name), 1)  # its port 1 out of the switch
    lab.save()
    start = time.monotonic()
    for host in pair:
        simlab.reimage(host.name)
    simlab.write_ssh_files(simlab.Lab.load())
    for host in pair:
        simlab.wait_ready(host, time.monotonic() + simlab.BOOT_TIMEOUT)
    print(f"switch, port 0: reimaging the pair took {time.monotonic() - start:.0f} s")
    start = time.monotonic()
    result = pyinfra(PAIR_INVENTORY, "deploy.py")
    print(f"switch, port 0: the converging deploy took {time.monotonic() - start:.0f} s")
    assert changes(result) > 0
    return pair


def test_a_pair_on_port_0_alone_reaches_through_the_switch(port0_pair) -> None:
    for host in port0_pair:
        links = run_on(host, "ls /sys/class/net").split()
        assert "enp1s0f1np1" not in links and "enP2p1s0f1np1" not in links, links
    reaches_every_other(port0_pair, PORT0_SUBNETS)


def test_the_pairs_nccl_runs_over_port_0_alone(port0_pair) -> None:
    # Port 0's devices alone; the sockets, Ray's and vLLM's address on its first twin (the
    # first port's first twin, as on both ports).
    for host in port0_pair:
        switch_environment(host, ["rocep1s0f0", "roceP2p1s0f0"], "enp1s0f0np0")
        kept_verdict_uses(host, ["rocep1s0f0", "roceP2p1s0f0"], len(port0_pair))


def test_the_pairs_compliance_passes_and_a_second_deploy_changes_nothing(port0_pair) -> None:
    code, table, output = compliance(inventory=PAIR_INVENTORY)
    assert code == 0 and not not_passing(table), output
    assert {box for row in table.values() for box in row} == {h.name for h in port0_pair}
    assert any("enp1s0f0np0" in check for check in table), table  # port 0's twins checked
    start = time.monotonic()
    again = pyinfra(PAIR_INVENTORY, "deploy.py")
    print(f"switch, port 0: the deploy that changes nothing took {time.monotonic() - start:.0f} s")
    assert changes(again) == 0, output_of(again)

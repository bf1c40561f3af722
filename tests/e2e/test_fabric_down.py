"""A fabric twin cut, or too small an MTU on the way: the preflight names the box, the twin and
the peer; mended, the next deploy passes. A box whose RoCE v2 GID entry is not at index 3 is
no fault: NCCL selects it, and compliance says where it is. A twin linking at 100 Gb/s stops its
box naming the twin and the rate; a device with no RoCE v2 entry of its twin's address stops its
box with the table as found (the lab's stand-ins: simlab.set_hardware).

The lab's twins are veth pairs, whose carrier NetworkManager on the far box restores whenever it
activates its profile; so the cut is a filter dropping every frame that arrives on the twin, on
both boxes: the link stays up and nothing crosses it (a pulled cable would also drop the link,
which the preflight reports as "has no link", see tests/unit/test_preflight.py).

Tests in this module run in order on one deployed lab; each mends what it broke.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import INVENTORY, output_of
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab

pytestmark = pytest.mark.lab

(A, _), (B, _) = simlab.FABRIC_TWINS
CUT_TABLE = "simlab-cut"  # a netdev table of the test's own, in each box's network namespace


def nft(host: simlab.Host, *args: str) -> None:
    simlab.in_ns(host.netns, "nft", *args)


@pytest.fixture(scope="module")
def deployed(deployed_lab: Deployed) -> simlab.Lab:
    return deployed_lab.lab


@pytest.fixture
def twin_b_cut(deployed: simlab.Lab) -> Iterator[simlab.Lab]:
    for host in deployed.hosts:
        nft(host, "add", "table", "netdev", CUT_TABLE)
        nft(host, "add", "chain", "netdev", CUT_TABLE, "cut",
            f"{{ type filter hook ingress device {B} priority -500; policy drop; }}")  # fmt: skip
    try:
        yield deployed
    finally:
        for host in deployed.hosts:
            nft(host, "delete", "table", "netdev", CUT_TABLE)


def test_a_cut_twin_is_named_with_box_and_peer(twin_b_cut: simlab.Lab) -> None:
    result = pyinfra(INVENTORY, "deploy.py", check=False)
    output = output_of(result)
    assert result.returncode == 1, output
    for me, peer, address in (("spark-1", "spark-2", "192.168.101.11"),
                              ("spark-2", "spark-1", "192.168.101.10")):  # fmt: skip
        named = (
            f"{me}: fabric twin {B} gets no answer from {peer} ({address} on its {B}) to"
            f" 9000-byte unfragmented pings; {B} has link but nothing answers"
        )
        assert named in output, output
    assert f"fabric twin {A} gets no answer" not in output  # the other twin is fine


def test_an_mtu_below_9000_on_the_peer_is_named(deployed: simlab.Lab) -> None:
    spark_2 = deployed.hosts[1]
    run_on(spark_2, f"sudo nmcli connection modify fabric-{B} 802-3-ethernet.mtu 1500"
                    f" && sudo nmcli connection up fabric-{B}")  # fmt: skip
    # Only spark-1: the deploy on spark-2 would put its MTU back first.
    result = pyinfra(INVENTORY, "deploy.py", "--limit", "spark-1", check=False)
    output = output_of(result)
    assert result.returncode == 1, output
    assert re.search(
        rf"spark-1: fabric twin {B} gets no answer from spark-2 .* to 9000-byte unfragmented"
        rf" pings; smaller pings do get through: a hop below MTU 9000",
        output,
    ), output


def test_mended_the_deploy_passes_and_then_changes_nothing(deployed: simlab.Lab) -> None:
    pyinfra(INVENTORY, "deploy.py")  # puts spark-2's MTU back; the cut is gone
    assert changes(pyinfra(INVENTORY, "deploy.py")) == 0
    ping = run_on(deployed.hosts[0], f"ping -c 1 -W 2 -M do -s 8972 -I {B} 192.168.101.11")
    assert "1 received" in ping


def test_a_gid_entry_at_index_4_on_one_box_is_used_and_said(deployed: simlab.Lab) -> None:
    # The field's layout (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks PR#26): an unrelated RoCE
    # v2 entry at 3, the IPv4 one at 4, on one box of two.
    spark_2 = deployed.hosts[1]
    simlab.set_hardware(spark_2, ipv4_roce_v2_index=4)
    try:
        result = pyinfra(INVENTORY, "deploy.py")
        assert changes(result) == 0, output_of(result)  # nothing NCCL reads names an index
        code, table, output = compliance()
        assert code == 0 and not_passing(table) == {}, output
        for _twin, hca in simlab.FABRIC_TWINS:
            row = table[f"RoCE v2 IPv4 GID {hca}"]
            assert row == {"spark-1": "PASS", "spark-2": "PASS at 4, not 3: NCCL selects it"}, row
    finally:
        simlab.set_hardware(spark_2, ipv4_roce_v2_index=3)


def test_a_twin_at_100g_stops_its_box_naming_the_twin_and_the_rate(deployed: simlab.Lab) -> None:
    # The field's 100G twin: a switch port auto-negotiating, a degraded ConnectX start
    # (dgx-spark-playbooks PR#108). Every other twin at a Spark's 200000 Mb/s, the lab's.
    spark_2 = deployed.hosts[1]
    simlab.set_hardware(spark_2, link_speeds={B: 100000})
    try:
        assert run_on(spark_2, f"cat /sys/class/net/{B}/speed").strip() == "100000"
        result = pyinfra(INVENTORY, "deploy.py", check=False)
        output = output_of(result)
        assert result.returncode == 1, output
        assert (
            f"spark-2: fabric twin {B} links at 100000 Mb/s, below the 200000 expected; usual"
            " causes: a switch port with auto-negotiation on"
        ) in output, output
        assert "fabric twin enp1s0f1np1 links at" not in output
        assert "spark-1: fabric twin" not in output
    finally:
        simlab.set_hardware(spark_2, link_speeds={})
    assert run_on(spark_2, f"cat /sys/class/net/{B}/speed").strip() == "200000"  # a Spark's


def test_no_roce_v2_entry_of_a_twins_address_stops_its_box_with_the_table(
    deployed: simlab.Lab,
) -> None:
    spark_2 = deployed.hosts[1]
    hca = simlab.FABRIC_TWINS[1][1]
    simlab.set_hardware(spark_2, no_ipv4_roce_v2=[hca])
    try:
        result = pyinfra(INVENTORY, "deploy.py", check=False)
        output = output_of(result)
        assert result.returncode == 1, output
        assert f"spark-2: {hca} port 1: 192.168.101.11/24 has no RoCE v2 entry." in output, output
        # The table as found: the address's RoCE v1 entry at 2, nothing of RoCE v2 for it.
        ipv4 = "0000:0000:0000:0000:0000:ffff:c0a8:650b"
        # pyinfra prints the failed command's lines under the box's name ("[spark-2] ").
        assert re.search(rf"^\s*\[spark-2\]\s+2\s+IB/RoCE v1\s+{B}\s+{ipv4}$", output, re.M), output
        assert not re.search(rf"RoCE v2\s+{B}\s+{ipv4}", output), output
        assert f"spark-1: {hca} port 1" not in output
    finally:
        simlab.set_hardware(spark_2, no_ipv4_roce_v2=[])

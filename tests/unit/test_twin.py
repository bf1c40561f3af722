"""spark/twin.py: where a twin's rate, MTU and GID table live and how each is judged, the one
reading the deploy, compliance and the collector share.

The files and their texts are the kernel's (Documentation/ABI/stable/sysfs-class-net: speed in
Mb/s, -1 or an error without a link; mtu in bytes; sysfs-class-infiniband: gids/N as the IPv6
form of the GID, gid_attrs/types/N "RoCE v2" or "IB/RoCE v1", gid_attrs/ndevs/N the netdev). The
GID entries below are the lab's spark-2 with 192.168.101.12/24 on enP2p1s0f1np1
(tests/unit/captured/lab-gid-at-3.txt, as roce.GidTables reads it), written literally here.
"""

from __future__ import annotations

import pytest

from spark import twin

LINK_LOCAL = "fe80:0000:0000:0000:80ef:ffff:fe93:c3fa"
MAPPED_101_12 = "0000:0000:0000:0000:0000:ffff:c0a8:650c"  # 192.168.101.12
MAPPED_101_99 = "0000:0000:0000:0000:0000:ffff:c0a8:6563"  # 192.168.101.99
IFNAME = "enP2p1s0f1np1"


def entry(index: int, kind: str, gid: str, ndev: str = IFNAME) -> dict[str, object]:
    return {"port": 1, "index": index, "type": kind, "ndev": ndev, "gid": gid}


TABLE = [
    entry(0, "IB/RoCE v1", LINK_LOCAL),
    entry(1, "RoCE v2", LINK_LOCAL),
    entry(2, "IB/RoCE v1", MAPPED_101_12),
    entry(3, "RoCE v2", MAPPED_101_12),
]


def test_the_files_are_the_kernels() -> None:
    assert twin.rate_file("enp1s0f1np1") == "/sys/class/net/enp1s0f1np1/speed"
    assert twin.mtu_file("enp1s0f1np1") == "/sys/class/net/enp1s0f1np1/mtu"
    assert twin.port_dir("rocep1s0f1") == "/sys/class/infiniband/rocep1s0f1/ports/1"
    # The collector reads them under another root in its tests.
    assert twin.mtu_file("enp1s0f1np1", "/tmp/sys") == "/tmp/sys/class/net/enp1s0f1np1/mtu"


@pytest.mark.parametrize(
    ("text", "mbps"),
    [("200000\n", 200000), ("100000", 100000), ("-1\n", -1), ("", -1), (None, -1), ("x", -1)],
)
def test_a_rate_reads_as_mbps_or_none(text: str | None, mbps: int) -> None:
    assert twin.rate(text) == mbps


@pytest.mark.parametrize(("text", "mtu"), [("9000\n", 9000), ("1500", 1500), (None, 0), ("", 0)])
def test_an_mtu_reads_as_bytes_or_none(text: str | None, mtu: int) -> None:
    assert twin.mtu(text) == mtu


@pytest.mark.parametrize(
    ("text", "down"),
    [
        # A veth's flags read on a test machine (`ip link add v0 type veth peer name v1` in a
        # network namespace): 0x1002 as created (IFF_MULTICAST|IFF_BROADCAST), 0x1003 once
        # `ip link set v0 up` (IFF_UP added), and still 0x1003 with its peer set down.
        ("0x1002\n", True),
        ("0x1003\n", False),
        (None, False),  # no such interface: its MTU says so
        ("", False),
    ],
)
def test_a_twin_is_set_down_where_its_flags_lack_iff_up(text: str | None, down: bool) -> None:
    assert twin.set_down(text) is down
    assert twin.flags_file("enp1s0f1np1") == "/sys/class/net/enp1s0f1np1/flags"


def test_below_the_rate_is_judged_where_the_twin_reports_one() -> None:
    assert twin.rate_below(100000, 200000)
    assert not twin.rate_below(200000, 200000)
    assert not twin.rate_below(-1, 200000)  # no link: the carrier's figure


def test_the_inventorys_choice_is_the_severity() -> None:
    assert twin.rate_severity("refuse") == "critical"
    assert twin.rate_severity("warn") == "warning"


def test_ipv4_gid_is_the_ipv4_mapped_address() -> None:
    assert twin.ipv4_gid("192.168.100.10/24") == "0000:0000:0000:0000:0000:ffff:c0a8:640a"
    assert twin.ipv4_gid("192.168.101.12") == MAPPED_101_12


def test_the_twins_ipv4_roce_v2_entries() -> None:
    assert twin.roce_v2_ipv4(TABLE, IFNAME) == {3: "192.168.101.12"}
    assert twin.roce_v2_ipv4(TABLE, "enp1s0f1np1") == {}  # another netdev's
    moved = [*TABLE[:3], entry(4, "RoCE v2", MAPPED_101_12)]
    assert twin.own_roce_v2_index(moved, IFNAME, "192.168.101.12/24") == 4
    second = [*TABLE, entry(5, "RoCE v2", MAPPED_101_99)]
    assert twin.roce_v2_ipv4(second, IFNAME) == {3: "192.168.101.12", 5: "192.168.101.99"}
    v1_only = TABLE[:3]
    assert twin.own_roce_v2_index(v1_only, IFNAME, "192.168.101.12") is None

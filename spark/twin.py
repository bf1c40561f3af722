"""One reading per figure of a fabric twin: the file the kernel keeps its rate, MTU and RoCE v2
IPv4 GID entry in, how each is read, and how it is judged against the plan.

The deploy (operations/preflight.py, operations/nmcli.py, operations/roce.py), compliance
(tests/compliance/test_fabric.py) and the box's metrics collector (files/spark_metrics.py) all
read a twin through these definitions. The collector runs on the box with the standard library
alone: the deploy installs this module beside it as spark_twin.py (operations/metrics.py), so
this module imports nothing but the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from ipaddress import IPv4Interface, IPv6Address

SYS = "/sys"
# Each interface's attributes under SYS (the kernel's Documentation/ABI/stable/sysfs-class-net),
# and each RDMA device's (Documentation/ABI/stable/sysfs-class-infiniband).
NET = "class/net"
INFINIBAND = "class/infiniband"
ROCE_V2 = "RoCE v2"  # gid_attrs/types/N of a RoCE v2 entry (sysfs-class-infiniband)
# A twin's flags (sysfs-class-net: flags, the bits of include/uapi/linux/if.h's
# net_device_flags in hex): IFF_UP clear is a twin set down (`ip link set dev IF down`),
# whatever its cable; its carrier then reads nothing (the kernel refuses the read).
IFF_UP = 0x1
NO_RATE = -1  # a twin with no link: the file fails, or reads -1 (SPEED_UNKNOWN of an mlx5 link)
NO_MTU = 0  # no such interface


def rate_file(ifname: str, sys_fs: str = SYS) -> str:
    """Where the kernel reports a twin's link rate in Mb/s (sysfs-class-net: speed)."""
    return f"{sys_fs}/{NET}/{ifname}/speed"


def mtu_file(ifname: str, sys_fs: str = SYS) -> str:
    """Where the kernel reports a twin's MTU in bytes (sysfs-class-net: mtu): the live link's,
    whatever NetworkManager's profile says."""
    return f"{sys_fs}/{NET}/{ifname}/mtu"


def flags_file(ifname: str, sys_fs: str = SYS) -> str:
    """Where the kernel reports a twin's interface flags (sysfs-class-net: flags)."""
    return f"{sys_fs}/{NET}/{ifname}/flags"


def set_down(text: str | None) -> bool:
    """Whether a flags file's text says the twin is set down (IFF_UP clear); False where it has
    none to say (no such interface: its MTU reads NO_MTU)."""
    value = (text or "").strip()
    try:
        return not int(value, 16) & IFF_UP
    except ValueError:
        return False


def port_dir(hca: str, sys_fs: str = SYS) -> str:
    """A twin's RDMA device port, whose gids/N, gid_attrs/types/N and gid_attrs/ndevs/N hold its
    GID table (sysfs-class-infiniband; a ConnectX twin's device has one port)."""
    return f"{sys_fs}/{INFINIBAND}/{hca}/ports/1"


def rate(text: str | None) -> int:
    """A rate file's text as Mb/s; NO_RATE where it has none (unreadable, empty, -1)."""
    value = (text or "").strip()
    return int(value) if value.lstrip("-").isdigit() and int(value) >= 0 else NO_RATE


def mtu(text: str | None) -> int:
    """An MTU file's text as bytes; NO_MTU where there is none."""
    value = (text or "").strip()
    return int(value) if value.isdigit() else NO_MTU


def rate_below(found: int, expected_mbps: int) -> bool:
    """A twin that reports a rate, below the plan's (one that reports none has no link: that is
    the carrier's figure, not the rate's)."""
    return 0 <= found < expected_mbps


def rate_severity(low: str) -> str:
    """How a twin below its rate is judged: "critical" where the inventory refuses it
    (fabric_link_speed_low = "refuse"), "warning" where it accepts it ("warn")."""
    return "warning" if low == "warn" else "critical"


def ipv4_gid(address: str) -> str:
    """The GID of an IPv4 address (with or without its prefix): its IPv4-mapped IPv6 address,
    as sysfs prints it (gids/N)."""
    return IPv6Address(f"::ffff:{IPv4Interface(address).ip}").exploded


def roce_v2_ipv4(entries: Iterable[Mapping[str, object]], ifname: str) -> dict[int, str]:
    """The IPv4 RoCE v2 entries of a twin among a device port's GID entries (each with its
    "index", "type", "ndev" and "gid" as sysfs gives them): {index: IPv4 address}. NCCL takes
    the one IPv4 RoCE v2 entry of each device (NVIDIA/nccl src/transport/net_ib/connect.cc,
    ncclIbGetGidIndex), wherever it is."""
    found = {}
    for entry in entries:
        if (entry["type"], entry["ndev"]) != (ROCE_V2, ifname):
            continue
        mapped = IPv6Address(str(entry["gid"])).ipv4_mapped
        if mapped is not None:
            found[int(str(entry["index"]))] = str(mapped)
    return dict(sorted(found.items()))


def own_roce_v2_index(
    entries: Iterable[Mapping[str, object]], ifname: str, address: str
) -> int | None:
    """The index of the twin's RoCE v2 entry of its own address, or None."""
    ip = str(IPv4Interface(address).ip)
    return next(
        (index for index, found in roce_v2_ipv4(entries, ifname).items() if found == ip), None
    )

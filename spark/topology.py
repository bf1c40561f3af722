"""The fabric shapes owners cable, and the links and addresses each one gives every box."""

from __future__ import annotations

from collections import defaultdict
from ipaddress import IPv4Interface, IPv4Network
from typing import NamedTuple

# A Spark's two QSFP ports, each seen as two twins on their own PCIe x4 link and RDMA device;
# port 0 is the one next to the RJ-45 port (NVIDIA/dgx-spark-playbooks connect-three-sparks,
# "Physical Hardware Connection"; eugr/spark-vllm-docker docs/NETWORKING.md, "ConnectX quirks").
PORT_TWINS = {
    0: ("enp1s0f0np0", "enP2p1s0f0np0"),
    1: ("enp1s0f1np1", "enP2p1s0f1np1"),
}

# Box counts: a pair is two boxes; NVIDIA's ring guide joins three (connect-three-sparks); a
# switch takes 2 to 8 here (NVIDIA's multi-sparks-through-switch; its cluster helper does 2-4,
# eugr's NETWORKING.md points to a 6-8 box switched cluster).
BOXES = {"pair": (2, 2), "pair-dual": (2, 2), "ring3": (3, 3), "switch": (2, 8)}

# Derived addresses: one /24 per twin per cable, counted up from 192.168.100.0, and host .10
# for the first box, .11 for the next (NVIDIA's two-Spark plan, 192.168.100.0/24 and
# 192.168.101.0/24 with .10 and .11; spark_cluster_setup.py LAST_OCTET_START = 10). Rings give
# each twin of each cable its own subnet, as eugr's NETWORKING.md does ("two subnets per
# cable, one for each PCIe rail"; NVIDIA's ring guide puts both twins of a cable in one).
FIRST_SUBNET = IPv4Network("192.168.100.0/24")
FIRST_HOST = 10


class Link(NamedTuple):
    """One twin of one box on one cable (a switch counts as one cable per port)."""

    ifname: str
    cable: int  # which cable (or switch port group) the twin is on
    twin: int  # 0 or 1: which PCIe rail of the port


def ports(topology: str, switch_ports: tuple[int, ...] = (1,)) -> tuple[int, ...]:
    """The QSFP ports each box of a topology uses, first the one whose first twin carries the
    sockets. A pair uses port 1, as the field's two-box guides cable it (eugr's NETWORKING.md,
    NVIDIA's connect-two-sparks); pair-dual and rings use both."""
    if topology == "pair":
        return (1,)
    if topology in ("pair-dual", "ring3"):
        return (1, 0)
    return switch_ports


def links(topology: str, index: int, count: int, switch_ports: tuple[int, ...] = (1,)):
    """The links of the box at ``index`` (0 first) among ``count`` boxes, in ports() order.

    A ring cables port 0 of each box to port 1 of the next, the last back to the first
    (connect-three-sparks, Step 2); cable i starts at box i's port 0. Elsewhere every box's
    port p is on the same cable (a pair) or the same switch segment."""
    result = []
    for position, port in enumerate(ports(topology, switch_ports)):
        # A ring's cable i starts at box i's port 0 and ends at box i+1's port 1; elsewhere
        # every box's first port is on the first cable (or segment), its second on the second.
        ring_cable = index if port == 0 else (index - 1) % count
        cable = ring_cable if topology == "ring3" else position
        for twin, ifname in enumerate(PORT_TWINS[port]):
            result.append(Link(ifname, cable, twin))
    return tuple(result)


def subnet(cable: int, twin: int) -> IPv4Network:
    """The derived /24 of one twin of one cable: two per cable, counted up (a pair's port 1
    keeps NVIDIA's 192.168.100.0/24 and 192.168.101.0/24)."""
    return IPv4Network((int(FIRST_SUBNET.network_address) + (2 * cable + twin) * 256, 24))


def derived(topology: str, index: int, count: int, switch_ports=(1,)) -> dict[str, str]:
    """{ifname: "A.B.C.D/24"} for the box at ``index`` when the inventory gives none."""
    return {
        link.ifname: str(
            IPv4Interface((int(subnet(link.cable, link.twin)[FIRST_HOST + index]), 24))
        )
        for link in links(topology, index, count, switch_ports)
    }


def problems(topology: str, boxes: list[tuple[str, dict[str, IPv4Interface]]], switch_ports=(1,)):
    """What is wrong with the boxes' addresses for the topology, one line each, naming the box
    and the twin: missing or extra twins, and twins on one cable (or switch segment) that are
    not on one subnet. (Two cables on one subnet always meet on some box, whose own check of
    its twins, config._twin_problems, refuses it.)"""
    lines = []
    segments: dict[tuple[int, int], list[tuple[str, str, IPv4Network]]] = defaultdict(list)
    for index, (name, addresses) in enumerate(boxes):
        wanted = links(topology, index, len(boxes), switch_ports)
        names = [link.ifname for link in wanted]
        missing = [ifname for ifname in names if ifname not in addresses]
        extra = [ifname for ifname in addresses if ifname not in names]
        if missing or extra:
            lines.append(
                f"{name}: fabric_addresses: {topology} uses {', '.join(names)} on this box"
                f" (ports {', '.join(map(str, ports(topology, switch_ports)))});"
                + (f" add {', '.join(missing)}" if missing else "")
                + (";" if missing and extra else "")
                + (f" remove {', '.join(extra)}" if extra else "")
                + " (or give none: they are derived from the boxes' order)"
            )
            continue
        for link in wanted:
            segments[link.cable, link.twin].append(
                (name, link.ifname, addresses[link.ifname].network)
            )
    for ends in segments.values():
        if len({network for *_, network in ends}) > 1:
            listing = ", ".join(f"{name} {ifname} {network}" for name, ifname, network in ends)
            lines.append(
                f"{', '.join(dict.fromkeys(name for name, *_ in ends))}: fabric_addresses:"
                f" twins joined by one {'cable' if topology != 'switch' else 'switch'} are on"
                f" different subnets ({listing}); put both ends on one subnet"
            )
    return lines

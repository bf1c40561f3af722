"""The fabric shapes owners cable, and the links and addresses each one gives every box."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from ipaddress import IPv4Interface, IPv4Network
from typing import NamedTuple

# A Spark's two QSFP ports, each seen as two twins on their own PCIe x4 link and RDMA device;
# port 0 is the one next to the RJ-45 port (NVIDIA/dgx-spark-playbooks connect-three-sparks,
# "Physical Hardware Connection"; eugr/spark-vllm-docker docs/NETWORKING.md, "ConnectX quirks").
PORT_TWINS = {
    0: ("enp1s0f0np0", "enP2p1s0f0np0"),
    1: ("enp1s0f1np1", "enP2p1s0f1np1"),
}

# Jumbo frames on the fabric (seed 001); NVIDIA's guide leaves 1500, which measured 18.9-21 GB/s
# of NCCL against 23.74 GB/s at 9000 (dgx-spark-playbooks#25). Below it, an owner says why
# (spark/inventory/fabric.py).
FABRIC_MTU = 9000

# Derived addresses: one /24 per twin per cable, counted up from 192.168.100.0, and host .10
# for the first box, .11 for the next (NVIDIA's two-Spark plan, 192.168.100.0/24 and
# 192.168.101.0/24 with .10 and .11; spark_cluster_setup.py LAST_OCTET_START = 10). Rings give
# each twin of each cable its own subnet, as eugr's NETWORKING.md does ("two subnets per
# cable, one for each PCIe rail"; NVIDIA's ring guide puts both twins of a cable in one).
FIRST_SUBNET = IPv4Network("192.168.100.0/24")
FIRST_HOST = 10

# The NCCL test's pass mark per topology: all_gather bus bandwidth in GB/s (NVIDIA's
# MIN_NCCL_TEST_BW = 21.875, "175 Gbps", and MIN_NCCL_TEST_BW_RING = 10, "80 Gbps":
# dgx-spark-playbooks multi-sparks-through-switch spark_cluster_setup.py, run_nccl_test, which
# judges all_gather_perf's average bus bandwidth at 16 GiB). The field measured 23.74 GB/s at
# MTU 9000 and 18.9-21 at 1500 (dgx-spark-playbooks#25, PR#103).
NCCL_PASS_MARK_GBS, NCCL_PASS_MARK_RING_GBS = 21.875, 10.0
# What NCCL is told per shape, beside NCCL_IB_HCA (every twin used) and the sockets:
# variable -> (value, its source), the source written beside it in the environment file.
PAIR_MERGE = (
    "1",
    "both twins as one NIC: a pair went from ~98 to ~161 Gb/s of nccl-tests busbw (tonyd2wild/"
    "DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark PR#35)",
)
SUBNET_ROUTING = (
    "1",
    "each peer reached by the twin on its subnet (NVIDIA/dgx-spark-playbooks multi-sparks-"
    "through-switch spark_cluster_setup.py, run_nccl_test; NCCL 2.30 or NVIDIA's ring fork)",
)
# Every twin of both cables reaches the one peer, so merging cannot send a channel to the
# wrong box (the ring's problem below): PR#35's setting, not measured on two cables.
# eugr's NETWORKING.md: a second cable gives "no noticeable advantage in bandwidth".
DUAL_MERGE = (
    "1",
    "all four twins reach the one peer: the pair's merge (tonyd2wild PR#35), not measured on"
    " two cables",
)
# Each port reaches a different neighbour: no merging, NCCL's own IB transport without an
# external plugin (spark_cluster_setup.py run_nccl_test adds both for rings; eugr's
# NETWORKING.md, 3-node mesh, passes the same three).
RING_VARIABLES = {
    "NCCL_IB_MERGE_NICS": (
        "0",
        "each port reaches another neighbour: no merged NIC (spark_cluster_setup.py"
        " run_nccl_test, ring; eugr/spark-vllm-docker docs/NETWORKING.md, 3-node mesh)",
    ),
    "NCCL_NET_PLUGIN": (
        "none",
        "NCCL's own IB transport, no external net plugin (spark_cluster_setup.py"
        " run_nccl_test, ring; eugr NETWORKING.md, 3-node mesh)",
    ),
    "NCCL_IB_SUBNET_AWARE_ROUTING": SUBNET_ROUTING,
}
# A switch: one L2 segment per twin; NVIDIA's cluster script passes subnet-aware routing on
# every run, switch included, and leaves merging at NCCL's default.


@dataclass(frozen=True)
class Shape:
    """A fabric shape as a record: everything the inventory's checks, the planner and the
    deploy need to know of it, so that no code compares a shape's name."""

    name: str
    # The fewest and the most boxes it joins: a pair is two boxes; NVIDIA's ring guide joins
    # three (connect-three-sparks); a switch takes 2 to 8 here (NVIDIA's
    # multi-sparks-through-switch; its cluster helper does 2-4, eugr's NETWORKING.md points to a
    # 6-8 box switched cluster). None: no most.
    boxes: tuple[int, int | None]
    ports: tuple[int, ...] | None  # the QSFP ports every box uses; None: fabric_switch_ports
    # Each port reaches another neighbour (a ring): no fabric subnet reaches every box, so the
    # sockets, the rendezvous (MASTER_ADDR) and VLLM_HOST_IP go over the management network.
    neighbours_only: bool
    link_speeds_mbps: tuple[int, ...]  # the rates a twin may link at
    nccl_pass_mark_gbs: float
    nccl_variables: dict[str, tuple[str, str]] = field(default_factory=dict)  # value, source
    joined_by: str = "cable"  # what joins the twins of one segment, in messages
    # The boxes are not a cluster: each is its own server, deployed as an inventory of one box
    # would be (no fabric, no cluster environment, no NCCL test, no Ray), several in one run.
    independent: bool = False

    @property
    def one_address_for_all(self) -> bool:
        """Every box reaches every other at its first twin's address: Ray's head, vLLM's
        --master-addr and the cluster firewall's subnets need that (not a ring)."""
        return not self.neighbours_only


# A twin links at 200 Gb/s, as a Spark's ConnectX-7 reports each (ibstat "Rate: 200" on every
# twin: geerlingguy/sbc-reviews#92); 100 Gb/s only behind a switch that runs its ports so.
DIRECT_RATE = (200000,)
SHAPES = {
    shape.name: shape
    for shape in (
        Shape(
            name="pair",
            boxes=(2, 2),
            ports=(1,),
            neighbours_only=False,
            link_speeds_mbps=DIRECT_RATE,
            nccl_pass_mark_gbs=NCCL_PASS_MARK_GBS,
            nccl_variables={"NCCL_IB_MERGE_NICS": PAIR_MERGE},
        ),
        Shape(
            name="pair-dual",
            boxes=(2, 2),
            ports=(1, 0),
            neighbours_only=False,
            link_speeds_mbps=DIRECT_RATE,
            nccl_pass_mark_gbs=NCCL_PASS_MARK_GBS,
            nccl_variables={"NCCL_IB_MERGE_NICS": DUAL_MERGE},
        ),
        Shape(
            name="ring3",
            boxes=(3, 3),
            ports=(1, 0),
            neighbours_only=True,
            link_speeds_mbps=DIRECT_RATE,
            nccl_pass_mark_gbs=NCCL_PASS_MARK_RING_GBS,
            nccl_variables=RING_VARIABLES,
        ),
        Shape(
            name="switch",
            boxes=(2, 8),
            ports=None,
            neighbours_only=False,
            link_speeds_mbps=(200000, 100000),
            nccl_pass_mark_gbs=NCCL_PASS_MARK_GBS,
            nccl_variables={"NCCL_IB_SUBNET_AWARE_ROUTING": SUBNET_ROUTING},
            joined_by="switch",
        ),
        # Boxes each serving their own models (several GX10 appliances, say), uncabled or not:
        # no twin is used, so no rate, pass mark or NCCL setting applies (those given are the
        # defaults, never read).
        Shape(
            name="independent",
            boxes=(1, None),
            ports=(),
            neighbours_only=False,
            link_speeds_mbps=DIRECT_RATE,
            nccl_pass_mark_gbs=NCCL_PASS_MARK_GBS,
            independent=True,
        ),
    )
}


class Link(NamedTuple):
    """One twin of one box on one cable (a switch counts as one cable per port)."""

    ifname: str
    cable: int  # which cable (or switch port group) the twin is on
    twin: int  # 0 or 1: which PCIe rail of the port


def ports(topology: str, switch_ports: tuple[int, ...] = (1,)) -> tuple[int, ...]:
    """The QSFP ports each box of a topology uses, first the one whose first twin carries the
    sockets. A pair uses port 1, as the field's two-box guides cable it (eugr's NETWORKING.md,
    NVIDIA's connect-two-sparks); pair-dual and rings use both; independent boxes none."""
    shape_ports = SHAPES[topology].ports
    return switch_ports if shape_ports is None else shape_ports


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
        cable = ring_cable if SHAPES[topology].neighbours_only else position
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
                f" twins joined by one {SHAPES[topology].joined_by} are on"
                f" different subnets ({listing}); put both ends on one subnet"
            )
    return lines

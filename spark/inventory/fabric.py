"""The fabric's keys: how the QSFP ports are cabled, each twin's address and RDMA device, the
MTU, the management interface; and their checks across the boxes (one topology, as many boxes
as it takes, every address its own, one MTU)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from ipaddress import AddressValueError, IPv4Address, IPv4Interface, NetmaskValueError
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, field_validator

from spark import topology
from spark.checks import LINE_BREAK, refused
from spark.inventory.hosts import names
from spark.options import option
from spark.topology import FABRIC_MTU

if TYPE_CHECKING:
    from spark.inventory.hosts import HostConfig

IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # the kernel's IFNAMSIZ less the NUL
HCA = re.compile(r"[A-Za-z0-9_.-]{1,63}")  # the kernel's IB_DEVICE_NAME_MAX less the NUL
SPARK_TWINS = frozenset(ifname for twins in topology.PORT_TWINS.values() for ifname in twins)


class FabricKeys(BaseModel):
    """A box's keys for the fabric between the boxes."""

    fabric_addresses: dict[str, str] = option(
        '{ifname: "A.B.C.D/prefix"}, one subnet per twin interface,'
        ' e.g. {"enp1s0f1np1": "192.168.100.10/24", "enP2p1s0f1np1": "192.168.101.10/24"}',
        why="Each twin of a cable needs its own subnet (eugr/spark-vllm-docker"
        " docs/NETWORKING.md); left out, each box's are derived from its place in the"
        " inventory, one /24 per twin per cable from 192.168.100.0/24 (spark/topology.py).",
        scope="host",
        default_factory=dict,
    )
    fabric_hcas: dict[str, str] = option(
        '{ifname: RDMA device}, e.g. {"enp1s0f1np1": "rocep1s0f1"};'
        " one distinct device for each fabric interface",
        why="One QSFP DAC shows two ~200 Gb/s twins; NCCL needs every twin in use in"
        " NCCL_IB_HCA or runs at ~3 GB/s (seed 001; dgx-spark-playbooks#102). Port 0 is next to"
        " the RJ-45 port, port 1 further away (dgx-spark-playbooks connect-three-sparks, Step 2;"
        " ibdev2netdev there).",
    )
    fabric_mtu: int = option(
        f"an integer {FABRIC_MTU}..9216, the same on every host ({FABRIC_MTU});"
        " lower only with fabric_mtu_below_9000_because",
        why="Jumbo frames on every fabric interface (seed 001); NVIDIA's own two-Spark guide"
        " leaves 1500, which measured 18.9-21 GB/s of NCCL against 23.74 GB/s at 9000"
        " (dgx-spark-playbooks#25).",
        scope="fleet",
        ge=1500,
        le=9216,
    )
    fabric_mtu_below_9000_because: str | None = option(
        "None, or one line saying why the fabric runs below 9000 (e.g. a switch"
        " without jumbo frames)",
        why="A fabric below 9000 loses NCCL bandwidth (18.9-21 GB/s at 1500 against 23.74 GB/s"
        " at 9000: dgx-spark-playbooks#25), so it is refused unless the owner says why.",
        max_length=200,
    )
    fabric_topology: Literal["pair", "pair-dual", "ring3", "switch", "independent"] = option(
        "'pair' (one cable), 'pair-dual' (two cables, two boxes), 'ring3' (three"
        " boxes, port 0 of each to port 1 of the next), 'switch' (2 to 8 boxes) or"
        " 'independent' (no cluster: each box its own server), the same on every host",
        why="How the QSFP ports are cabled decides the twins used, the subnets and what NCCL is"
        " told: pair is the field's two-box guides, ring3 NVIDIA's connect-three-sparks, switch"
        " NVIDIA's multi-sparks-through-switch (docs/reference.md, Fabric shapes).",
        scope="fleet",
    )
    fabric_switch_ports: list[int] = option(
        "the QSFP ports cabled to the switch, [1], [0] or [1, 0] (switch only)",
        why="A switch may take one port of each box or both; the twins NCCL uses follow.",
        scope="fleet",
        min_length=1,
        max_length=2,
    )
    fabric_link_speed_mbps: int = option(
        "200000, or 100000 for a switch whose ports run at 100 Gb/s",
        why='A Spark\'s ConnectX-7 links each twin at 200 Gb/s (ibstat "Rate: 200":'
        " geerlingguy/sbc-reviews#92). A slower twin is a known fault: a switch port"
        " auto-negotiating 100G (the field forces 200G on MikroTik CRS8xx), a degraded ConnectX"
        " start (dgx-spark-playbooks PR#108), a reseated or damaged cable.",
    )
    fabric_link_speed_low: Literal["refuse", "warn"] = option(
        "'refuse' (stop the box) or 'warn' when a twin links below fabric_link_speed_mbps",
        why="'warn' says so loudly and goes on (a pair behind a 100G switch, say): `make status`"
        " and the alerts then show it as a warning, not red.",
    )
    management_ifname: str = option(
        "the management interface, enP7s7 on a Spark (a ring's sockets use it)",
        why="The 10 GbE RJ-45 port: a ring's sockets (NCCL bootstrap, Gloo) use it, as no fabric"
        " subnet reaches every box (eugr/spark-vllm-docker docs/NETWORKING.md, 3-node mesh;"
        " NVIDIA's spark_cluster_setup.py run_nccl_test).",
    )
    management_address: str | None = option(
        "None, or the box's IPv4 address on management_ifname, A.B.C.D (`ip -4 -br"
        " address show enP7s7`); needed on every box of a ring3, whose rendezvous uses it",
        why="On a ring the head's management address is MASTER_ADDR and each box's is"
        " VLLM_HOST_IP, as NVIDIA's spark_cluster_setup.py does.",
        scope="host",
        default=None,
    )
    roce_gid_index: int = option(
        "an integer 0..255 (where the RoCE v2 + IPv4 entry should be: 3)",
        why="NVIDIA's design puts it at 3 (seed 001). NCCL finds the entry itself wherever it is"
        " (no NCCL_IB_GID_INDEX: it was seen at 4 on one box of two,"
        " GLM-5.3-Flash-EXL3-2x-DGX-Sparks PR#26, and moving after a network re-apply,"
        " sparkring#186); the deploy checks each twin has exactly one and says where when it is"
        " not here.",
        ge=0,
        le=255,
    )
    fabric_kernel_kho_off: bool = option(
        "True (a box of the fabric on a 7.x kernel gets kho=off through GRUB) or"
        " False (such a box is refused with the fix)",
        why="Kernels 7.0 and later, as DGX OS 7.6 ships them (7.0.0-1019-nvidia), turn kexec"
        " handover on at boot, and RDMA memory registration then fails under GPU memory pressure"
        " (`ibv_reg_mr_iova2 failed with error Cannot allocate memory`; 6.17.0-1032 passes): the"
        " fabric's NCCL breaks. The boot option kho=off is the workaround (NVIDIA/NV-Kernels PRs"
        " 590, 591); a reboot is needed after it.",
    )
    fabric_take_over_netplan: bool = option(
        "True (netplan files naming a fabric twin, NVIDIA's 40-cx7.yaml, moved aside"
        " once, a dated copy beside each) or False (such a box is refused, naming the files)",
        why="NVIDIA's two-Spark guide writes /etc/netplan/40-cx7.yaml (dgx-spark-playbooks"
        " connect-two-sparks, Step 3, Option 1); netplan's boot generator makes NetworkManager a"
        " profile of its own from it beside the deploy's (canonical/netplan doc/netplan.md). A"
        " file that configures more than twins, or is no YAML, stays and stops the box.",
    )

    @field_validator("fabric_addresses")
    @classmethod
    def _fabric_addresses(cls, addresses: dict[str, str]) -> dict[str, str]:
        problems = []
        for ifname, text in addresses.items():
            problems += _ifname_problems(ifname)
            try:
                interface = _interface(text)
            except ValueError as error:
                problems.append(f"{ifname}: {error}")
                continue
            problems += [f"{ifname}: {problem}" for problem in _address_problems(interface)]
        problems += _twin_problems(addresses) if not problems else []
        return refused(addresses, problems)

    @field_validator("fabric_hcas")
    @classmethod
    def _fabric_hcas(cls, hcas: dict[str, str]) -> dict[str, str]:
        problems = [
            f"{ifname}: {hca!r} is not an RDMA device name; use the name under"
            " /sys/class/infiniband/"
            for ifname, hca in hcas.items()
            if not HCA.fullmatch(hca)
        ]
        return refused(hcas, problems)

    @field_validator("fabric_switch_ports")
    @classmethod
    def _switch_ports(cls, ports: list[int]) -> list[int]:
        if len(set(ports)) != len(ports) or not set(ports) <= set(topology.PORT_TWINS):
            raise ValueError(
                f"{ports!r} is not a set of a Spark's ports (0 and 1); use [1], [0] or [1, 0]"
            )
        return ports

    @field_validator("management_ifname")
    @classmethod
    def _management_ifname(cls, ifname: str) -> str:
        problems = _ifname_problems(ifname)
        if problems:
            raise ValueError(problems[0])
        return ifname

    @field_validator("management_address")
    @classmethod
    def _management_address(cls, address: str | None) -> str | None:
        if address is not None:
            try:
                IPv4Address(address)
            except AddressValueError:
                raise ValueError(
                    f"{address!r} is not an IPv4 address A.B.C.D; give the box's address on its"
                    " management interface (`ip -4 -br address show`)"
                ) from None
        return address

    def fabric_problems(self) -> dict[str, list[str]]:
        """The checks of one fabric key against another, under the key the user edits."""
        return {
            "fabric_addresses": _not_twins(
                self.fabric_addresses, self.fabric_topology, self.fabric_switch_ports
            ),
            "fabric_hcas": device_problems(
                {
                    ifname: text
                    for ifname, text in self.fabric_addresses.items()
                    if ifname in SPARK_TWINS
                },
                self.fabric_hcas,
            ),
            "fabric_link_speed_mbps": _speed_problems(
                self.fabric_link_speed_mbps, self.fabric_topology
            ),
            "fabric_mtu": _mtu_problems(self.fabric_mtu, self.fabric_mtu_below_9000_because),
        }


def _not_twins(fabric: dict[str, str], shape: str, switch_ports: list[int]) -> list[str]:
    """Each fabric interface a Spark's twin: a misspelt one (enp1s0f1np0 for enp1s0f1np1) is
    named with the twins the box's cabling uses, not as a missing RDMA device. (A twin of the
    other port is the cross-host check's, topology.problems; independent boxes use no fabric.)"""
    if topology.SHAPES[shape].independent:
        return []
    ports = topology.ports(shape, tuple(switch_ports))
    twins = [ifname for port in ports for ifname in topology.PORT_TWINS[port]]
    where = f"port{'s' if len(ports) > 1 else ''} {' and '.join(map(str, ports))}"
    return [
        f"{ifname!r} is not one of the box's twins for its cabling ({shape}, {where}:"
        f" {', '.join(twins)}); use those names, as `ip link` shows them, or give no"
        " fabric_addresses (they are derived from the boxes' order)"
        for ifname in fabric
        if ifname not in SPARK_TWINS
    ]


def device_problems(fabric: dict[str, str], hcas: dict[str, str]) -> list[str]:
    """Each fabric interface has its own RDMA device."""
    problems = [
        f"no RDMA device for fabric interface {ifname}; add {ifname!r} to fabric_hcas"
        for ifname in fabric
        if ifname not in hcas
    ]
    by_hca = defaultdict(list)
    for ifname in fabric:
        if ifname in hcas:
            by_hca[hcas[ifname]].append(ifname)
    return problems + [
        f"{' and '.join(ifnames)} share the RDMA device {hca}; each twin has its own"
        " (rocep1s0f1 and roceP2p1s0f1 on a Spark)"
        for hca, ifnames in by_hca.items()
        if len(ifnames) > 1
    ]


def _speed_problems(speed: int, shape: str) -> list[str]:
    """A rate the shape's twins link at (spark/topology.py DIRECT_RATE and the switch's)."""
    allowed = topology.SHAPES[shape].link_speeds_mbps
    if speed in allowed:
        return []
    rates = " or ".join(map(str, allowed))
    why = "" if len(allowed) > 1 else " (a direct cable links at 200G)"
    return [f"{speed} Mb/s is not a link rate of a {shape}; use {rates}{why}"]


def _mtu_problems(mtu: int, because: str | None) -> list[str]:
    """Jumbo frames unless the owner says why not, in one line."""
    if because is not None and LINE_BREAK.search(because):
        return ["fabric_mtu_below_9000_because: a line break or NUL; write one line"]
    if mtu < FABRIC_MTU and not (because and because.strip()):
        return [
            f"{mtu} is below {FABRIC_MTU}: NCCL measured 18.9-21 GB/s at 1500 against 23.74 GB/s"
            f" at 9000 (dgx-spark-playbooks#25); set {FABRIC_MTU} (seed 001), or keep it and say"
            " why in fabric_mtu_below_9000_because"
        ]
    return []


def _ifname_problems(ifname: str) -> list[str]:
    if IFNAME.fullmatch(ifname) and ifname not in (".", ".."):
        return []
    return [
        f"{ifname!r} is not a network interface name; use the name `ip link` shows"
        " (1..15 of A-Z a-z 0-9 _ . -)"
    ]


def _interface(text: str) -> IPv4Interface:
    """The interface address of "A.B.C.D/prefix"; the prefix is required (no silent /32)."""
    if "/" not in text:
        raise ValueError(f"{text!r} has no prefix; write it as A.B.C.D/prefix, e.g. /24")
    try:
        return IPv4Interface(text)
    except (AddressValueError, NetmaskValueError):
        raise ValueError(
            f"{text!r} is not an IPv4 address with a prefix; write A.B.C.D/prefix, e.g."
            " 192.168.100.10/24"
        ) from None


def _address_problems(interface: IPv4Interface) -> list[str]:
    ip, network = interface.ip, interface.network
    if network.prefixlen > 30:
        return [f"{interface} is a /{network.prefixlen}; use a subnet of /30 or wider, e.g. /24"]
    if ip.is_loopback or ip.is_multicast or ip.is_unspecified:
        return [f"{ip} is not a unicast address for a link; use a private one, e.g. 192.168.100.x"]
    if ip in (network.network_address, network.broadcast_address):
        return [f"{interface} is the network or broadcast address of {network}; pick a host in it"]
    return []


def _twin_problems(addresses: dict[str, str]) -> list[str]:
    """Twins on one subnet would make the kernel route both rails through one interface."""
    networks = [(ifname, IPv4Interface(text).network) for ifname, text in addresses.items()]
    return [
        f"{a} ({net_a}) and {b} ({net_b}) share a subnet; give each twin its own,"
        " e.g. 192.168.100.0/24 and 192.168.101.0/24"
        for i, (a, net_a) in enumerate(networks)
        for b, net_b in networks[i + 1 :]
        if net_a.overlaps(net_b)
    ]


def mixed_topologies(hosts: tuple[HostConfig, ...]) -> list[str]:
    """One topology (and switch ports) on every host, or the one problem that they differ."""
    shape, first = hosts[0].topology, hosts[0]
    differ = [
        host for host in hosts if (host.topology, host.switch_ports) != (shape, first.switch_ports)
    ]
    if not differ:
        return []
    listing = _listing((h, f"{h.topology} {list(h.switch_ports)}") for h in hosts)
    return [
        f"{names(differ)}: fabric_topology: the hosts differ ({listing}); set one"
        " fabric_topology (and fabric_switch_ports) in group_data for every host"
    ]


def cabled_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """One topology on every host, as many boxes as it takes, every twin it uses addressed,
    the twins of one cable (or switch segment) on one subnet, every address its own."""
    if differ := mixed_topologies(hosts):
        return differ
    shape, first = hosts[0].topology, hosts[0]
    low, high = topology.SHAPES[shape].boxes
    if len(hosts) < low or (high is not None and len(hosts) > high):
        wanted = f"{low}" if low == high else f"{low} to {high}"
        return [
            f"{names(hosts)}: fabric_topology: {shape} joins {wanted} boxes, the inventory"
            f" has {len(hosts)}; change fabric_topology or the boxes"
        ]
    # Given addresses fill no gap: an empty fabric_addresses was derived (load_from_dicts).
    problems = topology.problems(
        shape,
        [(host.name, {link.ifname: link.address for link in host.fabric}) for host in hosts],
        first.switch_ports,
    )
    firsts = {host.fabric[0].ifname for host in hosts if host.fabric}
    if not problems and topology.SHAPES[shape].one_address_for_all and len(firsts) > 1:
        listing = _listing((h, "+".join(link.ifname for link in h.fabric)) for h in hosts)
        return [
            f"{names(hosts)}: fabric_addresses: the interfaces differ ({listing}); list the"
            " same interfaces in the same order on every host (the first carries the sockets)"
        ]
    if topology.SHAPES[shape].neighbours_only:
        problems += [
            f"{host.name}: management_address: missing; a ring's rendezvous and sockets go over"
            f" {host.management_ifname} (no twin reaches every box): give the box's IPv4 address"
            f" there (`ip -4 -br address show {host.management_ifname}`)"
            for host in hosts
            if host.management_address is None
        ]
    users = defaultdict(list)
    for host in hosts:
        for link in host.fabric:
            users[link.address.ip].append((host, link.ifname))
    return problems + [
        f"{names(host for host, _ in used)}: fabric_addresses: {ip} is used by"
        f" {' and '.join(f'{host.name} ({ifname})' for host, ifname in used)};"
        " give every host its own address"
        for ip, used in users.items()
        if len(used) > 1
    ]


def mtu_problems(hosts: Iterable[HostConfig], reference: HostConfig) -> list[str]:
    """Every box of a cluster must use one MTU; the head's is the ``reference``. (The GID entry
    may differ per box: NCCL finds each box's own.)"""
    return [
        f"{host.name}: fabric_mtu: {host.mtu} differs from {reference.name}'s {reference.mtu};"
        " use one MTU on every host (remove the host's own fabric_mtu)"
        for host in hosts
        if host.mtu != reference.mtu
    ]


def _listing(pairs: Iterable[tuple[HostConfig, object]]) -> str:
    return ", ".join(f"{host.name}: {value}" for host, value in pairs)

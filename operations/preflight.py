"""Check, before the cluster relies on it, that the fabric joins the boxes."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from pyinfra import host, state
from pyinfra.api import FactBase, operation

from operations.config import HostConfig

IP_ICMP_HEADERS = 28  # a ping's payload is the MTU less the IPv4 (20) and ICMP (8) headers
WAIT_SECONDS = 10  # a profile brought up moments before may still be resolving its peer

Peer = tuple[str, str, str]  # (twin, the other box's name, its address on that twin)


def peers_of(me: HostConfig, hosts: Iterable[HostConfig]) -> list[Peer]:
    """Every other box's address on each of this box's twins (the same twin on each box)."""
    return [
        (link.ifname, other.name, str(theirs.address.ip))
        for link in me.fabric
        for other in hosts
        if other.name != me.name
        for theirs in other.fabric
        if theirs.ifname == link.ifname
    ]


def _ping(ifname: str, address: str, size: int) -> str:
    # -M do: never fragment, so a hop with a smaller MTU drops the frame instead of hiding.
    return (
        f"ping -q -n -c 1 -W 1 -M do -s {size} -I {shlex.quote(ifname)} {shlex.quote(address)}"
        " >/dev/null 2>&1"
    )


class FabricPeers(FactBase):
    """For each (twin, address): whether one unfragmented ping of ``size`` bytes answered.

    .. code:: python

        {("enp1s0f1np1", "192.168.100.11"): True, ("enP2p1s0f1np1", "192.168.101.11"): False}
    """

    default = dict

    def command(self, pairs: tuple[tuple[str, str], ...], size: int) -> str:
        checks = [
            f"if {_ping(ifname, address, size)}; then a=yes; else a=no; fi;"
            f" printf '%s %s %s\\n' \"$a\" {shlex.quote(ifname)} {shlex.quote(address)};"
            for ifname, address in pairs
        ]
        return f"{{ {' '.join(checks)} }} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[tuple[str, str], bool]:
        answers = {}
        for line in output:
            answered, ifname, address = line.split()
            answers[(ifname, address)] = answered == "yes"
        return answers


def _check_command(silent: list[Peer], mtu: int) -> str:
    """Ping each silent peer for up to WAIT_SECONDS; for any still silent, say which box, twin
    and peer, what the link looks like, and what to check; exit 1 then."""
    size = mtu - IP_ICMP_HEADERS
    parts = ["failed=0"]
    for ifname, name, address in silent:
        twin = shlex.quote(ifname)
        lead = f"{host.name}: fabric twin {ifname} gets no answer from {name} ({address} on its"
        lead += f" {ifname}) to {mtu}-byte unfragmented pings"
        no_link = (
            f"; {ifname} has no link: check the QSFP-DD cable at both ends (the same port on"
            f" both boxes) and that {name} is powered on"
        )
        small_only = (
            f"; smaller pings do get through: a hop below MTU {mtu}; check"
            f" `cat /sys/class/net/{ifname}/mtu` on {name} (and on any switch between)"
        )
        silent_link = (
            f"; {ifname} has link but nothing answers: check on {name} that {ifname} is up"
            f" with {address} (`ip -br address show {ifname}`), and the cable's port"
        )
        parts.append(
            f"n=0; until {_ping(ifname, address, size)}; do n=$((n + 1));"
            f" if [ $n -ge {WAIT_SECONDS} ]; then"
            f' if [ "$(cat /sys/class/net/{twin}/carrier 2>/dev/null)" != 1 ];'
            f" then hint={shlex.quote(no_link)};"
            f" elif {_ping(ifname, address, 56)}; then hint={shlex.quote(small_only)};"
            f" else hint={shlex.quote(silent_link)}; fi;"
            f" printf '%s%s\\n' {shlex.quote(lead)} \"$hint\" >&2; failed=1; break; fi;"
            " sleep 1; done"
        )
    parts.append('[ "$failed" = 0 ]')
    return "; ".join(parts)


@operation()
def fabric_peers(peers: list[Peer], mtu: int = 9000):
    """
    Check that each twin reaches the same twin of every other box with full-size frames.

    + peers: (twin, other box, its address on that twin), as ``peers_of`` lists them
    + mtu: the fabric MTU; each ping carries ``mtu`` - 28 bytes, unfragmented, so a link or
      hop with a smaller MTU fails here instead of stalling NCCL later

    This changes nothing. A cut or miswired twin does not stop the boxes from configuring it
    (NetworkManager brings a static profile up without a peer; the GID entries follow the
    address): this is where it shows. A peer that answers is done; one that does not gets a
    command that pings it for up to WAIT_SECONDS (10) and then fails the box, naming it, the
    twin, the peer, and what to check (no link: the cable; small pings only: an MTU on the way;
    link but silence: the peer's address). Boxes pyinfra has failed in this run (it could not
    reach them, or they stopped on an error) are left out: pyinfra names them itself, and the
    other boxes go on with what does not need them.

    **Example:**

    .. code:: python

        preflight.fabric_peers(
            name="Fabric twins reach the other boxes",
            peers=[("enp1s0f1np1", "spark-2", "192.168.100.11")],
        )
    """
    if not peers:
        host.noop("no other box in the inventory: no fabric peer to reach")
        return
    failed = {failed_host.name for failed_host in state.failed_hosts}
    left_out = sorted({name for _ifname, name, _address in peers if name in failed})
    checked = [peer for peer in peers if peer[1] not in failed]
    pairs = tuple(dict.fromkeys((ifname, address) for ifname, _name, address in checked))
    answers = host.get_fact(FabricPeers, pairs=pairs, size=mtu - IP_ICMP_HEADERS) if pairs else {}
    silent = [peer for peer in checked if not answers.get((peer[0], peer[2]))]
    if silent:
        yield _check_command(silent, mtu)
        return
    skipped = f" ({', '.join(left_out)} failed in this run: not checked)" if left_out else ""
    host.noop(f"every twin reaches its peers with {mtu}-byte frames{skipped}")

"""Manage NetworkManager connection profiles with nmcli."""

from __future__ import annotations

import shlex
from ipaddress import IPv4Interface

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import util
from operations.asked import Question, answer, question
from spark import twin

# What ethernet() manages, plus where a profile is active (the GENERAL.* lines appear only then).
FIELDS = (
    "connection.id",
    "connection.uuid",
    "connection.type",
    "connection.interface-name",
    "connection.autoconnect",
    "ipv4.method",
    "ipv4.addresses",
    "ipv4.gateway",
    "ipv6.method",
    "802-3-ethernet.mtu",
    "GENERAL.DEVICES",
    "GENERAL.STATE",
)
SEPARATOR = "--"  # printed before each profile; never a "field:value" line
NETPLAN_DIRS = ("/etc/netplan", "/run/netplan", "/lib/netplan")  # netplan reads */*.yaml there
# What a file moved aside is renamed to, before its date: no longer a *.yaml netplan reads.
MOVED_ASIDE = ".moved-aside-by-spark-"


class NmConnections(FactBase):
    """Every NetworkManager profile by UUID, with the FIELDS it has, in nmcli's own text.

    .. code:: python

        {
            "f5f09c80-9b6a-3b50-9c46-5418db689999": {
                "connection.id": "Wired connection 1",
                "connection.interface-name": "enP2p1s0f1np1",
                "ipv4.method": "auto",
                "802-3-ethernet.mtu": "auto",
                "GENERAL.STATE": "activating",
                # ... and the other FIELDS, each as nmcli prints it
            },
        }
    """

    default = dict

    def command(self) -> str:
        # `connection show <uuid>` prints "field:value" lines (terse multiline mode), and unlike
        # the tabular mode of -g it does not escape ':' in values: a line splits at its first ':'.
        return (
            f"{{ nmcli -g UUID connection show | while read -r uuid; do echo {SEPARATOR}; "
            f'nmcli -t -f {",".join(FIELDS)} connection show uuid "$uuid"; done; }} '
            "2>/dev/null || true"
        )

    def process(self, output: list[str]) -> dict[str, dict[str, str]]:
        blocks: list[dict[str, str]] = []
        for line in output:
            if line == SEPARATOR:
                blocks.append({})
            elif blocks:
                field, _, value = line.partition(":")
                blocks[-1][field] = value
        # A profile deleted between the listing and its `show` leaves an empty block.
        return {block["connection.uuid"]: block for block in blocks if "connection.uuid" in block}


IFF_UP = 0x1  # the administrative "up" flag of /sys/class/net/IF/flags (linux/if.h)


class LiveLink(FactBase):
    """An interface's live state, whatever its profile says: administratively up (its flags),
    its MTU (spark/twin.py: mtu_file, read as compliance and the collector read it) and its IPv4
    addresses with their prefixes (`ip -4 -o address show dev`): what a hand change (`ip link
    set dev IF mtu 1500`, `ip link set dev IF down`, `ip address del`) alters and the profile
    does not show. None where the interface does not exist.

    .. code:: python

        {"up": True, "mtu": 1500, "addresses": ["192.168.101.11/24"]}
    """

    def command(self, ifname: str) -> str:
        directory = shlex.quote(f"{twin.SYS}/{twin.NET}/{ifname}")
        # "4: enP2p1s0f1np1    inet 192.168.101.11/24 brd ... scope global ..." (iproute2 -o)
        return (
            f'if [ -e {directory} ]; then echo "flags $(cat {directory}/flags)";'
            f' echo "mtu $(cat {shlex.quote(twin.mtu_file(ifname))})";'
            f" ip -4 -o address show dev {shlex.quote(ifname)} |"
            ' while read -r _n _if _family cidr _rest; do echo "address $cidr"; done;'
            " fi 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> dict | None:
        if not output:
            return None
        live: dict = {"up": False, "mtu": twin.NO_MTU, "addresses": []}
        for line in output:
            kind, _, value = line.partition(" ")
            if kind == "flags":
                live["up"] = bool(int(value, 16) & IFF_UP) if value.startswith("0x") else False
            elif kind == "mtu":
                live["mtu"] = twin.mtu(value)
            elif kind == "address":
                live["addresses"].append(value)
        return live


# Reads each file named on stdin as netplan does (YAML, with python3-yaml: netplan.io depends on
# it, Debian 12's 0.106 as Ubuntu's) and prints each definition in it: file, device type, ID, and
# the name it matches.
DEFINITIONS = r"""
import sys
try:
    import yaml
except ImportError:
    yaml = None
for path in sys.stdin.read().splitlines():
    try:
        with open(path) as file:
            network = yaml.safe_load(file)["network"]
        groups = [(kind, group) for kind, group in network.items() if isinstance(group, dict)]
    except Exception as error:
        why = "no python3-yaml" if yaml is None else type(error).__name__
        print(path, "unreadable", why, "-", sep="\t")
        continue
    for kind, group in groups:
        for name, body in group.items():
            match = body.get("match") if isinstance(body, dict) else None
            matched = match.get("name") if isinstance(match, dict) else None
            print(path, kind, name, matched or "-", sep="\t")
"""


class ForeignNetplanFiles(FactBase):
    """Netplan files that name an interface, except NetworkManager's own 90-NM-* mirrors, each
    with every definition in it: device type, ID, and the name it matches ("-" for none). A
    file read as netplan's YAML in vain holds one ("unreadable", why, "-").

    .. code:: python

        {
            "/etc/netplan/40-cx7.yaml": [
                ("ethernets", "enp1s0f1np1", "-"),
                ("ethernets", "enP2p1s0f1np1", "-"),
            ],
        }
    """

    default = dict

    def command(self, ifname: str) -> str:
        files = " ".join(f"{directory}/*.yaml" for directory in NETPLAN_DIRS)
        # -w: "enp1s0f1np1" must not match "enp1s0f1np10".
        found = f"grep -lwF -- {shlex.quote(ifname)} {files} 2>/dev/null | grep -v /90-NM-"
        python = f"python3 -c {shlex.quote(DEFINITIONS)}"
        unread = "sed 's/$/\\tunreadable\\tno python3\\t-/'"
        read = f"if command -v python3 >/dev/null; then {python}; else {unread}; fi"
        return f"{{ {found} | {read}; }} || true"

    def process(self, output: list[str]) -> dict[str, list[tuple[str, str, str]]]:
        files: dict[str, list[tuple[str, str, str]]] = {}
        for line in filter(None, output):
            path, kind, name, matched = line.split("\t")
            files.setdefault(path, []).append((kind, name, matched))
        return files


def _nmcli(*args: str) -> str:
    return " ".join(["nmcli", *(shlex.quote(arg) for arg in args)])


def _delete_if_present(uuid: str) -> str:
    delete = _nmcli("connection", "delete", "uuid", uuid)
    return f"{delete} || ! nmcli -g connection.uuid connection show uuid {shlex.quote(uuid)}"


def _pairs(fields: dict[str, str]) -> list[str]:
    return [item for field_value in fields.items() for item in field_value]


def _active_on(profile: dict[str, str], ifname: str) -> bool:
    return ifname in profile.get("GENERAL.DEVICES", "").split(",")  # nmcli joins them with ","


def _bound_to(profile: dict[str, str], ifname: str) -> bool:
    return profile.get("connection.interface-name") == ifname or _active_on(profile, ifname)


@operation()
def ethernet(
    con_name: str,
    ifname: str,
    address: str,
    mtu: int,
    autoconnect: bool = True,
    ipv6_method: str = "disabled",
):
    """
    Keep one static IPv4 ethernet profile on an interface, active, and no other profile there.

    + con_name: the profile's connection.id (``name`` is pyinfra's, for the operation)
    + ifname: the interface it is bound to (connection.interface-name)
    + address: IPv4 address with prefix, "192.168.100.10/24"; no gateway: a fabric link
      carries only its own subnet
    + mtu: 802-3-ethernet.mtu
    + autoconnect: connection.autoconnect
    + ipv6_method: ipv6.method; "disabled" because every IPv6 address on the interface takes
      RoCE GID table slots, which can push the IPv4 RoCE v2 entry off the index NCCL is told
      to use (see roce.gid_index); the link-local GIDs exist without IPv6 anyway

    Fields that differ are changed with ``nmcli connection modify``, then the profile is
    (re)activated; it is also activated when it is not active on ``ifname``, and re-activated
    when the live link differs from it (set down, its MTU or IPv4 addresses changed by hand:
    ``ip link set dev IF mtu 1500`` leaves the profile as it was). Activating a profile applies
    all of it to the device (nmcli(1), connection up; NetworkManager's "Reapply" is only for
    changes made to the profile since it was applied: org.freedesktop.NetworkManager.Device).
    Other profiles bound to ``ifname`` by interface name or active on it (NetworkManager's
    automatic "Wired connection 1") are deleted. Netplan files naming ``ifname`` are
    ``netplan_left_out``'s.

    **Example:**

    .. code:: python

        nmcli.ethernet(
            name="Fabric link 1 on enp1s0f1np1",
            con_name="Fabric link 1",
            ifname="enp1s0f1np1",
            address="192.168.100.10/24",
            mtu=9000,
        )
    """
    # nmcli's own text for each value, so the live text compares as it is.
    want = {
        "connection.interface-name": ifname,
        "connection.autoconnect": "yes" if autoconnect else "no",
        "ipv4.method": "manual",
        "ipv4.addresses": str(IPv4Interface(address)),
        "ipv4.gateway": "",
        "ipv6.method": ipv6_method,
        "802-3-ethernet.mtu": str(mtu),
    }
    profiles = answer(NmConnections).values()
    named = [profile for profile in profiles if profile["connection.id"] == con_name]
    strays = [p for p in profiles if p["connection.id"] != con_name and _bound_to(p, ifname)]
    if len(named) > 1:
        uuids = ", ".join(profile["connection.uuid"] for profile in named)
        yield from util.refused(
            f"{host.name}: several NetworkManager profiles are named {con_name!r} ({uuids}); "
            "delete all but one (nmcli connection delete uuid <uuid>), then run again."
        )
        return

    if named:
        profile = named[0]
        uuid = profile["connection.uuid"]
        if profile["connection.type"] != "802-3-ethernet":
            yield from util.refused(
                f"{host.name}: NetworkManager profile {con_name!r} is of type "
                f"{profile['connection.type']}, not ethernet; delete or rename it, then run again."
            )
            return
        changes = {field: value for field, value in want.items() if profile.get(field) != value}
        if changes:
            yield _nmcli("connection", "modify", "uuid", uuid, *_pairs(changes))
        active = profile.get("GENERAL.STATE") == "activated" and _active_on(profile, ifname)
        target = ("uuid", uuid)
    else:
        changes = want
        yield _nmcli("connection", "add", "type", "ethernet", "con-name", con_name, *_pairs(want))
        active = False
        target = ("id", con_name)

    # The live link, where the profile is up on it and says what it should.
    live = answer(LiveLink, ifname=ifname) if active and not changes else None
    drifted = live is not None and (live["up"], live["mtu"], live["addresses"]) != (
        True,
        mtu,
        [want["ipv4.addresses"]],
    )
    if changes or not active or drifted:
        yield _nmcli("connection", "up", *target)
    # After `up`, so the interface is never left without a profile NetworkManager could
    # autoconnect in between (it would pick one of the strays).
    # NetworkManager drops its own in-memory profiles (e.g. one it made for an address found on
    # the link) when `up` takes the device: one already gone is what we wanted.
    for stray in strays:
        yield _delete_if_present(stray["connection.uuid"])
    if not (changes or strays or drifted) and active:
        host.noop(f"profile {con_name} is up to date and active on {ifname}, as is the link")


@operation()
def netplan_left_out(ifnames: list[str], take_over: bool = False):
    """
    No netplan file but NetworkManager's own 90-NM-* mirrors names these interfaces.

    + ifnames: the interfaces NetworkManager's profiles alone configure
    + take_over: move each file naming one aside, once: renamed to ``<file>`` +
      ``MOVED_ASIDE`` + its UTC date, beside it and out of netplan's ``*.yaml``; then netplan's
      profiles generated again without it and NetworkManager's profiles reloaded. Without it
      such a file is refused, naming the option.

    Netplan's generator turns every definition, at boot and on ``netplan generate`` or
    ``apply``, into a NetworkManager profile of its own in /run (``netplan-<ifname>``), which
    NetworkManager would bring up on the twin in place of ethernet()'s.

    **Example:**

    .. code:: python

        nmcli.netplan_left_out(
            name="Fabric twins left to NetworkManager",
            ifnames=["enp1s0f1np1", "enP2p1s0f1np1"],
        )
    """
    files: dict[str, list[tuple[str, str, str]]] = {}
    for ifname in ifnames:
        files |= answer(ForeignNetplanFiles, ifname=ifname)
    if not files:
        host.noop(f"no netplan file but NetworkManager's configures {', '.join(ifnames)}")
        return
    if not take_over:
        yield from util.refused(
            f"{host.name}: {', '.join(sorted(files))} configure(s) {', '.join(ifnames)} outside"
            " NetworkManager (netplan makes NetworkManager a profile of its own from them at"
            " every boot), which owns the fabric interfaces on these boxes: set"
            " fabric_take_over_netplan = True for the deploy to move those files aside (a dated"
            " copy stays beside each), or remove the twins from them, then run again."
        )
        return
    # Moved aside, a file takes with it all it configures: only one that holds twins alone is.
    others = {
        path: [
            f"unreadable ({name})" if kind == "unreadable" else name
            for kind, name, matched in definitions
            if kind == "unreadable" or not {name, matched} & set(ifnames)
        ]
        for path, definitions in files.items()
    }
    if any(others.values()):
        named = "; ".join(
            f"{path}: {', '.join(rest)}" for path, rest in sorted(others.items()) if rest
        )
        yield from util.refused(
            f"{host.name}: fabric_take_over_netplan moves aside only netplan files that configure"
            f" fabric twins alone, and these configure more or could not be read ({named}):"
            f" take {', '.join(ifnames)} out of them by hand, then run again."
        )
        return
    files = dict(sorted(files.items()))
    for path in files:
        moved = f"{shlex.quote(path)}{MOVED_ASIDE}$(date -u +%Y%m%dT%H%M%SZ)"
        yield f"mv -- {shlex.quote(path)} {moved}"
    # Without netplan no generator wrote a profile from them: nothing to regenerate.
    yield "! command -v netplan >/dev/null || netplan generate"
    yield "nmcli connection reload"


def questions(ifnames: list[str]) -> list[Question]:
    """What ``ethernet`` reads for each of these interfaces (operations/asked.py)."""
    return [
        *(question(ForeignNetplanFiles, ifname=ifname) for ifname in ifnames),
        question(NmConnections),
        *(question(LiveLink, ifname=ifname) for ifname in ifnames),
    ]

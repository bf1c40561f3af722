"""nftables: cluster ports only from the fabric."""

from __future__ import annotations

import hashlib
import re
from io import StringIO
from ipaddress import IPv4Network

from jinja2 import Template
from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.facts.files import File

from operations import debpkg, util
from operations.asked import Question, answer, question
from spark.ports import BACKEND_PORTS

TABLE = "inet spark"  # our own table: docker's and anyone else's rules stay untouched
UNIT = "spark-firewall.service"
DIGEST = re.compile(r'comment "spark:([0-9a-f]{64})"')
PATH = "/etc/spark/firewall.nft"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
# The table deleted where it is left (stopping the unit deletes it already: its ExecStop).
DELETE_TABLE = f"if nft list table {TABLE} >/dev/null 2>&1; then nft delete table {TABLE}; fi"


def rules_check(path: str = PATH) -> str:
    """Shell that prints "rules none" (no table), "rules as-file" or "rules differ": the live
    table against what `path` gives once loaded by the same nft into a throwaway network
    namespace (unshare --net), both as nft lists them. A flushed chain or a deleted rule leaves
    the table's comment as it was: only its rules tell."""
    return (
        f"live=$(nft list table {TABLE} 2>/dev/null);"
        f" want=$(unshare --net sh -c 'nft -f \"$1\" && nft list table {TABLE}' sh {path}"
        " 2>/dev/null);"
        ' if [ -z "$live" ]; then echo "rules none";'
        ' elif [ "$live" = "$want" ]; then echo "rules as-file"; else echo "rules differ"; fi'
    )


class FirewallState(FactBase):
    """Whether nft is installed, the kernel's ephemeral port range, the digest of the loaded
    `inet spark` table (from its comment), whether its rules are what the ruleset file gives
    (rules_check) and the state of its unit.

    .. code:: python

        {"nft": True, "ephemeral": (32768, 60999), "loaded": "5be1...", "rules": "as-file",
         "enabled": "enabled", "active": "active"}
    """

    def command(self, path: str = PATH) -> str:
        return (
            "command -v nft >/dev/null && echo nft;"
            ' echo "ephemeral $(cat /proc/sys/net/ipv4/ip_local_port_range)";'
            f' echo "loaded $(nft list table {TABLE} 2>/dev/null | head -n 3)";'
            f" {rules_check(path)};"
            f' echo "enabled $(systemctl is-enabled {UNIT} 2>/dev/null)";'
            f' echo "active $(systemctl is-active {UNIT} 2>/dev/null)"; true'
        )

    def process(self, output: list[str]) -> dict:
        text = "\n".join(output)
        fields = dict(line.partition(" ")[::2] for line in output)
        low, high = (int(port) for port in fields["ephemeral"].split())
        digest = DIGEST.search(text)
        return {
            "nft": "nft" in fields,
            "ephemeral": (low, high),
            "loaded": digest[1] if digest else None,
            "rules": fields.get("rules"),
            "enabled": fields.get("enabled") or None,
            "active": fields.get("active") or None,
        }


def merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Port ranges sorted, overlapping and adjacent ones joined (nft refuses overlaps in a set)."""
    result: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if result and low <= result[-1][1] + 1:
            result[-1] = (result[-1][0], max(high, result[-1][1]))
        else:
            result.append((low, high))
    return result


def ruleset(fabric: dict[str, str], ports: list[tuple[int, int]]) -> str:
    """The `inet spark` table, its comment the SHA-256 of the rest (what the fact compares)."""
    template = Template(
        (util.TEMPLATES / "spark-firewall.nft.j2").read_text(), keep_trailing_newline=True
    )
    variables = {
        "ifnames": sorted(fabric),
        "subnets": sorted({str(IPv4Network(subnet)) for subnet in fabric.values()}),
        "ports": [str(low) if low == high else f"{low}-{high}" for low, high in ports],
    }
    digest = hashlib.sha256(template.render(digest="", **variables).encode()).hexdigest()
    return template.render(digest=digest, **variables)


@operation()
def cluster_ports_fabric_only(
    fabric: dict[str, str],
    ports: list[tuple[int, int]],
    open_ports: list[int],
    path: str = PATH,
):
    """
    Let the cluster's ports accept connections only from the fabric; everything else is left
    as it is (own table, default accept).

    + fabric: fabric interface -> its subnet ("192.168.100.0/24"): only these interfaces, from
      these subnets, reach the cluster's ports
    + ports: the cluster's ports as (low, high) ranges (Ray's, the distributed back-end's); the
      kernel's ephemeral range is added (NCCL, Gloo and vLLM listen there)
    + open_ports: ports that must stay reachable from anywhere (SSH, the lanes' APIs): refused
      when a cluster port range holds one
    + path: the ruleset file; ``spark-firewall.service`` loads it at boot

    From elsewhere, a connection to a cluster port is refused (TCP reset, ICMP unreachable) rather
    than dropped, so a client fails at once. The table is replaced whole, in one transaction,
    when its digest differs from the file's or its rules from what the file gives (a flushed
    chain, a deleted rule).
    """
    state = answer(FirewallState, path=path)
    ranges = merged([*ports, *BACKEND_PORTS, state["ephemeral"]])
    closed = [port for port in open_ports if any(low <= port <= high for low, high in ranges)]
    if closed:
        yield from util.refused(
            f"{host.name}: port(s) {', '.join(map(str, sorted(closed)))} must stay open (SSH,"
            " a lane's API) but fall among the cluster's ports"
            f" ({', '.join(f'{low}-{high}' for low, high in ranges)}); move them out of these"
            " ranges (a lane's `port`, ray_port, the kernel's net.ipv4.ip_local_port_range)"
        )
        return
    rules = ruleset(fabric, ranges)
    if not state["nft"]:
        yield debpkg.apt_install("nftables")
    unit_path = UNIT_PATH
    found = util.on_box(path, unit_path)
    ruleset_file = util.put(StringIO(rules), path, found=found)
    yield from ruleset_file
    unit = util.template(
        "spark-firewall.service.j2", unit_path, found=found, path=path, table=TABLE
    )
    yield from unit
    active = state["active"] == "active"  # starting it loads the file
    reload = active and (state["loaded"] != DIGEST.search(rules)[1] or state["rules"] != "as-file")
    yield from util.unit_started(
        UNIT,
        unit_changed=bool(unit),
        enabled=state["enabled"],
        running=active,
        changed=reload,
        restart=f"nft -f {path}",  # replaces the table in one transaction: no gap
    )
    if active and not reload and not (ruleset_file or unit) and state["enabled"] == "enabled":
        host.noop(f"{TABLE} admits the cluster's ports from the fabric only")


@operation()
def removed(path: str = PATH):
    """
    Stop and remove the firewall a cluster left on a box that now serves alone: its unit, its
    table and its ruleset file.

    + path: the ruleset file
    """
    if answer(File, path=UNIT_PATH) is None:
        host.noop(f"no {UNIT} on this box")
        return
    yield f"systemctl disable --now {UNIT}"
    yield DELETE_TABLE
    yield f"rm -f {UNIT_PATH} {path}"
    yield "systemctl daemon-reload"


def questions() -> list[Question]:
    """What ``cluster_ports_fabric_only`` reads (operations/asked.py)."""
    return [
        question(FirewallState, path=PATH),
        question(util.RootFiles, paths=(PATH, UNIT_PATH)),
    ]


def removed_questions() -> list[Question]:
    """What ``removed`` reads (operations/asked.py)."""
    return [question(File, path=UNIT_PATH)]

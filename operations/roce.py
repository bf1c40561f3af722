"""Verify the RoCE v2 GID index NCCL will use."""

from __future__ import annotations

import shlex
from ipaddress import IPv4Interface, IPv6Address
from typing import TypedDict

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.api.exceptions import OperationError

SYSFS = "/sys/class/infiniband"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
WAIT_SECONDS = 15  # generous: the entries follow a new address within about a second
COLUMNS = ("hca", "port", "index", "type", "ndev", "gid")  # the fact command's output columns


class GidEntry(TypedDict):
    port: int
    index: int
    type: str
    ndev: str
    gid: str


class GidTables(FactBase):
    """Every non-zero GID table entry of every RDMA device, by device, in port and index order.

    .. code:: python

        {
            "rocep1s0f1": [
                {"port": 1, "index": 0, "type": "IB/RoCE v1", "ndev": "enp1s0f1np1",
                 "gid": "fe80:0000:0000:0000:f8d4:dfff:fe5b:1de9"},
                {"port": 1, "index": 3, "type": "RoCE v2", "ndev": "enp1s0f1np1",
                 "gid": "0000:0000:0000:0000:0000:ffff:c0a8:640a"},
            ],
        }
    """

    default = dict

    def command(self) -> str:
        # Shell builtins only: a port has 128+ entries. The type and ndev of an unused entry
        # cannot be read (EINVAL), so zero GIDs are skipped before those are read.
        return (
            f"{{ for p in {SYSFS}/*/ports/*; do h=${{p%/ports/*}}; "
            'for f in "$p"/gids/*; do i=${f##*/}; g=; t=; n=; read -r g < "$f"; '
            f'case "$g" in ""|{ZERO_GID}) continue;; esac; '
            'read -r t < "$p/gid_attrs/types/$i"; read -r n < "$p/gid_attrs/ndevs/$i"; '
            r"printf '%s\t%s\t%s\t%s\t%s\t%s\n' "
            '"${h##*/}" "${p##*/}" "$i" "$t" "$n" "$g"; '
            "done; done; } 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> dict[str, list[GidEntry]]:
        tables: dict[str, list[GidEntry]] = {}
        for line in output:
            hca, port, index, kind, ndev, gid = line.split("\t")
            entry = GidEntry(port=int(port), index=int(index), type=kind, ndev=ndev, gid=gid)
            tables.setdefault(hca, []).append(entry)
        for entries in tables.values():
            entries.sort(key=lambda entry: (entry["port"], entry["index"]))
        return tables


def ipv4_gid(address: str) -> str:
    """The GID of an IPv4 address: its IPv4-mapped IPv6 address, as sysfs prints it."""
    return IPv6Address(f"::ffff:{IPv4Interface(address).ip}").exploded


def format_table(entries: list[GidEntry]) -> str:
    rows = [("index", "type", "ndev", "gid")]
    rows += [(str(e["index"]), e["type"], e["ndev"], e["gid"]) for e in entries]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    return "\n".join(
        "  "
        + "".join(cell.ljust(width + 2) for cell, width in zip(row[:3], widths, strict=True))
        + row[3]
        for row in rows
    )


def _wait_command(path: str, index: int, expected: str, problem: str) -> str:
    """Poll one GID entry until it reads `expected` ("gid|type|ndev"), else print the tables."""
    reads = "; ".join(
        f'read -r {var} 2>/dev/null < "$d/{sub}/{index}"'
        for var, sub in (("g", "gids"), ("t", "gid_attrs/types"), ("n", "gid_attrs/ndevs"))
    )
    return (
        f"d={shlex.quote(path)}; s=0; while [ $s -lt {WAIT_SECONDS} ]; do g=; t=; n=; {reads}; "
        f'[ "$g|$t|$n" = {shlex.quote(expected)} ] && exit 0; sleep 1; s=$((s + 1)); done; '
        f"printf '%s\\n' {shlex.quote(problem)} >&2; {GidTables().command()}; exit 1"
    )


@operation()
def gid_index(ifname: str, address: str, index: int = 3):
    """
    Check that GID ``index`` of the RDMA device behind ``ifname`` is the RoCE v2 entry of
    ``address``: the entry NCCL_IB_GID_INDEX must name.

    + ifname: the fabric interface (the GID entries' ndev)
    + address: its IPv4 address, "192.168.100.10/24" or "192.168.100.10"
    + index: the GID index NCCL is told to use (roce_gid_index)

    This changes nothing on the host; it refuses to go on when the entry is wrong.

    The address is often configured by an earlier operation of the same deploy, and the
    kernel writes its GID entries just after the address appears. pyinfra runs this
    generator at prepare time (before anything changed) and again at execution, reading the
    table afresh each time, so:

    - entry right: nothing to do;
    - the address has entries, but ``index`` is not its RoCE v2 one: the kernel writes all
      of an address's entries at once, so waiting would not help: fail at once
      (OperationError) with the table, where the RoCE v2 entry is, and what to do;
    - the address has no entry yet (not configured yet, or just re-applied): yield a command
      that polls the entry for up to WAIT_SECONDS (15) and, if it never becomes right, prints the
      tables and exits non-zero, failing the host at execution. At prepare time this only
      shows as a change; at execution the fact is read again first, so the command runs only
      if the entry is still missing then (in the lab it was, right after ``nmcli connection
      up``, and appeared within a second).

    **Example:**

    .. code:: python

        roce.gid_index(ifname="enp1s0f1np1", address="192.168.100.10/24", index=3)
    """
    tables = host.get_fact(GidTables)
    ports = sorted(
        {(hca, e["port"]) for hca, table in tables.items() for e in table if e["ndev"] == ifname}
    )
    if len(ports) != 1:
        found = ", ".join(
            f"{hca}: {' '.join(sorted({e['ndev'] for e in entries}))}"
            for hca, entries in sorted(tables.items())
        )
        raise OperationError(
            f"{host.name}: expected one RDMA device port with {ifname} as its netdev, found "
            f"{len(ports)} ({found or f'no RDMA devices under {SYSFS}'}). Check that {ifname} "
            "is a ConnectX fabric interface and that its RDMA driver (mlx5_ib) is loaded."
        )
    hca, port = ports[0]
    entries = [e for e in tables[hca] if e["port"] == port]
    gid = ipv4_gid(address)
    expected = GidEntry(port=port, index=index, type="RoCE v2", ndev=ifname, gid=gid)
    where = f"GID index {index} of {hca} port {port}"
    if expected in entries:
        host.noop(f"{where} is the RoCE v2 entry of {address} on {ifname}")
        return

    if not any(e["gid"] == gid for e in entries):
        problem = (
            f"{host.name}: {where} did not become the RoCE v2 entry of {address} on {ifname} "
            f"within {WAIT_SECONDS} s. The GID tables ({' '.join(COLUMNS)}):"
        )
        path = f"{SYSFS}/{hca}/ports/{port}"
        yield _wait_command(path, index, f"{gid}|RoCE v2|{ifname}", problem)
        return

    v2 = [e["index"] for e in entries if e["gid"] == gid and e["type"] == "RoCE v2"]
    if v2:
        found = f"its RoCE v2 entry is at index {v2[0]}"
        todo = (
            f"If index {v2[0]} stays there across reboots and network restarts, set "
            f"roce_gid_index = {v2[0]} for {host.name} in the inventory; otherwise find what "
            f"takes the slots before it (other addresses on {ifname}: ip address show dev "
            f"{ifname}), remove it, and run again."
        )
    else:
        found = "it has no RoCE v2 entry"
        todo = f"Find out why the port has no RoCE v2 GID for {address} (RoCE v2 disabled?)."
    raise OperationError(
        f"{host.name}: {where} is not the RoCE v2 entry of {address} on {ifname}; {found}.\n"
        f"{format_table(entries)}\n"
        "NCCL_IB_GID_INDEX must name that entry on each node (a wrong index gave "
        f'"NCCL error: unhandled system error" in the field). {todo}'
    )

"""Verify the RoCE v2 GID entry NCCL selects on each fabric interface."""

from __future__ import annotations

import shlex
from ipaddress import IPv4Interface
from typing import TypedDict

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import util
from operations.asked import Question, answer, question
from spark import twin

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


def _wait_command(path: str, gid: str, ifname: str, problem: str) -> str:
    """Poll a port's table until some entry is the RoCE v2 entry of ``gid`` on ``ifname``,
    else print the tables and fail."""
    return (
        f"d={shlex.quote(path)}; s=0; while [ $s -lt {WAIT_SECONDS} ]; do "
        'for f in "$d"/gids/*; do i=${f##*/}; g=; t=; n=; read -r g < "$f"; '
        f'[ "$g" = {gid} ] || continue; read -r t < "$d/gid_attrs/types/$i"; '
        'read -r n < "$d/gid_attrs/ndevs/$i"; '
        f'[ "$t|$n" = {shlex.quote(f"RoCE v2|{ifname}")} ] && exit 0; done 2>/dev/null; '
        "sleep 1; s=$((s + 1)); done; "
        f"printf '%s\\n' {shlex.quote(problem)} >&2; {GidTables().command()}; exit 1"
    )


@operation()
def roce_v2_entry(ifname: str, address: str, expected_index: int = 3):
    """
    Check that the RDMA device port behind ``ifname`` has the RoCE v2 entry of ``address``,
    and no other IPv4 RoCE v2 entry on that interface: the entry NCCL selects itself.

    NCCL_IB_GID_INDEX is left unset: NCCL then takes the entry of the address family
    NCCL_IB_ADDR_FAMILY (AF_INET) and RoCE version NCCL_IB_ROCE_VERSION_NUM (2), wherever it
    is in the table (NVIDIA/nccl src/transport/net_ib/connect.cc, ncclIbGetGidIndex). The entry
    is at index 3 by NVIDIA's design (seed 001) but was seen at 4 on one box of two, where a
    fixed NCCL_IB_GID_INDEX=3 failed ("unhandled system error"; MiaAI-Lab/GLM-5.3-Flash-EXL3-
    2x-DGX-Sparks PR#26), and it can move after the addresses are re-applied (sparkring#186).

    + ifname: the fabric interface (the GID entries' ndev)
    + address: its IPv4 address, "192.168.100.10/24" or "192.168.100.10"
    + expected_index: where the entry should be (roce_gid_index): reported, not required

    This changes nothing on the host. The address is often configured by an earlier operation
    of the same deploy, and the kernel writes its entries just after it appears; pyinfra runs
    this generator when it prepares the run and again when it executes it, reading the table
    afresh each time, so:

    - one RoCE v2 entry for the address: nothing to do (the note says where it is);
    - the address has entries but none of RoCE v2, or the interface has another IPv4
      address's RoCE v2 entry (NCCL could take either): stop this box at once
      (``util.refused``) with the table and what to do;
    - the address has no entry yet: yield a command that polls the port for up to
      WAIT_SECONDS (15) and, if the entry never comes, prints the tables and fails the host.

    **Example:**

    .. code:: python

        roce.roce_v2_entry(ifname="enp1s0f1np1", address="192.168.100.10/24", expected_index=3)
    """
    tables = answer(GidTables)
    ports = sorted(
        {(hca, e["port"]) for hca, table in tables.items() for e in table if e["ndev"] == ifname}
    )
    if len(ports) != 1:
        found = ", ".join(
            f"{hca}: {' '.join(sorted({e['ndev'] for e in entries}))}"
            for hca, entries in sorted(tables.items())
        )
        yield from util.refused(
            f"{host.name}: expected one RDMA device port with {ifname} as its netdev, found "
            f"{len(ports)} ({found or f'no RDMA devices under {SYSFS}'}). Check that {ifname} "
            "is a ConnectX fabric interface and that its RDMA driver (mlx5_ib) is loaded."
        )
        return
    hca, port = ports[0]
    entries = [e for e in tables[hca] if e["port"] == port]
    gid = twin.ipv4_gid(address)
    where = f"{hca} port {port}"
    # The twin's IPv4 RoCE v2 entries, as compliance and the collector read them (spark/twin.py).
    ipv4 = twin.roce_v2_ipv4(entries, ifname)
    mine = str(IPv4Interface(address).ip)
    own = [index for index, ip in ipv4.items() if ip == mine]
    others = {index: ip for index, ip in ipv4.items() if ip != mine}
    if own and not others:
        index = own[0]
        if index == expected_index:
            host.noop(f"GID index {index} of {where} is the RoCE v2 entry of {address} on {ifname}")
        else:
            host.noop(
                f"GID index {index} of {where} is the RoCE v2 entry of {address} on {ifname},"
                f" not {expected_index} (roce_gid_index): NCCL selects it by address family"
            )
        return

    if not others and not any(e["gid"] == gid for e in entries):
        problem = (
            f"{host.name}: {where} has no RoCE v2 entry of {address} on {ifname} after "
            f"{WAIT_SECONDS} s. The GID tables ({' '.join(COLUMNS)}):"
        )
        yield _wait_command(f"{SYSFS}/{hca}/ports/{port}", gid, ifname, problem)
        return

    if others:
        addresses = ", ".join(f"{ip} at index {index}" for index, ip in others.items())
        found = f"{ifname} also has {addresses}"
        todo = (
            "NCCL picks one IPv4 RoCE v2 entry per device and could take the other one: remove "
            f"the other address (ip address show dev {ifname}) and run again."
        )
    else:
        found = f"{address} has no RoCE v2 entry"
        todo = f"Find out why the port has no RoCE v2 GID for {address} (RoCE v2 disabled?)."
    yield from util.refused(f"{host.name}: {where}: {found}.\n{format_table(entries)}\n{todo}")


def questions() -> list[Question]:
    """What ``roce_v2_entry`` reads (operations/asked.py)."""
    return [question(GidTables)]

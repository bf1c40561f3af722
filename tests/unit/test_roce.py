"""GidTables and roce.roce_v2_entry.

lab-gid-*.txt are real output of GidTables().command() on the lab host spark-2, whose GID
tables come from the lab's RoCE simulator (tests/simlab/hardware/simlab-rdma.py), not from a
ConnectX-7: lab-gid-no-ipv4.txt before any IPv4 address was on the fabric interfaces,
lab-gid-at-3.txt after 192.168.101.12/24 was put on enP2p1s0f1np1 with nmcli.
*.sample.txt are written by hand in the same format: gid-at-4.sample.txt is the simulator's
field-failure layout (ipv4_roce_v2_index 4: an unrelated RoCE v2 GID at 3) for 192.168.100.11;
gid-wrong-type-at-3.sample.txt has the RoCE v1 entry of 192.168.100.11 at 3, its v2 one at 2;
gid-two-ipv4.sample.txt is lab-gid-at-3.txt with a second address (192.168.101.99) on
enP2p1s0f1np1 at 4 and 5, as the kernel adds one.
The sysfs trees below are built in tmp_path to run the real shell commands against them.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from pyinfra.api.arguments import all_global_arguments

from operations import roce
from tests.unit.harness import FakeHost, captured, process, refusal, run_op

IPV4_101_12 = "0000:0000:0000:0000:0000:ffff:c0a8:650c"


def roce_v2_entry(output: str, **kwargs) -> tuple[list[str], list[str]]:
    host = FakeHost({roce.GidTables: output})
    return run_op(roce.roce_v2_entry, host=host, **kwargs), host.noops


def sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)


def fake_port(root: Path, hca: str, rows: dict[int, tuple[str, str, str]], size: int = 16) -> Path:
    """A sysfs port: `size` GIDs, zero unless in rows ({index: (gid, type, ndev)}). Unused
    entries' type and ndev are directories, so reading them fails as EINVAL does on sysfs."""
    port = root / hca / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    for index in range(size):
        write_entry(port, index, rows.get(index))
    return port


def write_entry(port: Path, index: int, row: tuple[str, str, str] | None) -> None:
    gid, kind, ndev = row or (roce.ZERO_GID, None, None)
    (port / "gids" / str(index)).write_text(gid + "\n")
    for sub, value in (("types", kind), ("ndevs", ndev)):
        path = port / "gid_attrs" / sub / str(index)
        if path.is_dir():
            path.rmdir()
        if value is None:
            path.unlink(missing_ok=True)
            path.mkdir()
        else:
            path.write_text(value + "\n")


# --- GidTables ---------------------------------------------------------------------------------


def test_fact_reads_entries_by_device() -> None:
    tables = process(roce.GidTables, captured("lab-gid-at-3.txt"))
    assert sorted(tables) == ["roceP2p1s0f1", "rocep1s0f1"]
    assert [e["index"] for e in tables["roceP2p1s0f1"]] == [0, 1, 2, 3]
    assert tables["roceP2p1s0f1"][3] == {
        "port": 1,
        "index": 3,
        "type": "RoCE v2",
        "ndev": "enP2p1s0f1np1",
        "gid": IPV4_101_12,
    }


def test_fact_without_rdma_is_empty() -> None:
    assert process(roce.GidTables, "") == {}
    assert roce.GidTables().default() == {}


def test_fact_command_lists_non_zero_entries_in_index_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(roce, "SYSFS", str(tmp_path))
    link_local = "fe80:0000:0000:0000:7447:e0ff:fe65:cf2e"
    fake_port(
        tmp_path,
        "rocep1s0f1",
        {
            0: (link_local, "IB/RoCE v1", "enp1s0f1np1"),
            1: (link_local, "RoCE v2", "enp1s0f1np1"),
            10: (IPV4_101_12, "RoCE v2", "enp1s0f1np1"),  # sorts before 2 in the shell glob
            2: (IPV4_101_12, "IB/RoCE v1", "enp1s0f1np1"),
        },
    )
    fake_port(tmp_path, "roceP2p1s0f1", {})
    result = sh(roce.GidTables().command())
    assert result.returncode == 0
    assert result.stderr == ""
    tables = process(roce.GidTables, result.stdout)
    assert list(tables) == ["rocep1s0f1"]
    assert [(e["index"], e["type"]) for e in tables["rocep1s0f1"]] == [
        (0, "IB/RoCE v1"),
        (1, "RoCE v2"),
        (2, "IB/RoCE v1"),
        (10, "RoCE v2"),
    ]


def test_fact_command_without_sysfs_prints_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(roce, "SYSFS", str(tmp_path / "absent"))
    result = sh(roce.GidTables().command())
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_format_table_aligns_columns() -> None:
    entries = process(roce.GidTables, captured("gid-at-4.sample.txt"))["rocep1s0f1"]
    lines = roce.format_table(entries).splitlines()
    assert lines[0].split() == ["index", "type", "ndev", "gid"]
    assert lines[5] == ("  4      RoCE v2     enp1s0f1np1  0000:0000:0000:0000:0000:ffff:c0a8:640b")
    assert len({line.index(":") for line in lines[1:]}) == 1  # the gid column lines up


# --- gid_index ---------------------------------------------------------------------------------


def test_arguments_are_not_taken_by_pyinfra() -> None:
    taken = {argument for argument, _ in all_global_arguments()}
    assert not taken & set(inspect.signature(roce.roce_v2_entry._inner).parameters)


def test_entry_where_expected_yields_nothing() -> None:
    commands, noops = roce_v2_entry(
        captured("lab-gid-at-3.txt"), ifname="enP2p1s0f1np1", address="192.168.101.12/24"
    )
    assert commands == []
    assert noops == [
        "GID index 3 of roceP2p1s0f1 port 1 is the RoCE v2 entry of 192.168.101.12/24 "
        "on enP2p1s0f1np1"
    ]


def test_entry_at_another_index_is_accepted_and_said() -> None:
    # NCCL, told no index, takes the IPv4 RoCE v2 entry at 4 and passes over the IPv6 one at 3.
    commands, noops = roce_v2_entry(
        captured("gid-at-4.sample.txt"), ifname="enp1s0f1np1", address="192.168.100.11/24"
    )
    assert commands == []
    assert noops == [
        "GID index 4 of rocep1s0f1 port 1 is the RoCE v2 entry of 192.168.100.11/24 on"
        " enp1s0f1np1, not 3 (roce_gid_index): NCCL selects it by address family"
    ]


def test_the_expected_index_is_only_what_the_note_compares_with() -> None:
    commands, noops = roce_v2_entry(
        captured("gid-at-4.sample.txt"),
        ifname="enp1s0f1np1",
        address="192.168.100.11",
        expected_index=4,
    )
    assert commands == []
    assert noops == [
        "GID index 4 of rocep1s0f1 port 1 is the RoCE v2 entry of 192.168.100.11 on enp1s0f1np1"
    ]


def test_the_v2_entry_is_found_past_a_v1_one() -> None:
    commands, noops = roce_v2_entry(
        captured("gid-wrong-type-at-3.sample.txt"),
        ifname="enp1s0f1np1",
        address="192.168.100.11/24",
    )
    assert commands == [] and noops[0].startswith("GID index 2 of rocep1s0f1 port 1 is the")


def test_address_without_roce_v2_entry_fails_with_the_table() -> None:
    # The wrong-type sample without its RoCE v2 line for the address.
    lines = captured("gid-wrong-type-at-3.sample.txt").splitlines()
    output = "\n".join(line for line in lines if not line.startswith("rocep1s0f1\t1\t2\t"))
    message = refusal(roce_v2_entry(output, ifname="enp1s0f1np1", address="192.168.100.11/24")[0])
    assert message.startswith(
        "spark-test: rocep1s0f1 port 1: 192.168.100.11/24 has no RoCE v2 entry."
    )
    assert "  3      IB/RoCE v1  enp1s0f1np1  0000:0000:0000:0000:0000:ffff:c0a8:640b" in message


def test_a_second_ipv4_address_on_the_twin_fails_naming_it() -> None:
    message = refusal(
        roce_v2_entry(
            captured("gid-two-ipv4.sample.txt"),
            ifname="enP2p1s0f1np1",
            address="192.168.101.12/24",
        )[0]
    )
    assert "enP2p1s0f1np1 also has 192.168.101.99 at index 5" in message
    assert "could take the other one" in message


@pytest.mark.parametrize(
    ("output", "found"),
    [
        (captured("lab-gid-at-3.txt"), "found 0 (roceP2p1s0f1: enP2p1s0f1np1, rocep1s0f1: enp"),
        ("", "found 0 (no RDMA devices under /sys/class/infiniband)"),
    ],
)
def test_no_device_for_the_interface_fails(output: str, found: str) -> None:
    assert re.search(
        re.escape(found),
        refusal(roce_v2_entry(output, ifname="enP7s7", address="10.77.0.12/24")[0]),
    )


def test_missing_entry_yields_a_bounded_wait() -> None:
    commands, noops = roce_v2_entry(
        captured("lab-gid-no-ipv4.txt"), ifname="enP2p1s0f1np1", address="192.168.101.12/24"
    )
    assert len(commands) == 1
    assert commands[0].startswith("d=/sys/class/infiniband/roceP2p1s0f1/ports/1; ")
    assert f'[ "$g" = {IPV4_101_12} ]' in commands[0]
    assert "'RoCE v2|enP2p1s0f1np1'" in commands[0]
    assert noops == []


# --- the wait command, run by sh against a fake sysfs ----------------------------------------


@pytest.fixture
def missing_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A port whose IPv4 entries are not there yet, and the wait command gid_index yields."""
    monkeypatch.setattr(roce, "SYSFS", str(tmp_path))
    monkeypatch.setattr(roce, "WAIT_SECONDS", 3)
    link_local = "fe80:0000:0000:0000:80ef:ffff:fe93:c3fa"
    port = fake_port(
        tmp_path,
        "roceP2p1s0f1",
        {
            0: (link_local, "IB/RoCE v1", "enP2p1s0f1np1"),
            1: (link_local, "RoCE v2", "enP2p1s0f1np1"),
        },
    )
    output = sh(roce.GidTables().command()).stdout
    commands, _ = roce_v2_entry(output, ifname="enP2p1s0f1np1", address="192.168.101.12/24")
    return port, commands[0]


def test_wait_succeeds_when_the_entry_appears(missing_entry: tuple[Path, str]) -> None:
    port, command = missing_entry

    def kernel_adds_the_address() -> None:
        time.sleep(1)
        write_entry(port, 4, (IPV4_101_12, "IB/RoCE v1", "enP2p1s0f1np1"))
        write_entry(port, 5, (IPV4_101_12, "RoCE v2", "enP2p1s0f1np1"))  # at 5: any index

    writer = threading.Thread(target=kernel_adds_the_address)
    writer.start()
    result = sh(command)
    writer.join()
    assert result.returncode == 0, result.stderr  # found: it ends before its 3 s run out


def test_wait_fails_with_the_tables_when_the_entry_never_comes(
    missing_entry: tuple[Path, str],
) -> None:
    port, command = missing_entry
    write_entry(port, 3, (IPV4_101_12, "IB/RoCE v1", "enP2p1s0f1np1"))  # wrong type
    result = sh(command)
    assert result.returncode == 1
    assert (
        "roceP2p1s0f1 port 1 has no RoCE v2 entry of 192.168.101.12/24 on enP2p1s0f1np1 after 3 s"
        in result.stderr
    )
    assert f"roceP2p1s0f1\t1\t3\tIB/RoCE v1\tenP2p1s0f1np1\t{IPV4_101_12}" in result.stdout

"""The check before pyinfra connects (stages/preconnect.py), pyinfra's own keys checked
(spark/inventory/load.py unknown_pyinfra_keys), and the real pyinfra CLI against boxes that do
not answer: the owner sees the typo, not "Could not connect"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pyinfra
import pytest
from pyinfra.api import Inventory, State
from pyinfra.context import ctx_inventory, ctx_state

from spark.inventory import load_from_dicts, unknown_pyinfra_keys
from stages import preconnect, settings
from stages.settings import pyinfra_keys

from .test_config import REPO, TWO_SPARKS, group_defaults, merged

# Keys of pyinfra 3.10's SSH connector (pyinfra/connectors/ssh.py connector_data_meta) and of
# its global arguments (pyinfra/api/arguments.py auth_argument_meta), as host data may set them.
SSH_USER, SUDO_PASSWORD, SUDO = "ssh_user", "_sudo_password", "_sudo"


def test_a_misspelt_pyinfra_key_is_refused_naming_the_nearest_known_one() -> None:
    data = {"ssh_usr": "nvidia", "_sudo_pasword": "hunter2", "ssh_port": 22, SUDO: True}

    problems = unknown_pyinfra_keys("spark-1", data, [SSH_USER, "ssh_port", SUDO_PASSWORD, SUDO])

    assert problems == [
        "spark-1: ssh_usr: unknown pyinfra key, which pyinfra would ignore; did you mean"
        f" {SSH_USER}?",
        "spark-1: _sudo_pasword: unknown pyinfra key, which pyinfra would ignore; did you mean"
        f" {SUDO_PASSWORD}?",
    ]
    assert "hunter2" not in "".join(problems)


def test_other_connectors_keys_and_spark_keys_are_not_pyinfra_keys_checked_here() -> None:
    data = {"docker_identifier": 1, "winrm_port": 1, "spark_role": "head", "fabric_mtu": 9000}

    assert unknown_pyinfra_keys("spark-1", data, [SSH_USER]) == []


def test_pyinfras_keys_from_its_own_definitions_pass_and_a_typo_is_listed_with_the_rest() -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-1"] |= {SSH_USER: "nvidia", SUDO: True, SUDO_PASSWORD: "hunter2"}
    assert load_from_dicts(hosts, pyinfra_keys()).head.name == "spark-1"

    hosts["spark-2"] |= {"ssh_usr": "nvidia", "fabric_mtu": "9000"}
    problem = settings.refusal(hosts, group_defaults())

    assert problem is not None
    assert (
        "spark-2: ssh_usr: unknown pyinfra key, which pyinfra would ignore; did you mean"
        f" {SSH_USER}?" in problem.splitlines()
    )
    assert "spark-2: fabric_mtu: Input should be a valid integer" in problem
    assert "hunter2" not in problem
    assert settings.refusal(merged(TWO_SPARKS), group_defaults()) is None


def test_box_data_is_each_boxs_data_as_pyinfra_gives_it() -> None:
    # The command line's data over the box's own, over its groups', over the group "all"'s
    # (pyinfra/api/host.py HostData), in the inventory's order (it derives addresses).
    read = Inventory(
        ([("spark-1", {"nccl_debug": True}), ("spark-2", {})], {"fabric_mtu": 9000}),
        spark=(["spark-2"], {"nccl_debug": False, "fabric_mtu": 1500}),
        override_data={"lanes": []},
    )
    boxes = preconnect.box_data(read)

    assert list(boxes) == ["spark-1", "spark-2"]
    assert boxes["spark-1"] == {"fabric_mtu": 9000, "nccl_debug": True, "lanes": []}
    assert boxes["spark-2"] == {"fabric_mtu": 1500, "nccl_debug": False, "lanes": []}


# An inventory of three boxes cabled as a ring, each with its management address (a ring's
# rendezvous goes there: tests/unit/test_topology.py MANAGEMENT).
RING = [
    (
        f"spark-{n}",
        {"spark_role": "head" if n == 1 else "worker", "management_address": f"10.0.0.2{n}"},
    )
    for n in (1, 2, 3)
]


def checked(tmp_path: Path, below: str, capsys: pytest.CaptureFixture[str], *data: str) -> str:
    """``check`` as pyinfra's CLI runs it, from this collection's group_data/all.py with
    ``below`` written after its call, over RING (`--data` ``data``): what it refused, "" when it
    let the run go on."""
    (tmp_path / "group_data").mkdir()
    text = (REPO / "group_data" / "all.py").read_text()
    (tmp_path / "group_data" / "all.py").write_text(f"{text}\n{below}\n")
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"spark = {RING!r}\n")
    command = click.Context(click.Command("pyinfra"))
    command.params |= {"inventory": str(inventory), "group_data": (), "data": data}
    run = State()
    run.cwd = str(tmp_path)
    reading = Inventory(([name for name, _ in RING], {}))  # pyinfra's, while it reads group_data
    with command, ctx_state.use(run), ctx_inventory.use(reading), pytest.MonkeyPatch.context() as m:
        m.setattr(pyinfra, "is_cli", True)
        try:
            preconnect.check()
        except SystemExit as stopped:
            assert stopped.code == 1
            return click.unstyle(capsys.readouterr().err)
    return ""


def test_a_value_written_below_the_check_is_checked_with_its_new_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 40: `fabric_topology = "ring3"` below the call was refused as "pair joins 2 boxes,
    # the inventory has 3": the check saw the value above it. Now every line counts.
    assert checked(tmp_path, 'fabric_topology = "ring3"', capsys) == ""


def test_a_bad_value_written_below_the_check_stops_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = checked(tmp_path, 'fabric_topology = "ring3"\nfabric_mtu = 100', capsys)
    for box in ("spark-1", "spark-2", "spark-3"):
        assert f"\n{box}: fabric_mtu: Input should be greater than or equal to 1500" in said
    assert "No box was contacted." in said


def test_the_command_lines_data_goes_over_all_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = checked(tmp_path, 'fabric_topology = "ring3"', capsys, "fabric_mtu=100")
    assert "\nspark-1: fabric_mtu: Input should be greater than or equal to 1500" in said


def test_check_outside_pyinfras_cli_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make plan` and compliance read the inventory through pyinfra's loader and validate it
    themselves, with their own way of saying so."""
    bad = Inventory(([("spark-1", {"spark_role": "head", "fabric_mtu": 100})], {}))
    monkeypatch.setattr(pyinfra, "is_cli", False)

    with ctx_inventory.use(bad):
        assert preconnect.check() is None


# --- the real pyinfra CLI, every box unreachable ---------------------------------------------


def closed_port() -> int:
    """A local TCP port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pyinfra_cli(
    inventory_file: Path, hosts: dict[str, dict[str, Any]], *args: str, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """`pyinfra -y INVENTORY deploy.py ARGS` over SSH to boxes at a port that refuses."""
    port = closed_port()
    reached = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_connect_retries": 0}
    boxes = [(name, reached | data) for name, data in hosts.items()]
    inventory_file.write_text(f"spark = {boxes!r}\n")
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(inventory_file), "deploy.py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"HOME": str(inventory_file.parent)},  # no known_hosts of this machine
    )


def test_with_every_box_down_the_typos_are_shown_not_the_connection(tmp_path: Path) -> None:
    bad = {name: dict(data) for name, data in TWO_SPARKS.items()}
    bad["spark-1"] |= {"ssh_usr": "nvidia", "_sudo_password": "hunter2"}
    bad["spark-2"]["fabric_adresses"] = bad["spark-2"].pop("fabric_addresses")

    run = pyinfra_cli(tmp_path / "inventory.py", bad)
    output = run.stdout + run.stderr

    assert run.returncode == 1
    assert "spark-1: ssh_usr: unknown pyinfra key, which pyinfra would ignore; did you mean" in (
        output
    )
    assert "spark-2: fabric_adresses: unknown key; did you mean fabric_addresses?" in output
    assert "No box was contacted." in output
    for absent in ("Connecting to hosts", "Could not connect", "No hosts remaining"):
        assert absent not in output
    assert "Traceback" not in output
    assert "pyinfra error in" not in output  # no "<file> line N" prefix
    assert "hunter2" not in output


def test_with_good_data_pyinfra_goes_on_to_connect(tmp_path: Path) -> None:
    """The counterpart: the check lets good data through, and pyinfra tries the boxes."""
    run = pyinfra_cli(tmp_path / "inventory.py", TWO_SPARKS)
    output = run.stdout + run.stderr

    assert "--> Connecting to hosts..." in output
    assert "[spark-1] Could not connect" in output
    assert "No box was contacted." not in output


def test_the_owners_inventory_started_elsewhere_stops_before_connecting(tmp_path: Path) -> None:
    """Elsewhere pyinfra reads no group_data/, so nothing checks the data: inventories/lab.py
    stops the run while it is read, naming the way out."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyinfra",
            "-y",
            str(REPO / "inventories" / "lab.py"),
            str(REPO / "deploy.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = run.stdout + run.stderr

    here = REPO.resolve()
    assert run.returncode == 1
    assert f"start pyinfra in {here} (cd there, or add --chdir {here})" in output
    assert "Connecting to hosts" not in output
    assert "Traceback" not in output


def test_the_command_lines_data_is_parsed_as_pyinfra_parses_it() -> None:
    """pyinfra 3.10 splits each `--data` at its first "=" and turns "true"/"false", numbers and
    JSON into values (pyinfra_cli/cli.py `_set_override_data`, pyinfra_cli/util.py
    `parse_cli_arg`); the override wins over the box's own data (pyinfra/api/host.py)."""
    command = click.Context(click.Command("pyinfra"))
    command.params["data"] = ("nccl_debug=false", "fabric_mtu=1500", 'lanes=[{"name": "a=b"}]')
    command.params["ssh_user"] = "nvidia"

    with command:
        given = preconnect.command_line_data()

    assert given == {
        "nccl_debug": False,
        "fabric_mtu": 1500,
        "lanes": [{"name": "a=b"}],
        "ssh_user": "nvidia",
    }


def test_a_typo_given_with_data_is_shown_before_connecting(tmp_path: Path) -> None:
    run = pyinfra_cli(tmp_path / "inventory.py", TWO_SPARKS, "--data", "fabric_mtu=100")
    output = run.stdout + run.stderr

    assert run.returncode == 1
    assert "spark-1: fabric_mtu: " in output
    assert "spark-2: fabric_mtu: " in output
    assert "No box was contacted." in output
    assert "Connecting to hosts" not in output


# --- a new user's slips (issue 37), every box unreachable --------------------------------------

MISSING_KEY = "/nonexistent/id_ed25519"


def test_a_limit_that_matches_no_box_is_refused_naming_the_boxes(tmp_path: Path) -> None:
    """pyinfra 3.10 only warns ("No host matches found for --limit pattern") and exits 0."""
    run = pyinfra_cli(tmp_path / "inventory.py", TWO_SPARKS, "--limit", "spark-2.local")
    output = run.stdout + run.stderr

    assert run.returncode == 1
    # Groups: the inventory file's `spark` and the file's own name (pyinfra_cli/inventory.py).
    assert (
        "--limit spark-2.local: no box or group of the inventory matches; the boxes: spark-1,"
        " spark-2 (groups: inventory, spark); give one of them"
    ) in output
    assert "No box was contacted." in output
    assert "Connecting to hosts" not in output


def test_a_limit_that_matches_a_box_goes_on_to_that_box_alone(tmp_path: Path) -> None:
    run = pyinfra_cli(tmp_path / "inventory.py", TWO_SPARKS, "--limit", "spark-2*")
    output = run.stdout + run.stderr

    assert "[spark-2] Could not connect" in output
    assert "[spark-1]" not in output
    assert "No box was contacted." not in output


def test_an_exclude_that_matches_no_box_is_refused(tmp_path: Path) -> None:
    """A misspelt --exclude would deploy the box meant to be left alone."""
    run = pyinfra_cli(tmp_path / "inventory.py", TWO_SPARKS, "--exclude", "spark-3")
    output = run.stdout + run.stderr

    assert run.returncode == 1
    assert "--exclude spark-3: no box or group of the inventory matches; the boxes:" in output
    assert "Connecting to hosts" not in output


def test_an_ssh_key_that_is_no_file_is_refused_without_a_traceback(tmp_path: Path) -> None:
    """pyinfra 3.10 accepts it and fails at connecting ("No such private key file"), a
    traceback per box; given with --key it goes over every box, as pyinfra applies it."""
    run = pyinfra_cli(tmp_path / "inventory.py", TWO_SPARKS, "--key", MISSING_KEY)
    output = run.stdout + run.stderr

    assert run.returncode == 1
    for box in TWO_SPARKS:
        assert (
            f"{box}: ssh_key: no file '{MISSING_KEY}' on this machine (nor under {REPO}); give"
            " the path of the private key that logs in to the box, e.g. ~/.ssh/id_ed25519"
            " (`ls ~/.ssh`), or leave ssh_key out: pyinfra then tries your SSH agent and"
            " ~/.ssh's keys"
        ) in output
    assert "Connecting to hosts" not in output
    assert "Traceback" not in output


def test_a_new_users_slips_are_all_shown_in_one_round(tmp_path: Path) -> None:
    """Five slips that took five rounds: each is shown the first time, none hides another."""
    slips = {
        "spark-1": TWO_SPARKS["spark-1"]
        | {"spark_role": "worker", "ssh_key": MISSING_KEY, "driver_version": "580.159.03"},
        "spark-2": TWO_SPARKS["spark-2"]
        | {"fabric_addresses": {"enp1s0f1np0": "192.168.100.11/24"}, "fabric_mtu": 1500},
    }

    run = pyinfra_cli(tmp_path / "inventory.py", slips, "--limit", "spark-2.local")
    output = run.stdout + run.stderr

    assert run.returncode == 1
    for slip in (
        "--limit spark-2.local: no box or group of the inventory matches",
        f"spark-1: ssh_key: no file '{MISSING_KEY}' on this machine",
        "spark-1: driver_version: 580.159.03 has no Debian revision",
        "spark-2: fabric_addresses: 'enp1s0f1np0' is not one of the box's twins",
        "spark-2: fabric_mtu: 1500 is below 9000",
        "spark-1, spark-2: spark_role: no host is the head; set spark_role = 'head' on exactly",
    ):
        assert slip in output
    assert "the inventory data has 5 problem(s)" in output
    assert "Connecting to hosts" not in output
    assert "Traceback" not in output

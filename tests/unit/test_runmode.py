"""The run modes a deploy of several boxes refuses (stages/runmode.py).

What each mode does is pyinfra 3.10's (api/operations.py run_ops): --serial runs every operation
on one host before the next host (_run_serial_ops), --no-wait runs each host through all its
operations on its own (_run_no_wait_ops), --parallel N runs each operation on batches of N hosts
one after the other (_run_single_op); the command line hands --serial and --no-wait to run_ops
only (pyinfra_cli/cli.py), and sets config.PARALLEL from --parallel, else to the inventory's
size (api/state.py State.init).
"""

from __future__ import annotations

import pytest
from pyinfra.api import Config, Inventory, State

from stages import runmode

SERIAL_NEEDS = "the cluster's operations need all 2 boxes of this run at each step"


def test_one_box_runs_in_any_mode() -> None:
    assert runmode.refusal(1, serial=True, no_wait=True, parallel=1) is None


def test_several_boxes_run_in_pyinfras_default_mode() -> None:
    assert runmode.refusal(2, serial=False, no_wait=False, parallel=2) is None
    assert runmode.refusal(3, serial=False, no_wait=False, parallel=40) is None


def test_serial_and_no_wait_are_refused_for_several_boxes_naming_the_way_out() -> None:
    serial = runmode.refusal(2, serial=True, no_wait=False, parallel=2)
    assert serial is not None
    assert serial.startswith("--serial runs every operation on one box before the next box")
    assert SERIAL_NEEDS in serial and serial.endswith(
        "run without it (or --limit one box); nothing was changed"
    )
    no_wait = runmode.refusal(2, serial=False, no_wait=True, parallel=2)
    assert no_wait is not None and no_wait.startswith("--no-wait runs each box through")


def test_a_parallel_below_the_boxes_is_refused() -> None:
    refused = runmode.refusal(3, serial=False, no_wait=False, parallel=2)
    assert refused is not None
    assert refused.startswith("--parallel 2 (or PARALLEL in config.py) runs each operation on 2")
    assert "run with --parallel 3 or more" in refused


@pytest.mark.parametrize(
    ("argv", "modes"),
    [
        (["-y", "inventories/lab.py", "deploy.py"], (False, False)),
        (["inventories/lab.py", "deploy.py", "--serial"], (True, False)),
        (["-y", "--no-wait", "inventories/lab.py", "deploy.py", "--limit", "x"], (False, True)),
        (["--dry", "inventories/lab.py", "deploy.py", "--serial", "--no-wait"], (True, True)),
    ],
)
def test_the_modes_are_read_as_pyinfras_command_line_parses_them(
    argv: list[str], modes: tuple[bool, bool]
) -> None:
    assert runmode.cli_modes(argv) == modes


def two_boxes(limit: list[str] | None = None) -> State:
    """A real pyinfra State of a two-box inventory (nothing connected), ``limit``: --limit."""
    inventory = Inventory((["spark-1", "spark-2"], {}))
    state = State()
    hosts = [inventory.get_host(name) for name in limit] if limit else None
    state.init(inventory, Config(), initial_limit=hosts)
    return state


def test_check_refuses_serial_for_two_boxes_and_not_for_one(monkeypatch) -> None:
    monkeypatch.setattr("pyinfra.is_cli", True)
    monkeypatch.setattr("sys.argv", ["pyinfra", "-y", "inv.py", "deploy.py", "--serial"])
    with pytest.raises(runmode.RunModeRefused, match=f"^--serial runs .*{SERIAL_NEEDS}"):
        runmode.check(two_boxes())
    runmode.check(two_boxes(limit=["spark-2"]))  # --limit spark-2: one box


def test_check_leaves_a_program_using_pyinfras_api_alone(monkeypatch) -> None:
    monkeypatch.setattr("pyinfra.is_cli", False)
    monkeypatch.setattr("sys.argv", ["pytest", "--serial"])
    runmode.check(two_boxes())

"""summary.py: the table of every box after a run, converged or where it stopped and why.

The failed operations' output here is what operations/util.refused prints for a lane whose port
is taken (lanes.serving, as tests/unit/test_lanes.py shows it), written by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyinfra.api.state import BaseStateCallback, StateStage

from stages import run_summary as summary
from tests.unit.harness import Box, run_state

TAKEN = (
    "spark-4: port 10101 of lane coder is taken by python3; stop that service or give the lane"
    " another port in group_data `lanes`"
)
LANE = "Lanes and front | Lane coder: qwen3-coder-next on port 10101"


def four_boxes(stage: StateStage = StateStage.Disconnect) -> SimpleNamespace:
    """A run of four boxes: spark-4 stopped at its lane, spark-3 not reached, spark-5 left out
    (--limit: never activated)."""
    run = run_state({"spark-4": (LANE, TAKEN), "spark-3": None}, current_stage=stage)
    spark_4, spark_3 = run.failed_hosts
    spark_1, spark_2, spark_5 = Box("spark-1"), Box("spark-2"), Box("spark-5")
    run.inventory = [spark_1, spark_2, spark_3, spark_4, spark_5]
    run.activated_hosts = {spark_1, spark_2, spark_4}  # spark-3: pyinfra could not connect
    return run


def test_every_box_of_the_run_converged_or_stopped_where_and_why() -> None:
    assert summary.outcomes(four_boxes()) == {
        "spark-1": "converged",
        "spark-2": "converged",
        "spark-3": "stopped at connecting: not reached (pyinfra's error above)",
        "spark-4": (
            "stopped at Lanes and front | Lane coder: qwen3-coder-next on port 10101: port 10101"
            " of lane coder is taken by python3; stop that service or give the lane another port"
            " in group_data `lanes`"
        ),
    }


def test_a_box_stopped_in_the_cluster_stage_converged_on_its_own() -> None:
    # spark-1 waits for spark-4 at the NCCL test (nccl.passed's words, by hand).
    nccl = "Cluster | NCCL test: NET/IB on every twin"
    waits = "spark-1: the NCCL test runs a rank on every box: it waits for spark-4, stopped at ..."
    run = run_state({"spark-1": (nccl, waits), "spark-4": (LANE, TAKEN)})
    run.inventory = run.activated_hosts = run.failed_hosts
    assert summary.outcomes(run) == {
        "spark-1": f"converged on its own; stopped at {nccl}: {waits.removeprefix('spark-1: ')}",
        "spark-4": f"stopped at {LANE}: {TAKEN.removeprefix('spark-4: ')}",
    }
    assert [summary.serving(run, box) for box in run.failed_hosts] == [True, False]


def test_the_table_aligns_the_boxes_names() -> None:
    rows = {"spark-1": "converged", "spark-10": "stopped at Cluster | Ray: no Ray"}
    assert summary.table(rows) == (
        "    spark-1   converged\n    spark-10  stopped at Cluster | Ray: no Ray"
    )


def test_the_table_is_printed_once_after_the_operations_ran(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = summary.RunSummary()
    for stage in (StateStage.Connect, StateStage.Prepare):  # nothing ran yet, or --dry
        report.host_disconnect(four_boxes(stage), Box("spark-1"))
    assert capsys.readouterr().err == ""
    run = four_boxes()
    report.host_disconnect(run, Box("spark-1"))
    report.host_disconnect(run, Box("spark-2"))  # the next box's disconnect: once is enough
    assert capsys.readouterr().err.splitlines() == [
        "--> Boxes:",
        "    spark-1  converged",
        "    spark-2  converged",
        "    spark-3  stopped at connecting: not reached (pyinfra's error above)",
        f"    spark-4  stopped at {LANE}: {TAKEN.removeprefix('spark-4: ')}",
    ]


def test_every_box_stopped_still_gets_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    # pyinfra ends the run with "No hosts remaining!" in the Execute stage and disconnects.
    said = TAKEN.replace("spark-4: ", "spark-1: ")
    run = run_state({"spark-1": (LANE, said)}, current_stage=StateStage.Execute)
    run.inventory = run.failed_hosts
    run.activated_hosts = set(run.failed_hosts)
    summary.RunSummary().host_disconnect(run, run.failed_hosts[0])
    assert capsys.readouterr().err.splitlines() == [
        "--> Boxes:",
        f"    spark-1  stopped at {LANE}: {TAKEN.removeprefix('spark-4: ')}",
    ]


def test_register_adds_one_handler_per_run() -> None:
    run = SimpleNamespace(callback_handlers=[BaseStateCallback()])
    run.add_callback_handler = run.callback_handlers.append
    summary.register(run)
    summary.register(run)  # deploy.py runs once per box
    assert [type(handler) for handler in run.callback_handlers] == [
        BaseStateCallback,
        summary.RunSummary,
    ]


def test_a_teardown_says_torn_down_where_a_deploy_says_converged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = SimpleNamespace(callback_handlers=[])
    run.add_callback_handler = run.callback_handlers.append
    summary.register(run, "torn down")  # teardown.py's words
    run.callback_handlers[0].host_disconnect(four_boxes(), Box("spark-1"))
    lines = capsys.readouterr().err.splitlines()
    assert lines[1:3] == ["    spark-1  torn down", "    spark-2  torn down"]
    assert lines[4] == f"    spark-4  stopped at {LANE}: {TAKEN.removeprefix('spark-4: ')}"

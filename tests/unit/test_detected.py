"""A run without -y asks each question once (stages/detected.py), with pyinfra's own machinery.

The host is pyinfra's local connector: commands run on this machine, in a temporary directory,
through pyinfra's own State, change detection, execution and callbacks, staged as pyinfra's CLI
stages a run (pyinfra_cli/cli.py: Connect, Prepare, Execute). Each question the fact below asks
appends a line to a log on the "box" as it runs there: the log counts what reached the box.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra.api import operation

from operations import asked
from tests.unit.local_run import Run, copy, text

# pyinfra's own reading, every answer asked: what detected.py is tested on here.
FRESH = {"fresh": True}


@operation()
def fails():
    yield "exit 3"


def test_pyinfra_alone_asks_every_question_again_at_execution(tmp_path: Path) -> None:
    # The premise: without the _if, detection and execution each read both files.
    run = Run(tmp_path, once=False)
    run.add(copy, src=run.path("a", "x"), dest=run.path("b", "x"), **FRESH)
    assert run.asked() == ["a", "b"]
    run.execute()
    assert run.asked() == ["a", "b"]


def test_found_unchanged_everything_is_asked_once(tmp_path: Path) -> None:
    run = Run(tmp_path)
    first = run.add(copy, src=run.path("a", "x"), dest=run.path("b", "x"), **FRESH)
    second = run.add(text, path=run.path("c", "y"), content="y", **FRESH)
    assert run.asked() == ["a", "b", "c"]  # detection
    run.execute()
    assert run.asked() == []
    assert first.did_succeed() and not first.did_change()
    assert second.did_succeed() and not second.did_change()


def test_after_a_change_the_operations_after_it_ask_again(tmp_path: Path) -> None:
    # Detection sees b equal to a; the first operation then changes a: the copy must read a
    # afresh and copy the new text, not trust what detection read.
    run = Run(tmp_path)
    changing = run.add(text, path=run.path("a", "old"), content="new", **FRESH)
    copied = run.add(copy, src=run.path("a"), dest=run.path("b", "old"), **FRESH)
    assert run.asked() == ["a", "a", "b"]
    run.execute()
    assert run.asked() == ["a", "a", "b"]
    assert changing.did_change() and copied.did_change()
    assert Path(run.path("b")).read_text() == "new"


def test_an_operation_found_changing_runs(tmp_path: Path) -> None:
    run = Run(tmp_path)
    unchanged = run.add(text, path=run.path("a", "x"), content="x", **FRESH)
    changing = run.add(text, path=run.path("b", "old"), content="new", **FRESH)
    assert run.asked() == ["a", "b"]
    run.execute()
    assert run.asked() == ["b"]  # the unchanged one before it is not asked again
    assert not unchanged.did_change() and changing.did_change()
    assert Path(run.path("b")).read_text() == "new"


def test_after_a_failed_operation_the_operations_after_it_ask_again(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.add_plain(fails, _ignore_errors=True)
    run.add(text, path=run.path("a", "x"), content="x", **FRESH)
    assert run.asked() == ["a"]
    run.execute()
    assert run.asked() == ["a"]


def test_once_a_box_failed_every_operation_asks_again(tmp_path: Path) -> None:
    # Another box of the run failed after this one was read (a cluster's operation reads which
    # boxes stopped): a stand-in for it in pyinfra's failed hosts.
    run = Run(tmp_path)
    run.add(text, path=run.path("a", "x"), content="x", **FRESH)
    assert run.asked() == ["a"]
    run.state.failed_hosts.add("spark-2")
    run.execute()
    assert run.asked() == ["a"]


def test_with_yes_there_is_no_detection_and_every_operation_runs(tmp_path: Path) -> None:
    run = Run(tmp_path, yes=True)
    meta = run.add(copy, src=run.path("a", "x"), dest=run.path("b", "old"), **FRESH)
    assert run.asked() == []  # -y: pyinfra detects nothing before it executes
    run.execute()
    assert run.asked() == ["a", "b"]
    assert meta.did_change() and Path(run.path("b")).read_text() == "x"


def test_registered_once_per_run(tmp_path: Path) -> None:
    run = Run(tmp_path)
    asked.register(run.state)
    assert sum(isinstance(h, asked.Asked) for h in run.state.callback_handlers) == 1

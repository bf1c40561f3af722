"""A stage's questions asked in one command, and answers given again only while nothing can have
changed them (operations/asked.py), with pyinfra's own machinery: a run on this machine through
pyinfra's local connector (tests/unit/local_run.py), each read logged on the "box" with the PID
of the shell that made it, so the log tells how many commands reached the box."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from pyinfra.api import FactBase, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_state

from operations import asked, front, lanes, preflight
from tests.unit.local_run import Read, Run, copy, text


@operation()
def read_twice(path: str, log: str):
    """Reads the same file twice, as an operation that looks again after a command would."""
    asked.answer(Read, path=path, log=log)
    asked.answer(Read, path=path, log=log)
    yield from ()


def ahead(run: Run, *names: str) -> None:
    """The stage says, as it is prepared, that its operations will read these files."""
    with ctx_state.use(run.state), ctx_host.use(run.host):
        asked.ahead(asked.question(Read, path=run.path(name), log=run.log) for name in names)


def test_without_a_stage_saying_ahead_each_read_is_its_own_command(tmp_path: Path) -> None:
    run = Run(tmp_path, yes=True)
    run.add(copy, src=run.path("a", "x"), dest=run.path("b", "x"))
    run.execute()
    assert run.commands() == [["a"], ["b"]]


def test_what_a_stage_said_ahead_is_asked_in_one_command(tmp_path: Path) -> None:
    run = Run(tmp_path, yes=True)
    ahead(run, "a", "b", "c")
    first = run.add(copy, src=run.path("a", "x"), dest=run.path("b", "x"))
    second = run.add(text, path=run.path("c", "y"), content="y")
    run.execute()
    assert run.commands() == [["a", "b", "c"]]
    assert not first.did_change() and not second.did_change()


def test_without_yes_detection_asks_once_and_execution_not_again(tmp_path: Path) -> None:
    run = Run(tmp_path, once=False)  # even without detected.py's _if
    ahead(run, "a", "b", "c")
    run.add(copy, src=run.path("a", "x"), dest=run.path("b", "x"))
    run.add(text, path=run.path("c", "y"), content="y")
    assert run.commands() == [["a", "b", "c"]]  # detection
    run.execute()
    assert run.commands() == []


def test_after_a_change_the_next_operation_reads_afresh(tmp_path: Path) -> None:
    # The group read a as "old"; the first operation writes "new" into a: the copy must read a
    # again and copy "new", not what the group read.
    run = Run(tmp_path, yes=True)
    ahead(run, "a", "b")
    changing = run.add(text, path=run.path("a", "old"), content="new")
    copied = run.add(copy, src=run.path("a"), dest=run.path("b", "old"))
    run.execute()
    assert run.commands() == [["a", "b"], ["a"], ["b"]]
    assert changing.did_change() and copied.did_change()
    assert Path(run.path("b")).read_text() == "new"


def test_a_change_found_in_detection_is_read_again_at_execution(tmp_path: Path) -> None:
    run = Run(tmp_path, once=False)
    ahead(run, "a", "b")
    run.add(text, path=run.path("a", "old"), content="new")
    run.add(copy, src=run.path("a"), dest=run.path("b", "old"))
    assert run.commands() == [["a", "b"]]
    run.execute()
    # The first operation is served what detection read (nothing executed yet); after its
    # change, the copy's first read asks the stage's questions afresh, in one command.
    assert run.commands() == [["a", "b"]]
    assert Path(run.path("b")).read_text() == "new"


def test_a_boxs_first_ask_brings_its_later_stages_questions(tmp_path: Path) -> None:
    # Two stages, nothing to change: one command for both.
    run = Run(tmp_path, yes=True)
    ahead(run, "a")
    ahead(run, "b", "c")
    run.add(text, path=run.path("a", "x"), content="x")
    run.add(copy, src=run.path("b", "y"), dest=run.path("c", "y"))
    run.execute()
    assert run.commands() == [["a", "b", "c"]]


def test_every_stage_said_before_detection_is_asked_in_one_command(tmp_path: Path) -> None:
    # deploy.py says every stage's questions before the first stage runs (test_stage_questions
    # pins it): change detection, which runs each operation as it is added, asks once.
    run = Run(tmp_path)
    ahead(run, "a")
    ahead(run, "b", "c")
    run.add(text, path=run.path("a", "x"), content="x")
    run.add(copy, src=run.path("b", "y"), dest=run.path("c", "y"))
    assert run.commands() == [["a", "b", "c"]]
    run.execute()
    assert run.commands() == []


def test_a_later_stage_after_a_change_asks_its_own_group_again(tmp_path: Path) -> None:
    # The first stage writes a: what the first command read of b and c is stale, so the second
    # stage asks its group again, in one command, and copies what b holds then.
    run = Run(tmp_path, yes=True)
    ahead(run, "a")
    ahead(run, "b", "c")
    run.add(text, path=run.path("a", "old"), content="new")
    copied = run.add(copy, src=run.path("b", "y"), dest=run.path("c", "old"))
    run.execute()
    assert run.commands() == [["a", "b", "c"], ["b", "c"]]
    assert copied.did_change() and Path(run.path("c")).read_text() == "y"


def test_a_group_asks_only_what_is_not_known_yet(tmp_path: Path) -> None:
    # A first stage writes a, then the next one (which said a and b) reads a again alone (its
    # first stage's group was asked), then its group asks b alone: a is known since the change.
    run = Run(tmp_path, yes=True)
    ahead(run, "a")
    ahead(run, "a", "b")
    run.add(text, path=run.path("a", "old"), content="new")
    run.add(copy, src=run.path("a"), dest=run.path("b", "old"))
    run.execute()
    assert run.commands() == [["a", "b"], ["a"], ["b"]]
    assert Path(run.path("b")).read_text() == "new"


def test_an_operation_reading_twice_gets_a_second_read(tmp_path: Path) -> None:
    run = Run(tmp_path, yes=True)
    ahead(run, "a")
    run.add(read_twice, path=run.path("a", "x"))
    run.execute()
    assert run.commands() == [["a"], ["a"]]


def test_an_answer_is_given_again_to_a_later_operation_while_nothing_changed(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, yes=True)
    run.add(text, path=run.path("a", "x"), content="x")
    run.add(text, path=run.path("a"), content="x")
    run.execute()
    assert run.commands() == [["a"]]


class Fails(FactBase):
    """A fact whose command fails after it logged its read (as Read logs it)."""

    def command(self, log: str) -> str:
        return f'echo "fails $$" >> {shlex.quote(log)}; exit 3'

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


@operation()
def reads_failing(log: str):
    asked.answer(Fails, log=log)
    yield from ()


def test_a_part_that_failed_is_asked_alone_as_pyinfra_asks_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(tmp_path, yes=True)
    with ctx_state.use(run.state), ctx_host.use(run.host):
        asked.ahead([asked.question(Fails, log=run.log)])
    run.add(reads_failing, _ignore_errors=True)  # else pyinfra fails the run's only host
    run.execute()
    assert run.commands() == [["fails"], ["fails"]]  # in the group, then alone
    assert "could not load fact: tests.unit.test_asked.Fails" in caplog.text  # pyinfra's words


def test_answers_parts_by_their_markers() -> None:
    # By hand: Answers' own output format for three parts: lines, a failure, a missing command.
    # Each part closes with a line break, then the marker: "one\ntwo" printed without a last line
    # break and "three\n\n" (one empty line of its own) read as pyinfra reads them alone.
    output = [
        *(f"{asked.MARK} 0", "one", "two", f"{asked.MARK} 0"),
        *(f"{asked.MARK} 1", "three", "", "", f"{asked.MARK} 0"),
        *(f"{asked.MARK} 2", "", f"{asked.MARK} 2"),
        *(f"{asked.MARK} 3", f"{asked.MARK} missing", "", f"{asked.MARK} 0"),
    ]
    assert asked.Answers().parts(output) == {
        0: asked.Part(("one", "two"), ""),
        1: asked.Part(("three", ""), ""),
        2: asked.Part((), "its command exited 2"),
        3: asked.Part((), "its command is missing"),
    }


def test_questions_are_keyed_whatever_the_argument_order_and_lists_as_tuples() -> None:
    assert asked.question(Read, path="p", log="l") == asked.question(Read, log="l", path="p")
    assert asked.question(Fails, log=["x"]) == (Fails, (("log", ("x",)),))


def test_a_success_not_recorded_yet_counts_as_a_change(tmp_path: Path) -> None:
    # pyinfra calls operation_host_success before OperationMeta.set_complete (operations.py).
    following = asked.Asked()
    following.done.append(OperationMeta("op", is_change=False))
    assert following.generation(Run(tmp_path).state) == 1


@pytest.mark.parametrize(("commands", "changes"), [([], 0), (["a command"], 1)])
def test_a_recorded_success_counts_as_a_change_when_it_ran_commands(
    tmp_path: Path, commands: list[str], changes: int
) -> None:
    following = asked.Asked()
    meta = OperationMeta("op", is_change=False)
    meta.set_complete(True, commands, CommandOutput([]))
    following.done.append(meta)
    assert following.generation(Run(tmp_path).state) == changes


def test_the_peers_pinged_are_each_twin_and_address_once() -> None:
    # By hand: two peers behind one twin, one of them listed twice (a ring names a box twice).
    peers = [("enp1", "spark-2", "10.0.0.2"), ("enp1", "spark-3", "10.0.0.3")]
    assert preflight.peer_pairs([*peers, peers[0]]) == (("enp1", "10.0.0.2"), ("enp1", "10.0.0.3"))


def test_a_lanes_files_are_its_environment_the_scripts_and_its_unit() -> None:
    assert lanes.lane_files("coder") == (
        "/etc/spark/lanes/coder.env",
        "/usr/local/sbin/spark-lane-turn",
        "/usr/local/sbin/spark-lane-canary",
        "/usr/local/sbin/spark-lane-bench",
        "/usr/local/sbin/spark-lane-ranks",
        "/etc/systemd/system/spark-lane-coder.service",
    )


def test_the_front_keys_only_the_lanes_with_a_key() -> None:
    fronted = [
        front.FrontLane("coder", 10101, 11101, key=True, timeout_s=3600),
        front.FrontLane("open", 1, 2, key=False, timeout_s=3600),
    ]
    assert front.keyed_lanes(fronted) == ("coder",)

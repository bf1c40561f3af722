"""Batched fact reads (operations/factcache.py) with pyinfra's own machinery on @local.

The hosts here are pyinfra's local connector: commands run on this machine, in a temporary
directory, through the same State, operations, callbacks and fact processing as on a lab host.
Round trips are counted at the connector, where a command leaves pyinfra.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyinfra import host
from pyinfra.api import Config, FactBase, Inventory, State, StringCommand, operation
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host
from pyinfra.operations import files as pyinfra_files

from operations import factcache


class FileText(FactBase):
    """A file's text, or None when it is absent (a line break is kept as pyinfra keeps it)."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


class Fails(FactBase):
    def command(self) -> str:
        return "echo partial; exit 3"


@operation()
def text(path: str, content: str):
    """The file holds exactly this text."""
    if host.get_fact(FileText, path=path) == content:
        host.noop(f"{path} is up to date")
        return
    yield f"printf %s {shlex.quote(content)} > {shlex.quote(path)}"


@operation()
def copy(src: str, dest: str):
    """dest holds src's text as it is when this operation runs."""
    wanted = host.get_fact(FileText, path=src) or ""
    if host.get_fact(FileText, path=dest) != wanted:
        yield f"printf %s {shlex.quote(wanted)} > {shlex.quote(dest)}"


@operation()
def follow(pointer: str, dest: str):
    """dest holds the text of the file whose path the pointer file holds (a fact that depends
    on another fact's answer)."""
    target = host.get_fact(FileText, path=pointer)
    wanted = (host.get_fact(FileText, path=target) if target else None) or ""
    if host.get_fact(FileText, path=dest) != wanted:
        yield f"printf %s {shlex.quote(wanted)} > {shlex.quote(dest)}"


@operation()
def write_then_copy(path: str, content: str, dest: str):
    """Writes path, then reads it back within the same operation and copies it to dest."""
    yield f"printf %s {shlex.quote(content)} > {shlex.quote(path)}"
    yield f"printf %s {shlex.quote(host.get_fact(FileText, path=path) or '')} > {dest}"


@operation()
def wait_until_ready(path: str):
    """Reads a fact in a loop (pyinfra's own style polls in a remote command instead)."""
    for _ in range(10_000):
        if host.get_fact(FileText, path=path) == "ready":
            return
    yield "false"


class Run:
    """One pyinfra run on @local with batched fact reads, staged as the CLI stages it."""

    def __init__(self, check_for_changes: bool):
        self.state = State(check_for_changes=check_for_changes)
        factcache.batch_fact_reads(self.state)
        self.inventory = Inventory((["@local"], {}))
        self.state.init(self.inventory, Config())
        self.state.set_stage(StateStage.Connect)
        connect_all(self.state)
        self.host = self.inventory.get_host("@local")
        self.sent: list[str] = []
        run_shell_command = self.host.connector.run_shell_command

        def counted(command, *args, **kwargs):
            self.sent.append(str(command))
            return run_shell_command(command, *args, **kwargs)

        self.host.connector.run_shell_command = counted
        self.state.set_stage(StateStage.Prepare)

    def add(self, op, **kwargs):
        return add_op(self.state, op, **kwargs)[self.host]

    def execute(self) -> None:
        self.state.set_stage(StateStage.Execute)
        run_ops(self.state)
        assert not self.state.failed_hosts


@pytest.fixture(autouse=True)
def opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batching is opt-in: these tests run with it on (the last two without)."""
    monkeypatch.setenv("SPARK_FACTCACHE", "on")


@pytest.fixture
def files(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "a").write_text("one")
    (tmp_path / "b").write_text("two")
    (tmp_path / "target").write_text("two")
    (tmp_path / "pointer").write_text(str(tmp_path / "target"))
    (tmp_path / "copy-of-b").write_text("two")
    yield tmp_path


def test_batch_answers_equal_what_each_command_answers_alone() -> None:
    run = Run(check_for_changes=False)
    commands = [
        "printf 'a\\nb\\n'",  # ends with a line break
        "printf 'a\\nb'",  # does not
        "printf 'a\\n\\n\\n'",  # empty lines at its end
        "printf '\\n'",
        "true",  # no output
        "echo out; echo err >&2; exit 3",  # fails, with output
        "echo '# a comment ends no subshell'  # like this one",
        "cat",  # reads its stdin: there is none, as for a single read
    ]
    alone = [run.host.run_shell_command(StringCommand(c)) for c in commands]
    marker = "m-1"
    status, output = run.host.run_shell_command(
        StringCommand(factcache.batch_script(commands, marker))
    )
    assert status
    answers = factcache.split_answers(output.stdout_lines, marker, len(commands))
    assert answers == [(0 if ok else 3, out.stdout_lines) for ok, out in alone]


def test_split_answers_refuses_output_it_cannot_account_for() -> None:
    assert factcache.split_answers(["x", "m 0"], "m", 2) is None
    assert factcache.split_answers(["m 0", "stray"], "m", 1) is None
    assert factcache.split_answers(["x", "m 0"], "m", 1) == [(0, ["x"])]


def test_a_no_change_run_asks_the_first_operation_then_the_rest_at_once(files: Path) -> None:
    run = Run(check_for_changes=False)  # -y: no change-detection pass
    ops = [
        run.add(text, path=str(files / "a"), content="one"),
        run.add(text, path=str(files / "b"), content="two"),
        run.add(follow, pointer=str(files / "pointer"), dest=str(files / "copy-of-b")),
    ]
    run.execute()
    first, rest, deeper = run.sent
    # The first round is careful (a bare host would change at once); the first operation
    # changes nothing, so the next round asks b, the pointer and copy-of-b in one script.
    assert str(files / "a") in first and str(files / "b") not in first
    assert all(str(files / name) in rest for name in ("b", "pointer", "copy-of-b"))
    # The target's path is known from the pointer's answer only: one more round.
    assert run.host.fact_answers.round_trips == 3
    assert deeper.startswith("(\n") and f"cat {files / 'target'} 2>/dev/null" in deeper
    assert not any(op.did_change() for op in ops)


def test_a_converged_template_is_checked_in_one_round_trip(tmp_path: Path) -> None:
    (tmp_path / "app.conf.j2").write_text("value={{ value }}\n")
    (tmp_path / "app.conf").write_text("value=1\n")
    run = Run(check_for_changes=False)
    src, dest = str(tmp_path / "app.conf.j2"), str(tmp_path / "app.conf")
    op = run.add(pyinfra_files.template, src=src, dest=dest, value=1)
    run.execute()
    assert not op.did_change()
    # File, the directory and Sha1File: one script, though Sha1File is read only once File
    # says the file exists.
    assert len(run.sent) == 1


def test_a_command_makes_later_reads_fresh(files: Path) -> None:
    run = Run(check_for_changes=False)
    run.add(text, path=str(files / "a"), content="changed")
    run.add(copy, src=str(files / "a"), dest=str(files / "c"))
    run.execute()
    # The first walk read "one" for a; the second operation saw what the first one wrote.
    assert (files / "c").read_text() == "changed"


def test_on_a_changing_host_each_walk_asks_only_up_to_the_next_change(files: Path) -> None:
    run = Run(check_for_changes=False)
    run.add(text, path=str(files / "a"), content="changed")
    run.add(copy, src=str(files / "a"), dest=str(files / "c"))
    run.execute()
    batch_a, write_a, batch_c, write_c = run.sent
    # Nothing asked about c before a changed: the answer would have been stale.
    assert str(files / "c") not in batch_a and str(files / "c") in batch_c
    assert write_a.startswith("printf %s changed") and write_c.startswith("printf %s changed")
    assert (files / "c").read_text() == "changed"


def test_a_host_being_converged_is_not_asked_ahead(files: Path) -> None:
    (files / "d").write_text("four")
    run = Run(check_for_changes=False)
    for name, content in (("a", "changed"), ("b", "two"), ("c", "new"), ("d", "four")):
        run.add(text, path=str(files / name), content=content)
    run.execute()
    # b is as wanted, but a changed before it: c and d are asked just before they run, not
    # ahead (c's write would have made d's early answer stale, asked twice).
    asked_d = [sent for sent in run.sent if sent.startswith("(\n") and "/d " in sent]
    write_c = next(i for i, sent in enumerate(run.sent) if sent.startswith("printf %s new"))
    assert len(asked_d) == 1 and run.sent.index(asked_d[0]) > write_c


def test_after_a_repair_the_unchanged_rest_is_asked_at_once(files: Path) -> None:
    run = Run(check_for_changes=True)  # the detection pass leaves answers the walks go by
    for name, content in (("a", "one"), ("b", "two"), ("copy-of-b", "two")):
        run.add(text, path=str(files / name), content=content)
    prepared = len(run.sent)
    (files / "a").write_text("drifted while the user read the plan")
    run.execute()
    _all_at_once, repair, batch_rest = run.sent[prepared:]
    assert repair.startswith("printf %s one")
    assert all(str(files / name) in batch_rest for name in ("b", "copy-of-b"))
    # Answers that came back as the detection pass left them settle their operations: the
    # walks ran each operation once, and a's again for its drift (3 + 1, then 2 after it).
    assert run.host.fact_answers.generator_runs == 6


def test_a_read_after_a_command_in_the_same_operation_is_fresh(files: Path) -> None:
    run = Run(check_for_changes=False)
    run.add(write_then_copy, path=str(files / "a"), content="new", dest=str(files / "d"))
    run.execute()
    assert (files / "d").read_text() == "new"


def test_execution_reads_afresh_what_change_detection_read(files: Path) -> None:
    run = Run(check_for_changes=True)
    op = run.add(text, path=str(files / "a"), content="one")
    assert op.will_change is False
    prepared = len(run.sent)
    (files / "a").write_text("drifted while the user read the plan")
    run.execute()
    assert (files / "a").read_text() == "one"
    # Everything the detection pass asked is asked again, at once, before the repair.
    batch, write = run.sent[prepared:]
    assert batch.startswith("(\ncat ") and write.startswith("printf %s one > ")


def test_answers_do_not_outlive_their_stage(files: Path) -> None:
    run = Run(check_for_changes=True)
    assert run.host.get_fact(FileText, path=str(files / "a")) == "one"
    (files / "a").write_text("two")
    run.state.set_stage(StateStage.Execute)
    assert run.host.get_fact(FileText, path=str(files / "a")) == "two"


def test_repeated_questions_are_asked_once_per_stage(files: Path) -> None:
    run = Run(check_for_changes=True)
    for _ in range(3):
        run.add(text, path=str(files / "a"), content="one")
    assert len(run.sent) == 1


def test_a_walk_gives_up_on_an_operation_that_polls_a_fact(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("ready")
    run = Run(check_for_changes=False)
    op = run.add(wait_until_ready, path=str(tmp_path / "state"))
    run.execute()
    # The first walk assumed the fact's default (never "ready") and gave up; once asked, the
    # answer lets the next round through.
    assert run.host.fact_answers.walks_cut == 1
    assert not op.did_change()


def test_another_hosts_operation_reads_this_host_as_pyinfra_does_even_mid_walk(
    files: Path,
) -> None:
    # A cluster's operation on one box reads the other boxes (operations/preflight.py
    # boxes_in_run): the other box's own greenlet may be walking meanwhile, which answers its
    # own reads from assumptions; the other operation's read must be the host's real answer.
    run = Run(check_for_changes=False)
    run.state.set_stage(StateStage.Execute)
    answers = run.host.fact_answers
    answers.walking = True  # this host's greenlet paused mid-walk (it awaits another host)
    other = Inventory((["@local"], {})).get_host("@local")  # another host's operation
    with ctx_host.use(other):
        assert run.host.get_fact(FileText, path=str(files / "a")) == "one"
    assert run.sent == [f"cat {files / 'a'} 2>/dev/null || true"]
    assert answers.answers == {} and answers.misses == {} and answers.reading == 0
    with ctx_host.use(run.host):  # this host's own walk: assumed, nothing sent
        assert run.host.get_fact(FileText, path=str(files / "a")) is None  # no output
    assert len(run.sent) == 1


def test_a_failing_fact_command_is_left_to_pyinfra(files: Path) -> None:
    run = Run(check_for_changes=False)
    answers = run.host.fact_answers
    key = factcache.key("echo partial; exit 3", {})
    answers.ask({key: ("echo partial; exit 3", {})})
    assert key in answers.failed and key not in answers.answers
    # Read as pyinfra reads it: its own command, its own failure (the only host fails).
    run.state.set_stage(StateStage.Execute)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        run.host.get_fact(Fails)
    assert run.sent[-1] == "echo partial; exit 3"
    assert run.host in run.state.failed_hosts


def one_by_one(files: Path) -> Run:
    run = Run(check_for_changes=False)
    run.add(text, path=str(files / "a"), content="one")
    run.add(text, path=str(files / "b"), content="two")
    run.execute()
    return run


PYINFRA_AS_IT_IS = ["cat {a} 2>/dev/null || true", "cat {b} 2>/dev/null || true"]


def test_by_default_pyinfra_is_left_alone(monkeypatch: pytest.MonkeyPatch, files: Path) -> None:
    monkeypatch.delenv("SPARK_FACTCACHE")
    run = one_by_one(files)
    assert not hasattr(run.host, "fact_answers")
    assert run.sent == [cmd.format(a=files / "a", b=files / "b") for cmd in PYINFRA_AS_IT_IS]


def test_another_pyinfra_release_turns_it_off(
    monkeypatch: pytest.MonkeyPatch, files: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(factcache.pyinfra, "__version__", "3.11.0")
    run = one_by_one(files)
    assert not hasattr(run.host, "fact_answers")
    assert run.sent == [cmd.format(a=files / "a", b=files / "b") for cmd in PYINFRA_AS_IT_IS]
    assert "SPARK_FACTCACHE=on ignored: batched fact reads are written for pyinfra 3.10.0," in (
        caplog.text
    )

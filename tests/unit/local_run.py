"""A run of pyinfra on this machine (its local connector), staged as pyinfra's CLI stages one
(pyinfra_cli/cli.py: Connect, Prepare, Execute), with a fact that logs every read on the "box":
the log counts what reached the box, and which reads came in one command."""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra.api import Config, FactBase, Inventory, State, operation
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import OperationMeta, add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage

from operations import asked
from stages import detected


class Read(FactBase):
    """A file's text ("" when absent); each time it is read, a line in ``log`` says so: the
    file's name and the PID of the shell that read it (``$$`` is the invoking shell's, also in a
    subshell: one PID, one command on the box)."""

    def command(self, path: str, log: str) -> str:
        return (
            f'echo "{shlex.quote(path)} $$" >> {shlex.quote(log)}; cat {shlex.quote(path)} || true'
        )

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


@operation()
def copy(src: str, dest: str, log: str, fresh: bool = False):
    """dest holds src's text as it is when this operation runs (``fresh``: every read asked, as
    pyinfra asks it; else through operations/asked.py)."""
    wanted = asked.answer(Read, fresh=fresh, path=src, log=log)
    if asked.answer(Read, fresh=fresh, path=dest, log=log) != wanted:
        yield f"printf %s {shlex.quote(wanted)} > {shlex.quote(dest)}"


@operation()
def text(path: str, content: str, log: str, fresh: bool = False):
    """The file holds exactly this text."""
    if asked.answer(Read, fresh=fresh, path=path, log=log) != content:
        yield f"printf %s {shlex.quote(content)} > {shlex.quote(path)}"


class Run:
    """One run on @local, staged as the CLI stages it: ``yes`` is -y (no change detection)."""

    def __init__(self, box: Path, yes: bool = False, once: bool = True):
        self.box = box
        self.log = str(box / "asked.log")
        self.state = State(check_for_changes=not yes)
        self.inventory = Inventory((["@local"], {}))
        self.state.init(self.inventory, Config())
        self.state.set_stage(StateStage.Connect)
        connect_all(self.state)
        self.host = self.inventory.get_host("@local")
        self.state.set_stage(StateStage.Prepare)
        asked.register(self.state)
        self.once = once

    def path(self, name: str, text: str | None = None) -> str:
        if text is not None:
            (self.box / name).write_text(text)
        return str(self.box / name)

    def add(self, op, **kwargs) -> OperationMeta:
        if self.once:
            kwargs["_if"] = [detected.still_to_run]
        return add_op(self.state, op, log=self.log, **kwargs)[self.host]

    def add_plain(self, op, **kwargs) -> OperationMeta:
        return add_op(self.state, op, **kwargs)[self.host]

    def asked(self) -> list[str]:
        """The paths the box was asked about so far, in order; the log starts afresh."""
        return [Path(path).name for path, _ in self.reads()]

    def commands(self) -> list[list[str]]:
        """What the box was asked so far, one list of file names per command; the log starts
        afresh."""
        commands: dict[str, list[str]] = {}
        for path, pid in self.reads():
            commands.setdefault(pid, []).append(Path(path).name)
        return list(commands.values())

    def reads(self) -> list[tuple[str, str]]:
        log = Path(self.log)
        lines = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return [tuple(line.rsplit(" ", 1)) for line in lines]

    def execute(self) -> None:
        self.state.set_stage(StateStage.Execute)
        run_ops(self.state)

"""A box's questions asked once: the facts a stage's operations read, asked in one command, and
each answer given again only while nothing of the run can have changed it.

pyinfra 3.10 keeps no fact cache: every ``host.get_fact`` runs its command
(pyinfra/api/facts.py ``_get_fact``), so a stage of ten operations, each reading its own facts,
asks a box a dozen commands even when it has nothing to change. Here:

- each stage lists which facts its operations will read on its box (its ``questions``; each
  operations module lists its own operations'), and deploy.py says every stage's, in stage
  order, before the first stage runs (``ahead``);
- the first of them an operation reads (``answer``, in place of ``host.get_fact``) asks all of
  them not known yet in one command (``Answers``: each fact's own command, parsed by the fact's own
  ``process``);
- an answer is given again only while no operation of the run has changed anything or failed,
  on any box, since it was read (``Asked.generation``, from pyinfra's state callbacks), and
  never twice to one operation in one pass (it may have changed what it reads since);
- otherwise, and for a question not said ahead, it is pyinfra's own ``host.get_fact``.

The first group a box is asked in a pass (change detection, execution) brings its later
stages' questions with it: a box with nothing to change is asked one command a pass. A stage
whose answers are stale by then (something changed since) asks its group again in one command;
once something changed, its operations ask what they read themselves, as pyinfra does. The rule
operations keep: they read before they yield (pyinfra runs a command as it is yielded), or what
they yielded cannot change what they read after it, or they ask it ``fresh``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import FactBase, State
from pyinfra.api.command import StringCommand
from pyinfra.api.host import Host
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import BaseStateCallback

# A fact class and its arguments (sorted; lists as tuples), as a stage says it ahead.
Question = tuple[type[FactBase], tuple[tuple[str, Any], ...]]
MARK = "--spark-asked"  # begins each part's lines of Answers' output


def question(fact: type[FactBase], **arguments: Any) -> Question:
    """A fact and its arguments, in the form a stage lists and a box's answers are kept by."""
    return fact, tuple(
        sorted(
            (name, tuple(value) if isinstance(value, list) else value)
            for name, value in arguments.items()
        )
    )


@dataclass(frozen=True)
class Part:
    """One fact's part of Answers' output: its lines, or why it must be asked alone."""

    lines: tuple[str, ...] = ()
    again: str = ""


class Answers(FactBase):
    """Several facts of one box in one command: each fact's own command in a subshell, after a
    marker line, its exit status in the marker line that closes its part (after a line break,
    which pyinfra's own reading of the lines would not see); each part parsed by
    its own fact's ``process`` (``default()`` for no output, as pyinfra does).

    A part that failed, whose command the box lacks (a fact's ``requires_command``) or whose
    parser raised is left out of the answer: the operation asks that fact alone, so pyinfra
    reports its failure, naming the fact, as it would have.
    """

    default = dict

    def command(self, questions: tuple[Question, ...]) -> StringCommand:
        self.facts: list[tuple[Question, FactBase]] = []
        pieces: list[Any] = []
        for index, (fact_cls, arguments) in enumerate(questions):
            fact = fact_cls()  # process() must be the same object's: some keep command()'s args
            self.facts.append(((fact_cls, arguments), fact))
            kwargs = dict(arguments)
            own = fact.command(**kwargs) if callable(fact.command) else fact.command
            needs = fact.requires_command
            needs = needs(**kwargs) if callable(needs) else needs
            if needs:
                own = StringCommand(
                    "if command -v", shlex.quote(needs), ">/dev/null 2>&1; then", own,
                    f"; else echo '{MARK} missing'; fi",
                )  # fmt: skip
            # The line break before the closing marker ends a last line printed without one.
            pieces += [
                f"echo '{MARK} {index}'; (",
                own,
                f') </dev/null; r=$?; echo; echo "{MARK} $r";',
            ]
        return StringCommand(*pieces, "true")

    def process(self, output: list[str]) -> dict[Question, Any]:
        parts = self.parts(output)
        answers: dict[Question, Any] = {}
        for index, (asked, fact) in enumerate(self.facts):
            part = parts.get(index, Part(again="no output"))
            try:
                if not part.again:
                    answers[asked] = (
                        fact.process(list(part.lines)) if part.lines else fact.default()
                    )
                    continue
                why = part.again
            except Exception as error:
                why = f"its output did not parse ({error})"
            logger.debug(f"Answers: {asked[0].__name__}{dict(asked[1])} to be asked alone: {why}")
        return answers

    def parts(self, output: list[str]) -> dict[int, Part]:
        """Each part's lines by its index, from the marker lines around it."""
        parts: dict[int, Part] = {}
        index, lines, missing = None, [], False
        for line in output:
            word = line.removeprefix(f"{MARK} ")
            if word == line:
                lines.append(line)
            elif word == "missing":
                missing = True
            elif index is None:
                index, lines, missing = int(word), [], False
            else:
                why = f"its command exited {word}" if word != "0" else ""
                lines = lines[:-1] if lines[-1:] == [""] else lines  # the marker's line break
                parts[index] = Part(tuple(lines), "its command is missing" if missing else why)
                index = None
        return parts


@dataclass(frozen=True)
class Answer:
    value: Any
    generation: int  # Asked.generation when it was read
    served: frozenset[tuple[bool, str, str | None]]  # given to: (pass, box, operation)


class Asked(BaseStateCallback):
    """What a run asked and what its execution did: the answers of each box, the questions its
    stages said ahead, and how many operations changed something or failed so far."""

    def __init__(self) -> None:
        self.done: list[OperationMeta] = []  # succeeded, not looked at yet
        self.changes = 0
        self.answers: dict[str, dict[Question, Answer]] = {}
        self.ahead: dict[str, list[tuple[Question, ...]]] = {}
        self.grouped: set[tuple[str, tuple[Question, ...], bool]] = set()

    def operation_host_success(
        self, state: State, host: Host, op_hash: str, retry_count: int = 0
    ) -> None:
        self.done.append(state.get_op_data_for_host(host, op_hash).operation_meta)

    def operation_host_error(
        self, state: State, host: Host, op_hash: str, retry_count: int = 0, max_retries: int = 0
    ) -> None:
        self.changes += 1

    def generation(self, run: State) -> int:
        """How many operations executed so far ran a command or failed, and boxes failed: an
        answer read at another generation may be stale. pyinfra calls operation_host_success
        before it records the operation's commands (OperationMeta.set_complete, in
        operations.py ``_run_host_op``): they are looked at here, later; one still unrecorded
        counts as a change."""
        while self.done:
            meta = self.done.pop()
            self.changes += not meta.is_complete() or meta.did_change()
        return self.changes + len(run.failed_hosts)

    def answer(self, run: State, box: Host, fact: type[FactBase], arguments: dict[str, Any]) -> Any:
        asked = question(fact, **arguments)
        now = self.generation(run)
        reader = (bool(run.is_executing), host.name, host.current_op_hash)
        known = self.answers.setdefault(box.name, {})
        kept = known.get(asked)
        if kept is not None and kept.generation == now and reader not in kept.served:
            known[asked] = Answer(kept.value, now, kept.served | {reader})
            return kept.value
        groups = self.ahead.get(box.name, ())
        group = next((group for group in groups if asked in group), None)
        if group is not None and (box.name, group, reader[0]) not in self.grouped:
            first = not any((box.name, other, reader[0]) in self.grouped for other in groups)
            self.grouped.add((box.name, group, reader[0]))
            # A box's first ask of a pass brings its later stages' questions along: while
            # nothing changes they find their answers here; a stage that finds them stale
            # (something changed since) asks its own group again.
            wanted = [*group, *(q for other in groups if first for q in other)]
            unknown = tuple(
                q for q in dict.fromkeys(wanted) if getattr(known.get(q), "generation", -1) != now
            )
            for other, value in box.get_fact(Answers, questions=unknown).items():
                known[other] = Answer(value, now, frozenset())
            if asked in known and known[asked].generation == now:
                kept = known[asked]
                known[asked] = Answer(kept.value, now, frozenset({reader}))
                return kept.value
        value = box.get_fact(fact, **arguments)
        known[asked] = Answer(value, now, frozenset({reader}))
        return value


def register(run: State) -> None:
    """Follow the run (call from deploy.py; once per run is kept)."""
    if following(run) is None:
        run.add_callback_handler(Asked())


def following(run: State) -> Asked | None:
    """This run's Asked, where register was called."""
    handlers = getattr(run, "callback_handlers", ())
    return next((handler for handler in handlers if isinstance(handler, Asked)), None)


def ahead(questions: Iterable[Question]) -> None:
    """Say which facts one of this box's stages will read (deploy.py says each stage's, in stage
    order, before the first runs): the first of them read asks them all."""
    asked = following(state)
    group = tuple(dict.fromkeys(questions))
    if asked is not None and group:
        asked.ahead.setdefault(host.name, []).append(group)


def answer(
    fact: type[FactBase], of: Host | None = None, fresh: bool = False, **arguments: Any
) -> Any:
    """What ``host.get_fact(fact, **arguments)`` answers (of another box: ``of``), asked with the
    stage's other questions or given again while nothing can have changed it; ``fresh``: asked
    now, as pyinfra asks it (an operation reading after it yielded what changes the answer)."""
    box = of or host
    asked = following(state)
    if asked is None or fresh:
        return box.get_fact(fact, **arguments)
    return asked.answer(state, box, fact, arguments)

"""Answer a host's fact reads from batched round trips instead of one SSH command each.

pyinfra 3.10 reads every fact with its own command, and reads them again when it executes
(its generators run twice, and there is no fact cache). On these hosts one command costs
about 40 ms (an SSH channel and a sudo session), so a deploy that changed nothing paid mostly
for round trips. ``batch_fact_reads(state)`` (called from config.py) changes only how the
questions travel, never what they are or how their answers are read:

- pyinfra builds each fact's command and processes its output as always; only the shell
  command a fact read sends is answered here, by its exact text and connector arguments;
- an answer is served only while no operation command (or upload) has run on that host since
  it was read, and only in the stage it was read in (the execution reads afresh what the
  change-detection pass read);
- before a host executes an operation that no walk has covered since the host last changed,
  the operations it will run next are walked through: their generators run as pyinfra runs
  them, a fact not answered yet reading as its last known answer (else its default), nothing
  logged or executed. The questions they ask go to the host in one script, one round trip.
  The walk stops after the first operation that, on real or last known answers, yields a
  command: what it changes would make later answers stale. Until an operation is found as
  wanted on a host nothing has changed in this stage, the walk is careful: it also stops after
  the first operation that yields on a default. On a host being converged, asking ahead would
  ask mostly what is about to change (and slow questions, such as pings over a fabric not yet
  up); a host found as wanted is asked everything at once. Each walk takes a few rounds: what
  the answers lead the operations to ask next. A question no walk foresaw is read singly, as
  pyinfra reads it.

It is opt-in: ``SPARK_FACTCACHE=on`` in the environment, and only on pyinfra
``PYINFRA_VERSION`` (the version it replaces parts of; on any other it says so once and leaves
pyinfra as it is). Without it, pyinfra runs as pyinfra runs.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import gevent
import pyinfra
from pyinfra import logger
from pyinfra.api import FactBase, State, StringCommand
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_host
from pyinfra.facts.files import File, Sha1File

Key = tuple[str, str]  # the command's text, its connector arguments
Question = tuple[Any, dict[str, Any]]  # the command as pyinfra passed it, its keyword arguments

MAX_ROUNDS = 4  # a walk's round trips; what is still unforeseen then is read singly
# Facts pyinfra reads next, with the same arguments, when the first one's answer is what a
# converged host gives: asked in the same script. files.put/template read File(dest), then
# Sha1File(dest) when the file exists (its command is harmless when it does not).
FOLLOW_UPS: dict[type[FactBase], tuple[type[FactBase], ...]] = {File: (Sha1File,)}
# An operation that reads facts in a Python loop until an answer changes would loop forever on
# a walk's assumed answers: its walk ends after this many reads.
MAX_WALK_READS = 500
# Arguments that change how a command is fed or read: such reads are left to pyinfra.
NOT_BATCHED = ("_stdin", "_get_pty")
DISPLAY_ONLY = ("print_output", "print_input")


def _text(command: Any) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def key(command: Any, kwargs: dict[str, Any]) -> Key:
    arguments = sorted((k, repr(v)) for k, v in kwargs.items() if k not in DISPLAY_ONLY)
    return _text(command), repr(arguments)


def batch_script(commands: Iterable[str], marker: str) -> str:
    """One shell script asking every command in turn, each in a subshell as ``sh -c`` would,
    each answer ended by a line "<marker> <exit status>" (after a newline, in case the output
    did not end with one)."""
    return "\n".join(
        f"(\n{command}\n) </dev/null; printf '\\n%s %s\\n' {marker} \"$?\"" for command in commands
    )


def split_answers(lines: list[str], marker: str, count: int) -> list[tuple[int, list[str]]] | None:
    """Each command's exit status and stdout lines, as pyinfra would have read them alone;
    None when the output does not hold exactly ``count`` answers."""
    answers: list[tuple[int, list[str]]] = []
    chunk: list[str] = []
    for line in lines:
        head, _, status = line.partition(" ")
        if head == marker and status.isdigit():
            # The newline before the marker leaves an empty line when the output ended with one.
            if chunk and chunk[-1] == "":
                chunk.pop()
            answers.append((int(status), chunk))
            chunk = []
        else:
            chunk.append(line)
    return answers if len(answers) == count and not chunk else None


class _WalkTooLong(Exception):
    """An operation read more facts during a walk than MAX_WALK_READS."""


def _output(lines: list[str]) -> CommandOutput:
    return CommandOutput([OutputLine("stdout", line) for line in lines])


def _walk_temp_filename(*args: Any, **kwargs: Any) -> str:
    return "/nonexistent/pyinfra-walk"


class HostAnswers:
    """The answers one host gave, and the wrappers that serve them to pyinfra's fact reads."""

    def __init__(self, state: State, host: Host):
        self.state = state
        self.host = host
        self.stage: StateStage | None = None
        self.answers: dict[Key, list[str]] = {}  # fresh: no command ran since, same stage
        self.last_known: dict[Key, list[str]] = {}  # what walks assume until asked again
        self.failed: set[Key] = set()  # non-zero in a batch: left to pyinfra's own error path
        self.walked: set[str] = set()  # operations a walk covered since the last command
        self.commands_ran = False  # on this host, in this stage
        self.calm = False  # nothing ran in this stage and an operation was found as wanted
        self.reading = 0  # facts being read (a fact's preconditions may read others)
        self.connector_calls = 0  # inside a real command: nested host calls are pyinfra's own
        self.walking = False
        self.misses: dict[Key, Question] = {}
        # What the walk assumed for the operation being walked, and whether a default was.
        self.assumed: dict[Key, list[str]] = {}
        self.guessed = False
        self.walk_reads = 0  # fact reads of the operation being walked
        self.walks_cut = 0  # operations whose walk ended at MAX_WALK_READS
        self.passing: set[gevent.Greenlet] = set()  # reading for another host's operation
        self.round_trips = 0  # batches sent
        self.generator_runs = 0  # operations run on walks
        self._get_fact = host.get_fact
        self._run_shell_command = host.run_shell_command

    def install(self) -> None:
        host = self.host
        host.get_fact = self.get_fact  # type: ignore[method-assign]
        host.run_shell_command = self.run_shell_command  # type: ignore[method-assign]
        for name in ("put_file", "get_file", "rsync"):
            setattr(host, name, self._forgetting(getattr(host, name)))

    # --- what pyinfra calls ---------------------------------------------------------------

    def get_fact(self, cls: Any, *args: Any, **kwargs: Any) -> Any:
        if ctx_host.get() not in (None, self.host):
            # Another host's operation reads this one (a cluster's operation reads every box):
            # read as pyinfra reads, neither answered nor counted here, whatever this host's
            # own greenlet is doing meanwhile (walking, reading, running a command).
            self.passing.add(gevent.getcurrent())
            try:
                return self._get_fact(cls, *args, **kwargs)
            finally:
                self.passing.discard(gevent.getcurrent())
        misses_before = len(self.misses)
        self.reading += 1
        try:
            value = self._get_fact(cls, *args, **kwargs)
        finally:
            self.reading -= 1
        if self.walking and len(self.misses) > misses_before:
            for follow_up in FOLLOW_UPS.get(cls, ()):
                self.get_fact(follow_up, *args, **kwargs)
        return value

    def run_shell_command(self, command: Any, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        if self.connector_calls or gevent.getcurrent() in self.passing:
            return self._run_shell_command(command, *args, **kwargs)
        if not self.reading:
            self.forget()  # an operation's command: what was read may have changed
            return self._call(self._run_shell_command, command, *args, **kwargs)
        return self._answer(command, args, kwargs)

    def _forgetting(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.forget()
            return self._call(method, *args, **kwargs)

        return call

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.connector_calls += 1
        try:
            return method(*args, **kwargs)
        finally:
            self.connector_calls -= 1

    # --- answers --------------------------------------------------------------------------

    def forget(self, host_changed: bool = True) -> None:
        self.last_known.update(self.answers)
        self.answers.clear()
        self.walked.clear()
        if host_changed:
            self.commands_ran, self.calm = True, False

    def sync_stage(self) -> None:
        if self.stage != self.state.current_stage:
            self.stage = self.state.current_stage
            self.forget(host_changed=False)
            self.commands_ran = self.calm = False

    def _answer(self, command: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[bool, Any]:
        self.sync_stage()
        question_key = key(command, kwargs)
        if question_key in self.answers:
            return True, _output(self.answers[question_key])
        batchable = args == () and not any(kwargs.get(name) for name in NOT_BATCHED)
        if self.walking:
            self.walk_reads += 1
            if self.walk_reads > MAX_WALK_READS:
                self.walks_cut += 1
                raise _WalkTooLong
            if batchable and question_key not in self.failed:
                self.misses.setdefault(question_key, (command, kwargs))
            # The last known answer, else the fact's default: see what the operation asks next.
            lines = self.last_known.get(question_key)
            if lines is None:
                lines, self.guessed = [], True
            self.assumed[question_key] = lines
            return True, _output(lines)
        status, output = self._call(self._run_shell_command, command, *args, **kwargs)
        if batchable and status:
            self.answers[question_key] = output.stdout_lines
        return status, output

    def ask(self, questions: dict[Key, Question]) -> None:
        """Every question in one script per set of connector arguments (one round trip each)."""
        groups: dict[str, dict[Key, Question]] = {}
        for question_key, question in questions.items():
            groups.setdefault(question_key[1], {})[question_key] = question
        for group in groups.values():
            marker = f"pyinfra-batch-{uuid.uuid4().hex}"
            commands = [command for command, _ in group.values()]
            first_kwargs = next(iter(group.values()))[1]
            kwargs = {k: v for k, v in first_kwargs.items() if k not in DISPLAY_ONLY}
            success = tuple(kwargs.pop("_success_exit_codes", None) or (0,))
            script = StringCommand(batch_script((_text(c) for c in commands), marker))
            self.round_trips += 1
            status, output = self._call(
                self._run_shell_command,
                script,
                print_output=self.state.print_fact_output,
                print_input=self.state.print_fact_input,
                **kwargs,
            )
            answers = split_answers(output.stdout_lines, marker, len(group)) if status else None
            for question_key, (code, lines) in zip(group, answers or [], strict=False):
                if code in success:
                    self.answers[question_key] = lines
                else:
                    self.failed.add(question_key)
            if answers is None:
                self.failed.update(group)

    # --- walking the operations to come -----------------------------------------------------

    def walk(self, op_hashes: list[str]) -> None:
        """Ask, in a few round trips, what the operations about to run on this host will ask.

        Each round runs the operations' generators (those not settled yet) and asks what they
        asked that has no fresh answer. An operation is settled once its path is known: every
        answer it read was fresh, or was asked and came back as the walk had assumed. The next
        round runs the others again: with fresh answers they may ask further (a fact that
        depends on another, or one read after an error that a default caused)."""
        self.sync_stage()
        settled: dict[str, bool] = {}  # whether it yields, for operations with a known path
        for _ in range(MAX_ROUNDS):
            self.misses = {}
            assumed: dict[str, tuple[bool, dict[Key, list[str]]]] = {}
            with self._walking():
                for op_hash in op_hashes:
                    self.walked.add(op_hash)
                    if op_hash in settled:
                        yields, sure = settled[op_hash], True
                    else:
                        self.assumed, self.guessed = {}, False
                        yields, sure = self._yields(op_hash), not self.guessed
                        if self.assumed:
                            assumed[op_hash] = (yields, self.assumed)
                        else:
                            settled[op_hash] = yields
                    if op_hash in settled and not yields and not self.commands_ran:
                        self.calm = True  # found as wanted: the host is likely converged
                    # A change foreseen on fresh or last known answers ends the walk.
                    if yields and (sure or not self.calm):
                        break
            if not self.misses:
                return
            self.ask(self.misses)
            for op_hash, (yields, answers) in assumed.items():
                if all(self.answers.get(k) == lines for k, lines in answers.items()):
                    settled[op_hash] = yields

    @contextmanager
    def _walking(self) -> Iterator[None]:
        """Generators run with nothing logged, and without a temporary file name: nothing is
        uploaded on a walk, and pyinfra keeps the TmpDir answer a name needs for the whole run
        (Host._get_temp_directory is memoized)."""
        logging_disabled = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        self.host.get_temp_filename = _walk_temp_filename  # type: ignore[method-assign]
        self.walking = True
        try:
            yield
        finally:
            self.walking = False
            del self.host.get_temp_filename
            logging.disable(logging_disabled)

    def _yields(self, op_hash: str) -> bool:
        """Whether the operation's generator yields a command. It runs to its end: facts read
        after a command are asked too (the command may come only from an assumed answer)."""
        generator = self.state.get_op_data_for_host(self.host, op_hash).command_generator()
        changes, self.walk_reads = False, 0
        self.generator_runs += 1
        try:
            for _command in generator:
                changes = True
        except Exception:
            pass  # a refusal or an error: it shows when pyinfra runs the operation
        finally:
            generator.close()
        return changes


class WalkBeforeOperations(BaseStateCallback):
    """Before a host executes an operation no walk covered since it last changed: walk."""

    @staticmethod
    def operation_host_start(state: State, host: Host, op_hash: str) -> None:
        answers = getattr(host, "fact_answers", None)
        if answers is None or state.current_stage != StateStage.Execute:
            return
        answers.sync_stage()
        if op_hash in answers.walked or host.executing_op_hash is not None:
            return  # covered, or a nested operation (its parent is running)
        order = state.get_op_order()
        ops = state.ops[host]
        answers.walk([h for h in order[order.index(op_hash) :] if h in ops])


# The pyinfra release whose get_fact, run_shell_command, put_file, get_temp_filename and
# State.init this module wraps; requirements.txt pins it.
PYINFRA_VERSION = "3.10.0"


def batch_fact_reads(state: State) -> None:
    """With SPARK_FACTCACHE=on, serve fact reads from batched answers on every host (call from
    config.py).

    pyinfra runs config.py before ``State.init()``, which makes the hosts' connectors and a
    fresh list of callback handlers: the wrappers and the handler are added right after it.
    """
    if os.environ.get("SPARK_FACTCACHE") != "on":
        return
    if pyinfra.__version__ != PYINFRA_VERSION:
        logger.warning(
            f"SPARK_FACTCACHE=on ignored: batched fact reads are written for pyinfra"
            f" {PYINFRA_VERSION}, this is {pyinfra.__version__}; facts are read one by one"
        )
        return
    init = state.init

    def init_then_install(*args: Any, **kwargs: Any) -> None:
        init(*args, **kwargs)
        for host in state.inventory:
            host.fact_answers = HostAnswers(state, host)  # type: ignore[attr-defined]
            host.fact_answers.install()  # type: ignore[attr-defined]
        state.add_callback_handler(WalkBeforeOperations())

    state.init = init_then_install  # type: ignore[method-assign]

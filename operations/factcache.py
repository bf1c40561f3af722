"""Answer a host's fact reads from a few batched round trips instead of one SSH command each.

pyinfra 3.10 reads every fact with its own command, and reads them again when it executes
(its generators run twice, and there is no fact cache). On these hosts one command costs
about 40 ms (an SSH channel and a sudo session), so a deploy that changes nothing paid mostly
for round trips. ``batch_fact_reads(state)`` (called from config.py) changes only how the
questions travel, never what they are or how their answers are read:

- pyinfra builds each fact's command and processes its output as always; only the shell
  command a fact read sends is answered here, by its exact text and connector arguments;
- an answer is served only while no operation command (or upload) has run on that host since
  it was read, and only within the stage it was read in (the execution stage reads afresh
  what the change-detection pass read);
- when a host is about to execute an operation and holds no fresh answers, the operations it
  will run next are walked through (their generators, as pyinfra runs them) to collect the
  questions they ask; those go in one script per round trip, as many rounds as the operations
  ask facts that depend on other facts (two for this deploy), and stop being walked after the
  first operation that will change the host (what it changes would make later answers stale).

``SPARK_FACTCACHE=off`` in the environment leaves pyinfra as it is.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from pyinfra.api import State, StringCommand
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra.connectors.util import CommandOutput, OutputLine

Key = tuple[str, str]  # the command's text, its connector arguments
Question = tuple[Any, dict[str, Any]]  # the command as pyinfra passed it, its keyword arguments

MAX_ROUNDS = 4  # a deploy whose facts depend on each other deeper just reads the rest singly
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
        self.answers: dict[Key, list[str]] = {}
        # Read singly while pyinfra detected changes: the execution's first walk re-asks them.
        self.prepared: dict[Key, Question] = {}
        self.failed: set[Key] = set()  # non-zero in a batch: left to pyinfra's own error path
        self.walked = False  # questions collected since the last command ran
        self.reading = 0  # facts being read (a fact's preconditions may read others)
        self.connector_calls = 0  # inside a real command: nested host calls are pyinfra's own
        self.walking = False
        self.misses: dict[Key, Question] = {}
        self.miss_count = 0
        self.round_trips = 0  # batches sent (what the unit tests and logs look at)
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
        self.reading += 1
        try:
            return self._get_fact(cls, *args, **kwargs)
        finally:
            self.reading -= 1

    def run_shell_command(self, command: Any, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        if self.connector_calls:
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

    def forget(self) -> None:
        self.answers.clear()
        self.walked = False

    def _sync_stage(self) -> None:
        if self.stage != self.state.current_stage:
            self.stage = self.state.current_stage
            self.forget()

    def _answer(self, command: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[bool, Any]:
        self._sync_stage()
        question_key = key(command, kwargs)
        if question_key in self.answers:
            return True, _output(self.answers[question_key])
        batchable = args == () and not any(kwargs.get(name) for name in NOT_BATCHED)
        if self.walking:
            self.miss_count += 1
            if batchable:
                self.misses.setdefault(question_key, (command, kwargs))
            return True, _output([])  # the fact's default: see what the operation asks next
        status, output = self._call(self._run_shell_command, command, *args, **kwargs)
        if batchable:
            if self.stage == StateStage.Prepare:
                self.prepared[question_key] = (command, kwargs)
            if status:
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
            kwargs = {
                k: v for k, v in next(iter(group.values()))[1].items() if k not in DISPLAY_ONLY
            }
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
        """Answer, in a few batches, what the operations about to run on this host will ask."""
        self._sync_stage()
        pending, self.prepared = self.prepared, {}
        settled: dict[str, bool] = {}
        for _ in range(MAX_ROUNDS):
            pending = {k: q for k, q in pending.items() if k not in self.failed}
            if pending:
                self.ask(pending)
            pending = self._collect(op_hashes, settled)
            if not pending:
                break
        self.walked = True

    def _collect(self, op_hashes: list[str], settled: dict[str, bool]) -> dict[Key, Question]:
        """The questions the operations ask that have no answer yet: each operation's generator
        runs as pyinfra runs it, unanswered facts reading as their defaults, nothing logged and
        nothing executed. An operation whose questions were all answered is settled (whether it
        yields a command is known, and answers only grow during a walk): it is not run again.
        The walk ends after the first settled operation that yields a command."""
        self.misses, self.walking = {}, True
        logging_disabled = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        # Nothing is uploaded on a walk: no temporary name, so no TmpDir read, whose answer
        # pyinfra would keep for the whole run (Host._get_temp_directory is memoized).
        self.host.get_temp_filename = _walk_temp_filename  # type: ignore[method-assign]
        try:
            for op_hash in op_hashes:
                if op_hash not in settled:
                    misses_before = self.miss_count
                    changes = self._run_generator(op_hash)
                    if self.miss_count == misses_before:
                        settled[op_hash] = changes
                if settled.get(op_hash):
                    break
        finally:
            del self.host.get_temp_filename
            logging.disable(logging_disabled)
            self.walking = False
        return {k: q for k, q in self.misses.items() if k not in self.answers}

    def _run_generator(self, op_hash: str) -> bool:
        """Whether the operation's generator yields a command (its facts as answered so far).
        It runs to its end: facts read after a command are asked too (rounds saved when that
        command was only a guess's)."""
        generator = self.state.get_op_data_for_host(self.host, op_hash).command_generator()
        changes = False
        try:
            for _command in generator:
                changes = True
        except Exception:
            pass  # a refusal or an error: it shows when pyinfra runs the operation
        finally:
            generator.close()
        return changes


class WalkBeforeOperations(BaseStateCallback):
    """Before a host executes an operation, unless its answers are fresh: walk what is left."""

    @staticmethod
    def operation_host_start(state: State, host: Host, op_hash: str) -> None:
        answers = getattr(host, "fact_answers", None)
        if answers is None or answers.walked or host.executing_op_hash is not None:
            return  # not ours, already walked, or a nested operation (its parent is running)
        if state.current_stage != StateStage.Execute:
            return
        order = state.get_op_order()
        ops = state.ops[host]
        answers.walk([h for h in order[order.index(op_hash) :] if h in ops])


def batch_fact_reads(state: State) -> None:
    """Serve fact reads from batched answers on every host (call from config.py).

    pyinfra runs config.py before ``State.init()``, which makes the hosts' connectors and a
    fresh list of callback handlers: the wrappers and the handler are added right after it.
    """
    if os.environ.get("SPARK_FACTCACHE") == "off":
        return
    init = state.init

    def init_then_install(*args: Any, **kwargs: Any) -> None:
        init(*args, **kwargs)
        for host in state.inventory:
            host.fact_answers = HostAnswers(state, host)  # type: ignore[attr-defined]
            host.fact_answers.install()  # type: ignore[attr-defined]
        state.add_callback_handler(WalkBeforeOperations())

    state.init = init_then_install  # type: ignore[method-assign]

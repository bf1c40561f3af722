"""Run our operations and facts against captured command output, without a host.

A fact is fed the real output its command printed on a host (captured into
tests/unit/captured/), through the fact's own ``process``; an operation is run
as pyinfra runs it (its generator) and the commands it yields are returned.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pyinfra.api import FactBase
from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Directory, File, Sha1File

CAPTURED = Path(__file__).parent / "captured"


def captured(name: str) -> str:
    """The text of one captured output file under tests/unit/captured/."""
    return (CAPTURED / name).read_text()


def process(fact_cls: type[FactBase], output: str) -> Any:
    """What a fact returns for this command output (as pyinfra hands it: lines)."""
    return fact_cls().process(output.splitlines())


class FakeHost:
    """Answers ``host.get_fact`` from command output given per fact class.

    ``outputs`` maps a fact class (or ``(fact class, args tuple)``) to the text its
    command printed; an unlisted fact is an error, so a test names every
    question the operation asks.
    """

    def __init__(
        self, outputs: dict[Any, str], data: dict[str, Any] | None = None, name: str = "spark-test"
    ):
        self.outputs = outputs
        self.noops: list[str] = []
        self.name = name
        self.data = data or {}
        # What pyinfra's files.put reads from its host while it runs.
        self.current_op_global_arguments: dict[str, Any] | None = None
        # Text of each file an operation uploaded, by remote path (see run_op).
        self.uploads: dict[str, str] = {}

    def get_fact(self, fact_cls: type[FactBase], *args: Any, **kwargs: Any) -> Any:
        key = (fact_cls, args + tuple(sorted(kwargs.items())))
        try:
            specific = key in self.outputs
        except TypeError:  # unhashable arguments (pyinfra's systemd facts take a list)
            specific = False
        if specific:
            output = self.outputs[key]
        elif fact_cls in self.outputs:
            output = self.outputs[fact_cls]
        else:
            raise AssertionError(f"unexpected fact {fact_cls.__name__}{args}{kwargs}")
        if output is None:
            return fact_cls().default()
        fact = fact_cls()
        # As pyinfra does: some facts (the file hash ones) keep their arguments in command().
        fact.command(*args, **kwargs)
        return fact.process(output.splitlines())

    def noop(self, description: str) -> None:
        self.noops.append(description)

    def log(self, message: str, log_func: Callable[[str], Any] | None = None) -> None:
        pass

    def get_temp_filename(self, *args: Any, **kwargs: Any) -> str:
        return "/tmp/pyinfra-test"


# The part of pyinfra's State that files.put and files.template read.
FAKE_STATE = SimpleNamespace(cwd=None, inventory=None, config=SimpleNamespace(DIFF=False))


def run_of(*hosts: FakeHost, failed: tuple[str, ...] = ()) -> SimpleNamespace:
    """The part of pyinfra's State a cluster's operations read about the run: its hosts (the
    inventory's active ones: connected, not failed), the names of those that failed, and what
    files.put reads (FAKE_STATE). A box in neither is one the run leaves out (--limit)."""
    return SimpleNamespace(
        inventory=SimpleNamespace(get_active_hosts=lambda: list(hosts)),
        failed_hosts=[SimpleNamespace(name=name) for name in failed],
        cwd=FAKE_STATE.cwd,
        config=FAKE_STATE.config,
    )


def file_facts(files: dict[str, str | None]) -> dict[Any, str | None]:
    """FakeHost outputs for the facts files.put/files.template read about these remote files.

    A path maps to its text (a root:root 0644 file in a root:root 0755 directory, as the
    captured stat lines show) or to None (absent; its directory exists). host-stat-*.txt are
    pyinfra's own File and Directory fact commands run on the development machine (Debian 12)
    for /etc/debian_version and /etc/apt: only their format and owner and mode matter here.
    """
    outputs: dict[Any, str | None] = {}
    for path, text in files.items():
        outputs[(Directory, (("path", posixpath.dirname(path)),))] = captured(
            "host-stat-dir-root-0755.txt"
        )
        if text is None:
            outputs[(File, (("path", path),))] = None
            outputs[(Directory, (("path", path),))] = None
        else:
            outputs[(File, (("path", path),))] = captured("host-stat-file-root-0644.txt")
            # sha1sum's own line format: "<hex>  <path>".
            outputs[(Sha1File, (("path", path),))] = (
                f"{hashlib.sha1(text.encode()).hexdigest()}  {path}"
            )
    return outputs


def run_op(op: Callable, *args: Any, host: FakeHost, **kwargs: Any) -> list[str]:
    """The commands an operation yields on this fake host, as strings."""
    commands = []
    state = nullcontext() if ctx_state.isset() else ctx_state.use(FAKE_STATE)
    with ctx_host.use(host), state:
        for command in op._inner(*args, **kwargs):
            if isinstance(command, StringCommand):
                command = command.get_raw_value()
            elif isinstance(command, FileUploadCommand):
                src = command.src
                host.uploads[command.dest] = (
                    src.getvalue() if hasattr(src, "getvalue") else Path(src).read_text()
                )
            commands.append(command if isinstance(command, str) else repr(command))
    return commands

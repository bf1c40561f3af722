"""Run our operations and facts against captured command output, without a host.

A fact is fed the real output its command printed on a host (captured into
tests/unit/captured/), through the fact's own ``process``; an operation is run
as pyinfra runs it (its generator) and the commands it yields are returned.
"""

from __future__ import annotations

import hashlib
import posixpath
import shutil
import subprocess
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from pyinfra.api import FactBase
from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Directory, File, Sha1File

from operations.util import RootFiles
from tests.conftest import must_run_lab

CAPTURED = Path(__file__).parent / "captured"


def needs(missing: list[str]) -> None:
    """Skip a test for what this machine lacks, but fail it where every test must run (root or
    CI, tests/conftest.py): `make test` installs it first (tests/simlab/rootfs.py HOST_TOOLS,
    HOST_MODULES), so a fresh machine skips nothing."""
    if missing:
        said = f"needs {', '.join(missing)}: as root, `make test` installs them (HOST_TOOLS)"
        if must_run_lab():
            pytest.fail(said)
        pytest.skip(said)


def needs_tools(*tools: str) -> None:
    needs([tool for tool in tools if not shutil.which(tool)])


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
        self.logs: list[str] = []  # what the operation logs (host.log)
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
        self.logs.append(message)

    def get_temp_filename(self, *args: Any, **kwargs: Any) -> str:
        return "/tmp/pyinfra-test"


# The part of pyinfra's State that files.put and files.template read, and operations/util's
# refused and missing (whether the operations are running; no box failed).
FAKE_STATE = SimpleNamespace(
    cwd=None, inventory=None, config=SimpleNamespace(DIFF=False), is_executing=True, failed_hosts=[]
)


def refusal(commands: list[str]) -> str:
    """What an operation that stopped its box (operations/util's refused) said: its one command,
    run here by sh, must print it on stderr alone and exit 1, as a failed command on the box."""
    assert len(commands) == 1, commands
    done = subprocess.run(["sh", "-c", commands[0]], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (1, ""), done
    return done.stderr.removesuffix("\n")


class Box(NamedTuple):
    """A stand-in for pyinfra's Host where only its name is read (hashable, as a Host)."""

    name: str


def run_state(
    stopped: dict[str, tuple[str, str] | None] | None = None, **attributes: Any
) -> SimpleNamespace:
    """FAKE_STATE with ``attributes`` and the part of pyinfra's State a run's failed boxes are
    read from: each box of ``stopped`` failed, at an operation of this name whose failed command
    printed this on stderr, or (None) before any operation (pyinfra could not connect). Ops are
    keyed by pyinfra's Host objects, here by Box stand-ins, found through ``failed_hosts``."""
    failed, ops, names = [], {}, {}
    for index, (name, where) in enumerate((stopped or {}).items()):
        box = Box(name)
        failed.append(box)
        ops[box] = {}
        if where is not None:
            op_name, stderr = where
            meta = OperationMeta(f"op{index}", is_change=True)
            lines = [OutputLine("stderr", line) for line in stderr.splitlines()]
            meta.set_complete(False, ["a command"], CommandOutput(lines))
            ops[box][f"op{index}"] = SimpleNamespace(operation_meta=meta)
            names[f"op{index}"] = SimpleNamespace(names={op_name})
    return SimpleNamespace(
        **vars(FAKE_STATE)
        | {
            "failed_hosts": failed,
            "ops": ops,
            "get_op_order": lambda: list(names),
            "get_op_meta": names.__getitem__,
        }
        | attributes
    )


def run_of(
    *hosts: FakeHost, stopped: dict[str, tuple[str, str] | None] | None = None
) -> SimpleNamespace:
    """The part of pyinfra's State a cluster's operations read about the run: its hosts (the
    inventory's active ones: connected, not failed), the boxes failed in it and where they
    stopped (``stopped``, as run_state takes it). A box in neither is one the run leaves out
    (--limit)."""
    return run_state(stopped, inventory=SimpleNamespace(get_active_hosts=lambda: list(hosts)))


def file_facts(files: dict[str, str | None]) -> dict[Any, str | None]:
    """FakeHost outputs for the facts operations/util's put and template, and files.put and
    files.template behind them, read about these remote files.

    A path maps to its text (a root:root 0644 file in a root:root 0755 directory, as the
    captured stat lines show) or to None (absent; its directory exists). host-stat-*.txt are
    pyinfra's own File and Directory fact commands run on the development machine (Debian 12)
    for /etc/debian_version and /etc/apt: only their format and owner and mode matter here;
    RootFiles is answered, whichever of these paths it is asked about, in the format of
    host-rootfiles-debian-version-apt.txt (its command run there for /etc/debian_version and
    /etc/apt): "<path><tab><owner> <group> <mode> <sha1>", or "<path><tab>-".
    """
    outputs: dict[Any, str | None] = {
        RootFiles: "\n".join(
            f"{path}\t-" if text is None
            else f"{path}\troot root 644 {hashlib.sha1(text.encode()).hexdigest()}"
            for path, text in files.items()
        )
    }  # fmt: skip
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

"""Run our operations and facts against captured command output, without a host.

A fact is fed the real output its command printed on a host (captured into
tests/unit/captured/), through the fact's own ``process``; an operation is run
as pyinfra runs it (its generator) and the commands it yields are returned.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyinfra.api import FactBase
from pyinfra.api.command import StringCommand
from pyinfra.context import ctx_host

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

    def __init__(self, outputs: dict[Any, str], data: dict[str, Any] | None = None):
        self.outputs = outputs
        self.noops: list[str] = []
        self.name = "spark-test"
        self.data = data or {}

    def get_fact(self, fact_cls: type[FactBase], *args: Any, **kwargs: Any) -> Any:
        key = (fact_cls, args + tuple(sorted(kwargs.items())))
        if key in self.outputs:
            output = self.outputs[key]
        elif fact_cls in self.outputs:
            output = self.outputs[fact_cls]
        else:
            raise AssertionError(f"unexpected fact {fact_cls.__name__}{args}{kwargs}")
        if output is None:
            return fact_cls().default()
        return process(fact_cls, output)

    def noop(self, description: str) -> None:
        self.noops.append(description)


def run_op(op: Callable, *args: Any, host: FakeHost, **kwargs: Any) -> list[str]:
    """The commands an operation yields on this fake host, as strings."""
    commands = []
    with ctx_host.use(host):
        for command in op._inner(*args, **kwargs):
            if isinstance(command, StringCommand):
                command = command.get_raw_value()
            commands.append(command if isinstance(command, str) else repr(command))
    return commands

"""The pyinfra run modes a deploy of several boxes refuses, before any operation reaches a box.

pyinfra 3.10 runs the operations in one of three ways (api/operations.py run_ops): by default
each operation on every box before the next one starts; with ``--serial`` every operation on
one box before the next box starts; with ``--no-wait`` every box through all its operations
on its own. ``--parallel N`` (config PARALLEL) runs each operation on N boxes at a time, one
batch after the other. The cluster's operations need every box at each step: the fabric check
pings the other boxes' twins (configured the step before on each), the NCCL test runs a rank on
every box at once, the head serves the model while the others copy it, a cluster lane's ranks
join each other. So with more than one box in the run only the default way is right. A run of
one box (``--limit``) runs the same whatever the mode. ``--dry`` and the run without ``-y``
read every box before changing any (pyinfra's change detection) and are allowed.
"""

from __future__ import annotations

import sys

import pyinfra
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import State
from pyinfra_cli.cli import cli


class RunModeRefused(PyinfraError):
    """A run mode this deploy refuses, shown by pyinfra as its own error (no traceback)."""


def refusal(boxes: int, serial: bool, no_wait: bool, parallel: int) -> str | None:
    """Why a run of ``boxes`` boxes in this mode would leave the cluster half done; None: it
    runs right."""
    if boxes < 2:
        return None
    needs = (
        f"the cluster's operations need all {boxes} boxes of this run at each step (the fabric"
        " check pings the other boxes' twins, the NCCL test runs a rank on every box at once,"
        " the cluster lane's ranks join each other)"
    )
    way_out = "run without it (or --limit one box); nothing was changed"
    if serial:
        return (
            "--serial runs every operation on one box before the next box starts:"
            f" {needs}: {way_out}"
        )
    if no_wait:
        return f"--no-wait runs each box through its operations on its own: {needs}: {way_out}"
    if parallel < boxes:
        return (
            f"--parallel {parallel} (or PARALLEL in config.py) runs each operation on {parallel}"
            f" box(es) at a time, one batch after the other: {needs}: run with --parallel"
            f" {boxes} or more (or --limit one box); nothing was changed"
        )
    return None


def cli_modes(argv: list[str]) -> tuple[bool, bool]:
    """(--serial, --no-wait) as pyinfra's own command line parses ``argv``: pyinfra 3.10 hands
    them to run_ops only (pyinfra_cli/cli.py), keeping them nowhere a deploy file could read."""
    params = cli.make_context("pyinfra", argv, resilient_parsing=True).params
    return bool(params["serial"]), bool(params["no_wait"])


def check(state: State) -> None:
    """Refuse this run when its mode would leave the cluster half done (``refusal``). Only the
    pyinfra command line has such modes: a program calling pyinfra's API runs its own way."""
    if not pyinfra.is_cli:
        return
    serial, no_wait = cli_modes(sys.argv[1:])
    boxes = sum(1 for box in state.inventory if state.is_host_in_limit(box))
    if reason := refusal(boxes, serial, no_wait, state.config.PARALLEL):
        raise RunModeRefused(reason)

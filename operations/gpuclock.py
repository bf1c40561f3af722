"""Lock the GPU's graphics clock at every boot, against GB10 power-offs under long prefills."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from files.spark_metrics import clock_journal_command, locked_clocks
from operations import util
from operations.asked import Question, answer, question
from spark.box_paths import GPU_CLOCK_UNIT, NVIDIA_SMI

UNIT_DIR = "/etc/systemd/system"
# nvidia-smi's reset of a lock (`-rgc`, --reset-gpu-clocks: the nvidia-smi(1) manual).
RESET = f"{NVIDIA_SMI} -rgc"


def unit_path(unit: str) -> str:
    return f"{UNIT_DIR}/{unit}"


class LockedClocks(FactBase):
    """The (min, max) MHz the unit's nvidia-smi locked this boot, as its journal says (read as
    the metrics collector and compliance read it: files/spark_metrics.py); None: no lock line.

    .. code:: python

        (300, 2200)
    """

    def command(self, unit: str) -> str:
        return f"{shlex.join(clock_journal_command(unit))} 2>/dev/null || true"

    def process(self, output: list[str]) -> tuple[int, int] | None:
        return locked_clocks("\n".join(output))


@operation()
def clock_locked(
    lock: tuple[int, int] | None,
    command: str = "",
    unit: str = GPU_CLOCK_UNIT,
):
    """
    Lock the GPU's graphics clock at every boot with a oneshot unit after nvidia-persistenced,
    or, with no lock, remove that unit and reset the clocks.

    + lock: (min, max) MHz, or None: no lock
    + command: what the unit runs, the plan's `nvidia-smi -lgc min,max` (with a lock)
    + unit: the unit's name

    The unit runs once per boot and stays active (RemainAfterExit); a changed unit runs again at
    once (`systemctl restart`), so a new cap holds without a reboot. nvidia-smi's line in the
    unit's journal is the only reading of the lock (NVML has no getter): where this boot's says
    another range or none (a run cut off before the restart), the unit runs again; the metrics
    collector and compliance read the same line (files/spark_metrics.py locked_clocks).

    **Example:**

    .. code:: python

        gpuclock.clock_locked(name="GPU clock locked", lock=(300, 2200),
                              command="/usr/bin/nvidia-smi -lgc 300,2200")
    """
    # The plan writes both from gpu_clock_lock_mhz (spark/plan.py): a mismatch is the plan's,
    # and stops this box alone.
    if lock is not None and f"-lgc {lock[0]},{lock[1]}" not in command:
        yield from util.refused(
            f"{host.name}: the GPU clock unit's command {command!r} does not lock"
            f" {lock[0]},{lock[1]} (gpu_clock_lock_mhz)"
        )
        return
    path = unit_path(unit)
    found = util.on_box(path)
    running = bool(answer(SystemdStatus, services=[unit]).get(unit))
    enabled = bool(answer(SystemdEnabled, services=[unit]).get(unit))
    read = answer(LockedClocks, unit=unit)
    if lock is None:
        if found.get(path) is None and not (running or enabled):
            host.noop(f"no GPU clock lock ({unit} absent)")
            return
        # The reset first: a run cut off after it finds the unit still there and does all again.
        yield f"{RESET} && systemctl disable --now {unit} && rm -f {shlex.quote(path)}"
        yield "systemctl daemon-reload"
        return
    written = util.template(
        "spark-gpu-clock-lock.service.j2",
        path,
        found=found,
        command=command,
        min_mhz=lock[0],
        max_mhz=lock[1],
    )
    # A failed lock stops the box with nvidia-smi's own words from the unit's journal.
    said = f"|| {{ journalctl -b -u {unit} -n 5 -o cat --no-pager >&2; exit 1; }}"
    yield from written
    yield from util.unit_started(
        unit,
        unit_changed=bool(written),
        enabled="enabled" if enabled else None,
        running=running,
        changed=bool(written) or (running and read != lock),
        start=f"systemctl start {unit} {said}",
        restart=f"systemctl restart {unit} {said}",
    )
    if running and enabled and not written and read == lock:
        host.noop(f"{unit} locked the GPU clock to {lock[0]}-{lock[1]} MHz this boot")


def questions(unit: str = GPU_CLOCK_UNIT) -> list[Question]:
    """What ``clock_locked`` reads (operations/asked.py)."""
    return [
        question(util.RootFiles, paths=(unit_path(unit),)),
        question(SystemdStatus, services=[unit]),
        question(SystemdEnabled, services=[unit]),
        question(LockedClocks, unit=unit),
    ]

"""The GPU clock's lock against GB10 power-offs under long prefills: its unit enabled, run this
boot after nvidia-persistenced, and nvidia-smi's line in its journal naming the plan's range; a
box with the lock off has no unit. The journal is read as the metrics collector reads it
(files/spark_metrics.py): NVML has no getter for a locked clock."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from files.spark_metrics import clock_journal_command, locked_clocks
from operations.gpuclock import unit_path
from spark.box_paths import GPU_CLOCK_UNIT

if TYPE_CHECKING:
    from tests.compliance.conftest import Box


def test_gpu_clock_locked(box: Box, found: Callable[[object], None]) -> None:
    """GPU clock locked this boot"""
    lock = box.plan.gpu_clock_lock
    if lock is None:
        there = box.run(f"test -e {unit_path(GPU_CLOCK_UNIT)}").rc == 0
        found(f"off; {GPU_CLOCK_UNIT} {'present' if there else 'absent'}")
        assert not there, f"expected no {GPU_CLOCK_UNIT} (gpu_clock_lock_mhz None), found one"
        return
    show = box.run(
        f"systemctl show -p UnitFileState -p ActiveState -p SubState -p After {lock.unit}"
    ).stdout
    unit = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
    journal = box.run(shlex.join(clock_journal_command(lock.unit))).stdout
    read = locked_clocks(journal)
    state = (
        f"{unit.get('UnitFileState') or 'no unit'}, {unit.get('ActiveState')}"
        f" ({unit.get('SubState')}), journal: {'{},{}'.format(*read) if read else 'no lock line'}"
    )
    found(state)
    problems = []
    if (unit.get("UnitFileState"), unit.get("ActiveState")) != ("enabled", "active"):
        problems.append("the unit is not enabled and active")
    if "nvidia-persistenced.service" not in unit.get("After", "").split():
        problems.append("the unit is not ordered after nvidia-persistenced")
    if read != (lock.min_mhz, lock.max_mhz):
        problems.append(f"its journal this boot does not say {lock.min_mhz},{lock.max_mhz}")
    assert not problems, (
        f"expected {lock.unit} enabled, active after nvidia-persistenced, its journal this boot"
        f' saying `GPU clocks set to "(gpuClkMin {lock.min_mhz}, gpuClkMax {lock.max_mhz})"`;'
        f" found {state}: {'; '.join(problems)}"
    )

"""The GPU clock's lock on the lab: the unit runs at every boot after nvidia-persistenced and
its journal line is there again after a reboot; the collector and compliance read it; a second
deploy changes nothing. Turned off for one box, its clocks are reset and the unit removed;
turned on again, it locks at once.

The lab's nvidia-smi answers -lgc and -rgc in the real tool's words and records the range it
locked in GPU_CLOCK_RECORD under /run (gone at a reboot, as a real lock is): the lab's own
witness that the unit ran this boot, which a real box lacks (its journal line is the reading).
"""

from __future__ import annotations

import shlex

import pytest

from files.spark_metrics import clock_journal_command, locked_clocks
from spark.box_paths import GPU_CLOCK_UNIT
from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import converged
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab
from tests.simlab.standins import GPU_CLOCK_RECORD
from tests.simlab.waits import until

pytestmark = pytest.mark.lab

OFF = "tests/e2e/clock_off_inventory.py"  # spark-2's lock off
DEFAULT = "inventories/sim.py"
UNIT_FILE = f"/etc/systemd/system/{GPU_CLOCK_UNIT}"
READY_S = 120  # the unit runs early in the boot; on a loaded machine give it time


def unit_state(host: simlab.Host) -> list[str]:
    return run_on(host, f"systemctl is-enabled {GPU_CLOCK_UNIT}; systemctl is-active"
                        f" {GPU_CLOCK_UNIT}", check=False).split()  # fmt: skip


def journal_lock(host: simlab.Host) -> tuple[int, int] | None:
    """The lock the unit's journal of this boot reports, read as the collector reads it."""
    return locked_clocks(run_on(host, "sudo " + shlex.join(clock_journal_command(GPU_CLOCK_UNIT))))


def recorded(host: simlab.Host) -> str:
    """What the lab's nvidia-smi locked since the box booted ("" : nothing, or reset)."""
    return run_on(host, f"cat {GPU_CLOCK_RECORD} 2>/dev/null || true").strip()


def locked(host: simlab.Host) -> bool:
    return unit_state(host) == ["enabled", "active"] and journal_lock(host) == (300, 2200)


def collected(host: simlab.Host) -> str:
    """The collector's line for the lock, from a run now."""
    return run_on(host, "sudo systemctl start spark-metrics.service && grep"
                        " '^spark_gpu_clock_locked_mhz ' /var/lib/prometheus/node-exporter/"
                        "spark.prom", check=False).strip()  # fmt: skip


def test_each_box_locks_its_clock_and_again_after_a_reboot(deployed_lab: Deployed) -> None:
    head, worker = deployed_lab.lab.hosts
    for host in (head, worker):
        assert unit_state(host) == ["enabled", "active"], host.name
        assert journal_lock(host) == (300, 2200), host.name
        assert recorded(host) == "300,2200", host.name
        assert collected(host) == "spark_gpu_clock_locked_mhz 2200", host.name
    booted = "systemctl show -p UserspaceTimestampMonotonic --value"
    before = int(run_on(worker, booted))
    simlab.reboot(worker.name)
    assert int(run_on(worker, booted)) > before  # a systemd started anew: it did reboot
    until(lambda: locked(worker), READY_S, "the unit's lock line in this boot's journal")
    assert recorded(worker) == "300,2200"  # /run was emptied: the unit ran again at boot
    order = run_on(worker, f"systemctl show -p After --value {GPU_CLOCK_UNIT}").split()
    assert "nvidia-persistenced.service" in order
    assert collected(worker) == "spark_gpu_clock_locked_mhz 2200"
    converged()  # a deploy changes nothing; compliance passes


def test_turned_off_on_one_box_its_clocks_are_reset_and_the_unit_gone(
    deployed_lab: Deployed,
) -> None:
    head, worker = deployed_lab.lab.hosts
    assert changes(pyinfra(OFF, "deploy.py")) > 0
    assert run_on(worker, f"test -e {UNIT_FILE} && echo there || echo gone").strip() == "gone"
    assert unit_state(worker)[0] != "enabled"
    assert recorded(worker) == ""  # nvidia-smi -rgc ran
    assert collected(worker) == ""  # no lock planned: no series
    assert locked(head) and recorded(head) == "300,2200"  # the other box keeps its lock
    again = pyinfra(OFF, "deploy.py")
    assert changes(again) == 0, again.stdout
    code, table, output = compliance(inventory=OFF)
    assert code == 0 and not_passing(table) == {}, output
    # Turned on again: the unit back, run at once.
    result = pyinfra(DEFAULT, "deploy.py")
    assert changes(result) > 0
    assert locked(worker) and recorded(worker) == "300,2200"


def test_a_box_locked_by_hand_to_another_range_is_drift(deployed_lab: Deployed) -> None:
    """The unit's file edited by hand to lock 300,2400 and run: the collector says drift, the
    deploy puts the plan's unit back and runs it, and compliance passes again."""
    worker = deployed_lab.lab.hosts[1]
    run_on(worker, f"sudo sed -i 's/-lgc 300,2200/-lgc 300,2400/' {UNIT_FILE} && sudo systemctl"
                   f" daemon-reload && sudo systemctl restart {GPU_CLOCK_UNIT}")  # fmt: skip
    assert journal_lock(worker) == (300, 2400)
    assert collected(worker) == "spark_gpu_clock_locked_mhz 2400"
    drift = run_on(worker, "grep 'kind=\"gpu_clock\"' /var/lib/prometheus/node-exporter/spark.prom")
    assert 'expected="300,2200",found="300,2400"' in drift
    assert changes(pyinfra(DEFAULT, "deploy.py")) > 0
    assert locked(worker) and recorded(worker) == "300,2200"
    converged()


def test_the_admin_without_sudo_is_refused_as_the_real_tool_refuses(
    deployed_lab: Deployed,
) -> None:
    host = deployed_lab.lab.hosts[0]
    said = run_on(host, "nvidia-smi -lgc 300,2200; echo rc=$?", check=False)
    assert said == (
        "The current user does not have permission to change clocks for GPU 0000000F:01:00.0.\n"
        "Terminating early due to previous errors.\nrc=4\n"
    )
    assert recorded(host) == "300,2200"  # the unit's lock stands

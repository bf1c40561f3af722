"""The GPU clock's lock (operations/gpuclock.py): its unit written, enabled and run once on a
change, nothing on a second run, removed with the clocks reset when the lock is turned off.

Captures (pyinfra's SystemdStatus and SystemdEnabled commands, run under sudo on the simulated
lab's spark-1, Debian 12, systemd 252, after a deploy of this branch):
- lab-systemctl-gpu-clock-lock-exited.txt, lab-systemctl-gpu-clock-lock-enabled.txt: the unit
  after its run (a oneshot with RemainAfterExit: SubState exited), enabled.
- lab-systemctl-gpu-clock-lock-absent-dead.txt, lab-systemctl-gpu-clock-lock-absent-unitfile.txt:
  what systemd answers for a unit without a unit file (asked as spark-nothing-here.service, the
  name replaced by hand): dead, UnitFileState empty.
- lab-journal-gpu-clock-lock.txt: the unit's journal of this boot (`journalctl -b -u ... -o cat`)
  after that deploy: systemd's lines and nvidia-smi's lock line.
"""

from __future__ import annotations

import hashlib

import pytest
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from operations import gpuclock, util
from tests.unit.harness import FakeHost, captured, file_facts, process, refusal, run_op

UNIT = "spark-gpu-clock-lock.service"
PATH = f"/etc/systemd/system/{UNIT}"
LOCK = {"lock": (300, 2200), "command": "/usr/bin/nvidia-smi -lgc 300,2200"}
JOURNAL = "lab-journal-gpu-clock-lock.txt"
FAILED = f"|| {{ journalctl -b -u {UNIT} -n 5 -o cat --no-pager >&2; exit 1; }}"


def box(unit_file: str | None, state: str) -> FakeHost:
    """A box with this unit file (None: none) in this state (the captures' names)."""
    host = FakeHost(file_facts({PATH: unit_file}))
    absent = state == "absent"
    host.outputs[SystemdStatus] = captured(
        f"lab-systemctl-gpu-clock-lock-{'absent-dead' if absent else state}.txt"
    )
    host.outputs[SystemdEnabled] = captured(
        f"lab-systemctl-gpu-clock-lock-{'absent-unitfile' if absent else 'enabled'}.txt"
    )
    host.outputs[gpuclock.LockedClocks] = None if absent else captured(JOURNAL)
    return host


# The unit as a deploy leaves it for LOCK (templates/spark-gpu-clock-lock.service.j2), written
# out here: a box whose file reads so is as deployed, whatever the template now renders.
DEPLOYED = """\
# GPU clock lock: written by the spark deploy (operations/gpuclock.py); edits are overwritten.
[Unit]
Description=Spark GPU clock lock: 300-2200 MHz against GB10 power-offs under long prefills
# After the driver is up and persistent (capetron/gb10-cluster-bench's gpu-clock-lock.service):
# nvidia-smi warns on -lgc while persistence mode is off, pointing at its manual's Known Issues
# (a public output of `nvidia-smi --lock-gpu-clocks` on a box without it).
After=nvidia-persistenced.service

[Service]
Type=oneshot
# Active after its one run: the lock holds until a reset or a reboot, which runs it again.
RemainAfterExit=yes
ExecStart=/usr/bin/nvidia-smi -lgc 300,2200

[Install]
WantedBy=multi-user.target
"""


def test_a_bare_box_gets_the_unit_enabled_and_run_once() -> None:
    host = box(None, "absent")
    commands = run_op(gpuclock.clock_locked, host=host, **LOCK)
    assert commands[-3:] == [  # after files.put's upload, chown and chmod
        "systemctl daemon-reload",
        f"systemctl enable {UNIT}",
        f"systemctl restart {UNIT} {FAILED}",
    ]
    assert host.uploads[PATH] == DEPLOYED
    unit = DEPLOYED.splitlines()
    # capetron/gb10-cluster-bench's gpu-clock-lock.service: a oneshot after nvidia-persistenced
    # at boot running `nvidia-smi -lgc 300,2200`; enabled for the boot's multi-user target.
    for line in (
        "After=nvidia-persistenced.service",
        "Type=oneshot",
        "RemainAfterExit=yes",
        "ExecStart=/usr/bin/nvidia-smi -lgc 300,2200",
        "WantedBy=multi-user.target",
    ):
        assert line in unit


def test_a_second_run_changes_nothing() -> None:
    host = box(DEPLOYED, "exited")
    assert run_op(gpuclock.clock_locked, host=host, **LOCK) == []
    assert host.noops[-1] == f"{UNIT} locked the GPU clock to 300-2200 MHz this boot"


def test_its_file_and_states_are_one_question_each() -> None:
    # The unit file's RootFiles answer (root 0644 as written) and the two systemctl answers:
    # pyinfra's own file facts would fail the test as unexpected.
    text = DEPLOYED
    host = FakeHost({
        (util.RootFiles, (("paths", (PATH,)),)):
            f"{PATH}\troot root 644 {hashlib.sha1(text.encode()).hexdigest()}",
        SystemdStatus: captured("lab-systemctl-gpu-clock-lock-exited.txt"),
        SystemdEnabled: captured("lab-systemctl-gpu-clock-lock-enabled.txt"),
        gpuclock.LockedClocks: captured(JOURNAL),
    })  # fmt: skip
    assert run_op(gpuclock.clock_locked, host=host, **LOCK) == []


def test_another_cap_rewrites_the_unit_and_runs_it_at_once() -> None:
    host = box(DEPLOYED, "exited")
    lower = {"lock": (300, 2100), "command": "/usr/bin/nvidia-smi -lgc 300,2100"}
    commands = run_op(gpuclock.clock_locked, host=host, **lower)
    assert commands[-2:] == ["systemctl daemon-reload", f"systemctl restart {UNIT} {FAILED}"]
    assert "ExecStart=/usr/bin/nvidia-smi -lgc 300,2100" in host.uploads[PATH].splitlines()


def test_a_unit_that_did_not_run_this_boot_is_started() -> None:
    # Its file as written and enabled, but dead (a failed nvidia-smi, or stopped by hand).
    host = box(DEPLOYED, "absent")
    host.outputs[SystemdEnabled] = captured("lab-systemctl-gpu-clock-lock-enabled.txt")
    assert run_op(gpuclock.clock_locked, host=host, **LOCK) == [f"systemctl start {UNIT} {FAILED}"]


def test_the_lock_is_read_from_the_units_journal_of_this_boot() -> None:
    assert gpuclock.LockedClocks().command(UNIT) == (
        f"journalctl -b -u {UNIT} -o cat --no-pager 2>/dev/null || true"
    )
    assert process(gpuclock.LockedClocks, captured(JOURNAL)) == (300, 2200)
    assert process(gpuclock.LockedClocks, "") is None


@pytest.mark.parametrize(
    "journal",
    [
        # systemd's lines alone (nvidia-smi's removed from the capture by hand): a run cut off
        # after the unit file was written, before its restart, left the boot's first lock...
        "Starting spark-gpu-clock-lock.service - Spark GPU clock lock...\n",
        # ...or the unit ran with another range since (the capture's line edited by hand).
        'GPU clocks set to "(gpuClkMin 300, gpuClkMax 2400)" for GPU 0000000F:01:00.0\n',
    ],
    ids=["no-lock-line", "another-range"],
)
def test_a_unit_whose_journal_says_another_lock_runs_again(journal: str) -> None:
    host = box(DEPLOYED, "exited")
    host.outputs[gpuclock.LockedClocks] = journal
    assert run_op(gpuclock.clock_locked, host=host, **LOCK) == [
        f"systemctl restart {UNIT} {FAILED}"
    ]


def test_turned_off_the_clocks_are_reset_and_the_unit_removed() -> None:
    host = box(DEPLOYED, "exited")
    assert run_op(gpuclock.clock_locked, host=host, lock=None) == [
        f"/usr/bin/nvidia-smi -rgc && systemctl disable --now {UNIT} && rm -f {PATH}",
        "systemctl daemon-reload",
    ]


def test_off_with_no_unit_changes_nothing() -> None:
    host = box(None, "absent")
    assert run_op(gpuclock.clock_locked, host=host, lock=None) == []
    assert host.noops == [f"no GPU clock lock ({UNIT} absent)"]


def test_a_command_that_locks_another_range_stops_this_box_alone() -> None:
    # The plan writes both from one value (spark/plan.py): a mismatch is its error, which fails
    # this box (a failed command, asking nothing first), not the run.
    commands = run_op(
        gpuclock.clock_locked,
        host=FakeHost({}),
        lock=(300, 2200),
        command="/usr/bin/nvidia-smi -lgc 300,2400",
    )
    assert refusal(commands) == (
        "spark-test: the GPU clock unit's command '/usr/bin/nvidia-smi -lgc 300,2400' does not"
        " lock 300,2200 (gpu_clock_lock_mhz)"
    )

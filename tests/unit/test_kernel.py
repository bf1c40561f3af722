"""The running kernel: kexec handover read off the command line, the GRUB drop-in that turns it
off on a box of the fabric, the refusal with the fix, and the plan's choice between them.

Captures: issue-supabase-postgres-2472-cmdline.txt holds two /proc/cmdline lines quoted in
supabase/postgres PR 2472 (Ubuntu arm64 boxes: 6.8.0-106-generic as booted, 7.0.0-30-generic
with kho=off added). The affected releases are the issue's sources': 7.0.0-1019-nvidia fails
RDMA registration, 6.17.0-1032-nvidia passes (NVIDIA/NV-Kernels PRs 590, 591; MiaAI-Lab
DeepSeek-v4.1-Flash-DGX-Sparks#14).
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from operations import kernel
from spark.inventory import load_from_dicts
from spark.plan import plan
from tests.unit.harness import FakeHost, captured, file_facts, process, refusal, run_op
from tests.unit.test_config import TWO_SPARKS, merged, refusals

OLD_CMDLINE, KHO_OFF_CMDLINE = captured("issue-supabase-postgres-2472-cmdline.txt").splitlines()
SPARK_7 = "7.0.0-1019-nvidia"  # DGX OS 7.6's kernel (NV-Kernels PR 590)
SPARK_6 = "6.17.0-1032-nvidia"  # the kernel that passes (MiaAI-Lab ...-DGX-Sparks#14)
# A DGX OS command line without kho= (the supabase box's, as booted: no kho= either).
PLAIN = OLD_CMDLINE
DROPIN = "/etc/default/grub.d/99-spark-kho-off.cfg"
FROM = (7, 0)


def output(release: str, cmdline: str, grub: bool = False) -> str:
    """What RunningKernel's command prints: its release and cmdline lines, then each kho= of
    grub.cfg (two menu entries carrying kho=off, as update-grub writes the option into each)."""
    return f"release {release}\ncmdline {cmdline}\n" + ("grub kho=off\n" * 2 if grub else "")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # lib/kstrtox.c kstrtobool: the first character, "on"/"off" by the second.
        ("off", False),
        ("0", False),
        ("n", False),
        ("No", False),
        ("false", False),
        ("on", True),
        ("1", True),
        ("y", True),
        ("True", True),
        ("o", None),
        ("maybe", None),
        ("", None),
    ],
)
def test_kstrtobool_reads_a_value_as_the_kernel_does(value: str, expected: bool | None) -> None:
    assert kernel.kstrtobool(value) is expected


def test_the_fact_reads_release_series_and_kho_off() -> None:
    found = process(kernel.RunningKernel, output("7.0.0-30-generic", KHO_OFF_CMDLINE))
    assert found == {
        "release": "7.0.0-30-generic",
        "series": (7, 0),
        "abi": "7.0.0-30",
        "kho": False,
        "grub": [],
    }


def test_the_fact_without_kho_leaves_the_kernels_default() -> None:
    found = process(kernel.RunningKernel, output("6.8.0-106-generic", OLD_CMDLINE, grub=True))
    assert found == {
        "release": "6.8.0-106-generic",
        "series": (6, 8),
        "abi": "6.8.0-106",
        "kho": None,
        "grub": ["kho=off"],
    }


def test_the_last_kho_on_the_command_line_wins() -> None:
    found = process(kernel.RunningKernel, output(SPARK_7, f"{PLAIN} kho=on kho=off"))
    assert found["kho"] is False
    found = process(kernel.RunningKernel, output(SPARK_7, f"{PLAIN} kho=off kho=1"))
    assert found["kho"] is True


def test_the_facts_command_runs_under_sh_and_reads_this_machines_kernel() -> None:
    command = kernel.RunningKernel().command()
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = process(kernel.RunningKernel, done.stdout)
    assert found["release"] == platform.release()
    assert found["series"] == tuple(int(part) for part in platform.release().split(".")[:2])


@pytest.mark.parametrize(
    ("release", "cmdline", "on"),
    [
        (SPARK_7, PLAIN, True),  # DGX OS 7.6 as shipped: the failure
        ("7.0.0-30-generic", KHO_OFF_CMDLINE, False),  # the workaround applied
        (SPARK_6, PLAIN, False),  # 6.17 compiles KHO in, off unless asked for
        (SPARK_6, f"{PLAIN} kho=on", True),  # asked for
        ("7.1.0-1003-nvidia", PLAIN, True),  # no fixed 7.x yet: every later one counts
    ],
)
def test_handover_is_on_from_7_0_or_when_asked(release: str, cmdline: str, on: bool) -> None:
    found = process(kernel.RunningKernel, output(release, cmdline))
    assert kernel.handover_on(found, FROM) is on


class LoggingHost(FakeHost):
    """A FakeHost that keeps what the operation logs."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.logged: list[str] = []

    def log(self, message: str, log_func: Callable[[str], Any] | None = None) -> None:
        self.logged.append(message)


def handover_off(fix: str, release: str, cmdline: str, grub: bool, dropin: str | None) -> tuple:
    host = LoggingHost(
        {kernel.RunningKernel: output(release, cmdline, grub), **file_facts({DROPIN: dropin})}
    )
    commands = run_op(kernel.handover_off, fix, FROM, "kho=off", DROPIN, host=host)
    return host, commands


def test_a_7_0_box_gets_kho_off_through_grub() -> None:
    host, commands = handover_off("grub", SPARK_7, PLAIN, grub=False, dropin=None)

    assert commands[-1] == "update-grub"
    (said,) = host.logged
    assert said.endswith(
        "kho=off is set for the next boot; reboot this box to apply it. Until then the NCCL"
        " test fails."
    )
    text = host.uploads[DROPIN]
    # update-grub sources it after /etc/default/grub: the option is appended to what is there.
    shell = f'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n{text}\necho "$GRUB_CMDLINE_LINUX_DEFAULT"'
    done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True)
    assert done.stdout == "quiet splash kho=off\n"


def test_a_drop_in_in_place_whose_update_grub_did_not_run_runs_it() -> None:
    dropin = handover_off("grub", SPARK_7, PLAIN, grub=False, dropin=None)[0].uploads[DROPIN]
    _, commands = handover_off("grub", SPARK_7, PLAIN, grub=False, dropin=dropin)
    assert commands == ["update-grub"]


def test_a_box_waiting_for_its_reboot_changes_nothing() -> None:
    dropin = handover_off("grub", SPARK_7, PLAIN, grub=False, dropin=None)[0].uploads[DROPIN]
    host, commands = handover_off("grub", SPARK_7, PLAIN, grub=True, dropin=dropin)
    assert commands == []
    assert host.noops == [f"file {DROPIN} is already uploaded"]  # files.put's words
    assert "reboot this box to apply it" in host.logged[0]  # said again until the reboot


@pytest.mark.parametrize(
    ("release", "cmdline"), [(SPARK_6, PLAIN), ("7.0.0-30-generic", KHO_OFF_CMDLINE)]
)
def test_a_box_with_handover_off_is_left_alone(release: str, cmdline: str) -> None:
    host, commands = handover_off("grub", release, cmdline, grub=False, dropin=None)
    assert commands == []
    assert host.noops == [f"kernel {release}: kexec handover off, RDMA registration unaffected"]


def test_with_the_option_off_the_box_is_refused_with_the_fix() -> None:
    _, commands = handover_off("refuse", SPARK_7, PLAIN, grub=False, dropin=None)
    said = refusal(commands)
    assert said.startswith(f"spark-test: kernel {SPARK_7} boots with kexec handover on")
    assert "ibv_reg_mr_iova2 failed with error Cannot allocate memory" in said
    assert "Add kho=off to the kernel command line" in said
    assert said.endswith("set fabric_kernel_kho_off = True for the deploy to add it")


# The plan: every box of the fabric, by the option (group_data's default True).


def test_every_box_of_a_fabric_sets_it_through_grub_by_default() -> None:
    boxes = plan(load_from_dicts(merged(TWO_SPARKS))).boxes
    assert [(b.kernel.kho_fix, b.kernel.boot_option, b.kernel.grub_dropin) for b in boxes] == [
        ("grub", "kho=off", DROPIN)
    ] * 2
    assert boxes[0].kernel.kho_default_from == FROM


def test_with_the_option_off_the_plan_refuses_and_a_lone_box_without_fabric_has_nothing() -> None:
    hosts = {name: data | {"fabric_kernel_kho_off": False} for name, data in TWO_SPARKS.items()}
    assert {b.kernel.kho_fix for b in plan(load_from_dicts(merged(hosts))).boxes} == {"refuse"}
    lone = plan(load_from_dicts(merged({"spark-1": {}}))).box("spark-1")
    assert lone.kernel.kho_fix is None


def test_the_option_is_a_bool() -> None:
    (problem,) = refusals(fabric_kernel_kho_off="yes")
    assert problem.startswith("spark-1: fabric_kernel_kho_off: Input should be a valid boolean")

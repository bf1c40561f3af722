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
from pathlib import Path
from typing import Any

import pytest

from operations import kernel
from spark.inventory import load_from_dicts
from spark.plan import plan
from tests.unit import private_apt
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


# The kernel hold (kernel_hold): metapackages held, apt pinned to the running ABI. Package names
# and versions as Ubuntu's nvidia flavour names them (linux-nvidia-64k-hwe-24.04 6.17.0-1032.32:
# dsx-ai-factory/infra-controller PR 6049; DGX OS 7.6's kernel 7.0.0-1019.19~24.04.2: NV-Kernels
# PR 590); the metapackage name of the 4k flavour follows the 64k one's.

HOLD_PIN = "/etc/apt/preferences.d/spark-kernel-hold.pref"
METAS = ("linux-nvidia*", "linux-image-nvidia*")
META_617 = "6.17.0-1032.32"
META_70 = "7.0.0-1019.19~24.04.2"


def held(release: str, packages: str, pin: str | None = None) -> tuple[LoggingHost, list[str]]:
    """held() on a box running ``release`` whose kernel packages dpkg-query lists as
    ``packages`` (KernelPackages' format: status, name, version, tab-separated)."""
    host = LoggingHost(
        {
            kernel.RunningKernel: output(release, PLAIN),
            kernel.KernelPackages: packages,
            **file_facts({HOLD_PIN: pin}),
        }
    )
    return host, run_op(kernel.held, METAS, host=host)


def test_the_hold_pins_the_metapackages_to_the_running_abi_and_holds_them() -> None:
    host, commands = held(SPARK_6, f"ii\tlinux-nvidia-hwe-24.04\t{META_617}\n")

    pin = host.uploads[HOLD_PIN]
    assert "Package: linux-nvidia* linux-image-nvidia*\nPin: version 6.17.0-1032.*\n" in pin
    assert "Pin: version *\nPin-Priority: -1" in pin
    assert commands[-1].endswith("| xargs -r apt-mark hold")
    assert "'linux-nvidia*' 'linux-image-nvidia*'" in commands[-1]


def test_the_packages_fact_asks_dpkg_for_the_patterns_given() -> None:
    command = kernel.KernelPackages().command(patterns=METAS)
    assert command.startswith("dpkg-query -W ")
    assert command.endswith(" 'linux-nvidia*' 'linux-image-nvidia*' 2>/dev/null || true")
    # dpkg-query's own lines: held (h) and installed (i) read as such; removed (rc) left out.
    found = process(
        kernel.KernelPackages,
        f"hi\tlinux-nvidia-hwe-24.04\t{META_617}\nrc\tlinux-image-nvidia-hwe-24.04\t{META_617}\n",
    )
    assert found == {"linux-nvidia-hwe-24.04": {"version": META_617, "held": True}}


def test_a_held_box_changes_nothing() -> None:
    pin = held(SPARK_6, "")[0].uploads[HOLD_PIN]
    host, commands = held(SPARK_6, f"hi\tlinux-nvidia-hwe-24.04\t{META_617}\n", pin)
    assert commands == []
    assert host.noops[-1] == f"kernel metapackages of {SPARK_6} held (1 installed)"


def test_a_newer_kernel_installed_but_not_booted_is_named() -> None:
    packages = f"hi\tlinux-nvidia-hwe-24.04\t{META_70}\nii\tlinux-nvidia-6.17\t6.17.0-1014.14\n"
    host, _ = held(SPARK_6, packages)
    # 7.0 is ahead of the running 6.17.0-1032; the older 6.17.0-1014 is a kernel kept behind.
    (said,) = host.logged
    assert said == (
        f"kernel {SPARK_6} held, but linux-nvidia-hwe-24.04 {META_70} already installed: the"
        " next boot may start that kernel (GRUB boots the newest)"
    )


def test_with_the_hold_off_a_pin_left_from_before_is_removed() -> None:
    pin = held(SPARK_6, "")[0].uploads[HOLD_PIN]
    host = FakeHost(file_facts({HOLD_PIN: pin}))
    assert run_op(kernel.held, (), host=host) == [f"rm -f {HOLD_PIN}"]
    host = FakeHost(file_facts({HOLD_PIN: None}))
    assert run_op(kernel.held, (), host=host) == []
    assert host.noops == ["the kernel is not held (kernel_hold off)"]


def test_a_kernel_of_no_ubuntu_build_is_refused() -> None:
    _, commands = held("6.12.9", "")
    assert refusal(commands) == (
        "spark-test: kernel 6.12.9 is no Ubuntu build (<version>-<abi>-<flavour>): kernel_hold"
        " pins Ubuntu's kernel metapackages to the running ABI; set kernel_hold = False for"
        " this box"
    )


def test_the_plan_holds_the_kernel_only_where_the_owner_says_so() -> None:
    default = plan(load_from_dicts(merged(TWO_SPARKS))).box("spark-1")
    assert default.kernel.hold == ()
    hosts = {name: data | {"kernel_hold": True} for name, data in TWO_SPARKS.items()}
    hold = plan(load_from_dicts(merged(hosts))).box("spark-1").kernel.hold
    assert {"linux-nvidia*", "linux-image-nvidia*", "linux-generic*"} <= set(hold)
    assert not any(pattern.startswith("linux-modules-nvidia") for pattern in hold)  # driver's


# The pin under real apt (tests/unit/private_apt.py): a box on 6.17.0-1032 whose archive offers
# DGX OS 7.6's 7.0.0-1019.

KERNEL_PACKAGES = [
    ("linux-nvidia-hwe-24.04", META_617, f"linux-image-6.17.0-1032-nvidia (= {META_617})"),
    ("linux-nvidia-hwe-24.04", META_70, f"linux-image-7.0.0-1019-nvidia (= {META_70})"),
    ("linux-image-6.17.0-1032-nvidia", META_617, ""),
    ("linux-image-7.0.0-1019-nvidia", META_70, ""),
]
INSTALLED_617 = f"""\
Package: linux-nvidia-hwe-24.04
Status: install ok installed
Architecture: all
Version: {META_617}
Depends: linux-image-6.17.0-1032-nvidia (= {META_617})

Package: linux-image-6.17.0-1032-nvidia
Status: install ok installed
Architecture: all
Version: {META_617}
"""


@pytest.fixture(scope="module")
def kernel_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    private_apt.require_tools()
    return private_apt.build_repo(tmp_path_factory.mktemp("apt"), KERNEL_PACKAGES)


def kernel_apt(repo: Path, name: str, preferences: str) -> private_apt.PrivateApt:
    sources = f"deb [trusted=yes] file:{repo}/$(ARCH) /\n"
    apt = private_apt.PrivateApt(repo.parent / name, sources, preferences, INSTALLED_617)
    apt.run("apt-get update")
    return apt


def test_without_the_pin_an_upgrade_moves_the_box_to_7_0(kernel_repo: Path) -> None:
    # The control: the archive would move the box, so the pinned test means something.
    upgrade = kernel_apt(kernel_repo, "unpinned", "").run("apt-get -s dist-upgrade")
    assert f"Inst linux-nvidia-hwe-24.04 [{META_617}] ({META_70}" in upgrade
    assert "Inst linux-image-7.0.0-1019-nvidia" in upgrade


def test_the_pin_keeps_the_box_on_its_kernel(kernel_repo: Path) -> None:
    pin = held(SPARK_6, "")[0].uploads[HOLD_PIN]
    pinned = kernel_apt(kernel_repo, "pinned", pin)
    assert "Inst " not in pinned.run("apt-get -s dist-upgrade")
    # Asking for the metapackage installs no other kernel either (naming a version by hand still
    # does: apt takes an explicit version over any pin, the owner's way to move the kernel).
    again = pinned.run("apt-get -s install linux-nvidia-hwe-24.04", check=False)
    assert "Inst " not in again
    policy = pinned.run("apt-cache policy linux-nvidia-hwe-24.04")
    assert f"Installed: {META_617}\n  Candidate: {META_617}" in policy

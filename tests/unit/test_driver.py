"""Driver branch: facts, the hold/pin operation, the running check, and the pin under real apt.

Captures:
- dpkg-query-driver-*.sample.txt: real dpkg-query 1.21 output of DriverPackages' command (run with
  --admindir) over private dpkg status databases whose stanzas we wrote: a DGX OS 7 box with
  nvidia-driver-580-open held, its libraries not, and a removed 590 package's conffiles left
  ("rc"); and a box where `apt install nvidia-driver-open` brought branch 590.
- lab-dpkg-query-driver-580-held.txt: DriverPackages' command on lab host spark-2 (Debian 12,
  the lab's stand-in packages) after a deploy.
- public-nvidia-smi-gb10-query.txt: real. NvidiaSmi's query (`nvidia-smi
  --query-gpu=name,driver_version,compute_cap --format=csv,noheader`) on a DGX Spark with driver
  580.159.03, as dramasamy/from-api-to-gpu quotes it
  (week-02-first-local-model/ollama-model-in-llamacpp.md, "=== Driver ===").
- public-nvidia-smi-no-driver.txt: real. nvidia-smi with no driver loaded, as
  ci-for-research/self-hosted-runners issue 40 quotes it.
- issue-nvidia-smi-version-mismatch.txt: real. nvidia-smi on a box whose driver libraries
  (570.124.04) differ from its loaded kernel module, as tinygrad/open-gpu-kernel-modules issue
  47 quotes it.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import pytest

from operations import driver
from tests.unit import private_apt
from tests.unit.harness import FakeHost, captured, file_facts, process, refusal, run_op
from tests.unit.test_kernel import LoggingHost

PIN = "/etc/apt/preferences.d/nvidia-driver-branch.pref"
HOLD = "xargs -r apt-mark hold"


def pin_text() -> str:
    """What branch_held writes to the pin file, read off a fresh run."""
    host = FakeHost({driver.DriverPackages: "", driver.NvidiaSmi: "", **file_facts({PIN: None})})
    run_op(driver.branch_held, 580, "nvidia-driver-580-open", host=host)
    return host.uploads[PIN]


def test_driver_packages_reads_version_and_hold_and_skips_leftover_conffiles() -> None:
    packages = process(
        driver.DriverPackages, captured("dpkg-query-driver-580-partly-held.sample.txt")
    )
    assert packages == {
        "libnvidia-compute-580": {"version": "580.142-0ubuntu0.24.04.1", "held": False},
        "nvidia-dkms-580-open": {"version": "580.142-0ubuntu0.24.04.1", "held": False},
        "nvidia-driver-580-open": {"version": "580.142-0ubuntu0.24.04.1", "held": True},
    }


def test_driver_packages_none_installed() -> None:
    assert process(driver.DriverPackages, "") == {}


def test_driver_packages_command_answers_absence_without_failing() -> None:
    command = driver.DriverPackages().command()
    assert command.startswith("dpkg-query -W ")
    assert command.endswith("2>/dev/null || true")
    assert "'libnvidia-compute*'" in command


def test_nvidia_smi_reads_gb10() -> None:
    assert process(driver.NvidiaSmi, captured("public-nvidia-smi-gb10-query.txt")) == {
        "name": "NVIDIA GB10",
        "driver_version": "580.159.03",
        "compute_cap": "12.1",
    }


@pytest.mark.parametrize("output", ["", captured("public-nvidia-smi-no-driver.txt")])
def test_nvidia_smi_absent_or_without_driver_is_none(output: str) -> None:
    assert process(driver.NvidiaSmi, output) is None


def test_nvml_mismatch_names_the_library_version() -> None:
    # The capture's second line: "NVML library version: 570.124".
    output = captured("issue-nvidia-smi-version-mismatch.txt")
    assert process(driver.NvmlMismatch, output) == "570.124"
    assert process(driver.NvidiaSmi, output) is None  # no CSV to read


@pytest.mark.parametrize(
    "output",
    ["", captured("public-nvidia-smi-no-driver.txt"), captured("public-nvidia-smi-gb10-query.txt")],
)
def test_no_nvml_mismatch_is_none(output: str) -> None:
    assert process(driver.NvmlMismatch, output) is None


def test_nvml_mismatch_without_the_library_line_is_empty() -> None:
    first = captured("issue-nvidia-smi-version-mismatch.txt").splitlines()[0]
    assert process(driver.NvmlMismatch, first) == ""


def test_nvml_mismatch_command_keeps_nvidia_smis_complaint() -> None:
    command = driver.NvmlMismatch().command()
    assert command.startswith("nvidia-smi --query-gpu=") and command.endswith("2>&1 || true")


def test_family_patterns_spare_the_container_toolkit() -> None:
    toolkit = [
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
        "libnvidia-container-tools",
        "libnvidia-container1",
        "nvidia-driver-assistant",
    ]
    for name in toolkit:
        assert not any(fnmatch.fnmatchcase(name, p) for p in driver.DRIVER_FAMILY), name
    for name in [
        "nvidia-driver-580-open",
        "nvidia-driver-open",
        "libnvidia-compute",
        "libnvidia-gl-590",
    ]:
        assert any(fnmatch.fnmatchcase(name, p) for p in driver.DRIVER_FAMILY), name


def test_fresh_host_gets_pin_then_install_then_hold() -> None:
    host = FakeHost({driver.DriverPackages: "", driver.NvidiaSmi: "", **file_facts({PIN: None})})
    commands = run_op(driver.branch_held, 580, "nvidia-driver-580-open", host=host)
    assert commands[0].startswith("FileUploadCommand(") and PIN in commands[0]
    install = next(i for i, c in enumerate(commands) if "install -y" in c)
    assert commands[install] == (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive"
        " apt-get -o DPkg::Lock::Timeout=600 install -y"
        " -o Dpkg::Options::=--force-confdef"
        " -o Dpkg::Options::=--force-confold nvidia-driver-580-open"
    )
    assert HOLD in commands[install + 1] and "$3 ~ /^580\\./" in commands[install + 1]
    assert len(commands) == install + 2
    pin = host.uploads[PIN]
    assert "Pin: version 580.*\nPin-Priority: 990" in pin
    assert "Pin: version *\nPin-Priority: -1" in pin


def test_held_and_pinned_host_yields_nothing() -> None:
    host = FakeHost(
        {
            driver.DriverPackages: captured("lab-dpkg-query-driver-580-held.txt"),
            driver.NvidiaSmi: captured("public-nvidia-smi-gb10-query.txt"),
            **file_facts({PIN: pin_text()}),
        }
    )
    assert run_op(driver.branch_held, 580, "nvidia-driver-580-open", host=host) == []
    assert "driver packages of branch 580 are installed and held" in host.noops


def test_installed_but_partly_held_only_holds() -> None:
    host = FakeHost(
        {
            driver.DriverPackages: captured("dpkg-query-driver-580-partly-held.sample.txt"),
            driver.NvidiaSmi: "",
            **file_facts({PIN: pin_text()}),
        }
    )
    commands = run_op(driver.branch_held, 580, "nvidia-driver-580-open", host=host)
    assert len(commands) == 1 and HOLD in commands[0]


NEWER = "580.159.03-0ubuntu1"  # a later 580 build than the lab capture's 580.142


def held_580(facts: dict[Any, str] | None = None) -> FakeHost:
    """The lab's box after a deploy: 580.142 installed and held, pinned, its driver loaded."""
    return FakeHost(
        {
            driver.DriverPackages: captured("lab-dpkg-query-driver-580-held.txt"),
            driver.NvidiaSmi: captured("public-nvidia-smi-gb10-query.txt"),
            **file_facts({PIN: pin_text()}),
            **(facts or {}),
        }
    )


def test_a_newer_build_asked_moves_every_driver_package_past_its_hold_then_holds() -> None:
    commands = run_op(driver.branch_held, 580, "nvidia-driver-580-open", NEWER, host=held_580())
    # The capture's two packages, both at 580.142-0ubuntu1, each asked at the newer build.
    assert commands[0] == (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive"
        " apt-get -o DPkg::Lock::Timeout=600 install -y"
        " -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
        " --allow-downgrades --allow-change-held-packages"
        f" libnvidia-compute-580={NEWER} nvidia-driver-580-open={NEWER}"
    )
    assert HOLD in commands[1] and "$3 ~ /^580\\./" in commands[1]
    assert len(commands) == 2


def test_a_package_named_after_its_build_is_left_to_the_drivers_dependencies() -> None:
    # Ubuntu names its firmware package after the build: nvidia-firmware-580-580.95.05.
    firmware = "hi\tnvidia-firmware-580-580.142\t580.142-0ubuntu1\n"
    installed = captured("lab-dpkg-query-driver-580-held.txt") + firmware
    host = held_580({driver.DriverPackages: installed})
    commands = run_op(driver.branch_held, 580, "nvidia-driver-580-open", NEWER, host=host)
    assert commands[0].endswith(f"libnvidia-compute-580={NEWER} nvidia-driver-580-open={NEWER}")


def test_the_build_asked_already_installed_and_held_yields_nothing() -> None:
    installed = captured("lab-dpkg-query-driver-580-held.txt").replace("580.142-0ubuntu1", NEWER)
    host = held_580({driver.DriverPackages: installed})
    assert run_op(driver.branch_held, 580, "nvidia-driver-580-open", NEWER, host=host) == []
    assert f"driver packages of branch 580 are installed at {NEWER} and held" in host.noops


def test_a_fresh_host_gets_the_build_asked() -> None:
    host = FakeHost({driver.DriverPackages: "", driver.NvidiaSmi: "", **file_facts({PIN: None})})
    commands = run_op(driver.branch_held, 580, "nvidia-driver-580-open", NEWER, host=host)
    install = next(c for c in commands if "install -y" in c)
    assert install.endswith(f"--force-confold nvidia-driver-580-open={NEWER}")


def test_a_version_of_another_branch_stops_this_box_alone() -> None:
    # The inventory refuses it before connecting (bad_inputs/driver_version_590.json); given
    # anyway, it fails this box (a failed command), not the run (an exception would).
    commands = run_op(
        driver.branch_held, 580, "nvidia-driver-580-open", "590.48.01-0ubuntu1", host=FakeHost({})
    )
    assert refusal(commands) == (
        "spark-test: driver_version 590.48.01-0ubuntu1 is not of branch 580; use None or a 580.x"
        " build"
    )


def test_an_installed_580_flavour_is_kept() -> None:
    # The closed-module flavour is installed: no -open package is forced on top of it.
    output = captured("lab-dpkg-query-driver-580-held.txt").replace(
        "nvidia-driver-580-open", "nvidia-driver-580"
    )
    host = FakeHost(
        {driver.DriverPackages: output, driver.NvidiaSmi: "", **file_facts({PIN: pin_text()})}
    )
    assert run_op(driver.branch_held, 580, "nvidia-driver-580-open", host=host) == []


def test_590_packages_are_refused_with_the_way_back() -> None:
    host = FakeHost(
        {driver.DriverPackages: captured("dpkg-query-driver-590.sample.txt"), driver.NvidiaSmi: ""}
    )
    message = refusal(run_op(driver.branch_held, 580, "nvidia-driver-580-open", host=host))
    assert message.startswith("spark-test: ")
    assert "nvidia-driver-open 590.48.01-0ubuntu0.24.04.1" in message
    assert (
        "apt-get purge libnvidia-compute-590 nvidia-driver-590-open nvidia-driver-open" in message
    )
    assert "apt-get install nvidia-driver-580-open; reboot" in message


def test_a_branch_name_other_than_ours_is_refused_whatever_its_version() -> None:
    output = "ii \tlibnvidia-gl-590\t580.142-0ubuntu0.24.04.1\n"
    host = FakeHost({driver.DriverPackages: output, driver.NvidiaSmi: ""})
    assert re.search(
        "libnvidia-gl-590",
        refusal(run_op(driver.branch_held, 580, "nvidia-driver-580-open", host=host)),
    )


def test_a_package_argument_of_another_branch_stops_this_box_alone() -> None:
    # As the version above (bad_inputs/driver_package_590.json); both at once, both said.
    commands = run_op(
        driver.branch_held, 580, "nvidia-driver-590-open", "590.1-1", host=FakeHost({})
    )
    assert refusal(commands) == (
        "spark-test: driver_package nvidia-driver-590-open is not of branch 580; use"
        " nvidia-driver-580-open; driver_version 590.1-1 is not of branch 580; use None or a"
        " 580.x build"
    )


def test_a_loaded_driver_of_another_branch_is_refused() -> None:
    smi = captured("public-nvidia-smi-gb10-query.txt").replace("580.159.03", "590.48.01")
    host = FakeHost(
        {
            driver.DriverPackages: captured("lab-dpkg-query-driver-580-held.txt"),
            driver.NvidiaSmi: smi,
        }
    )
    assert re.search(
        r"reports driver 590\.48\.01 loaded, not branch 580",
        refusal(run_op(driver.branch_held, 580, "nvidia-driver-580-open", host=host)),
    )


def test_running_driver_of_the_branch_yields_nothing() -> None:
    host = FakeHost({driver.NvidiaSmi: captured("public-nvidia-smi-gb10-query.txt")})
    assert run_op(driver.running, 580, host=host) == []
    assert host.noops == ["NVIDIA GB10 runs driver 580.159.03"]


def test_running_without_an_answer_yields_a_check_that_asks_for_a_reboot() -> None:
    no_driver = captured("public-nvidia-smi-no-driver.txt")
    host = FakeHost({driver.NvidiaSmi: no_driver, driver.NvmlMismatch: no_driver})
    (check,) = run_op(driver.running, 580, host=host)
    assert "grep -q '^580\\.'" in check
    assert "reboot" in check and check.endswith(">&2; false; }")


def test_running_after_an_upgrade_changes_nothing_and_asks_for_a_reboot() -> None:
    mismatch = captured("issue-nvidia-smi-version-mismatch.txt")
    host = LoggingHost({driver.NvidiaSmi: mismatch, driver.NvmlMismatch: mismatch})
    assert run_op(driver.running, 580, host=host) == []
    (warning,) = host.logged
    assert "NVML 570.124" in warning and "reboot this box to load the installed driver" in warning


def test_running_another_branch_is_refused() -> None:
    smi = captured("public-nvidia-smi-gb10-query.txt").replace("580.159.03", "590.48.01")
    assert re.search(
        r"590\.48\.01", refusal(run_op(driver.running, 580, host=FakeHost({driver.NvidiaSmi: smi})))
    )


# The pin under real apt (see private_apt): stand-ins named and versioned as Ubuntu's and NVIDIA's.

PACKAGES = [
    ("nvidia-driver-580-open", "580.142-0ubuntu1", "libnvidia-compute-580 (= 580.142-0ubuntu1)"),
    ("nvidia-driver-580-open", "580.150-0ubuntu1", "libnvidia-compute-580 (= 580.150-0ubuntu1)"),
    ("libnvidia-compute-580", "580.142-0ubuntu1", ""),
    ("libnvidia-compute-580", "580.150-0ubuntu1", ""),
    ("nvidia-driver-590-open", "590.48.01-0ubuntu1", "libnvidia-compute-590"),
    ("libnvidia-compute-590", "590.48.01-0ubuntu1", ""),
    ("nvidia-driver-open", "590.48.01-0ubuntu1", "nvidia-driver-590-open"),
    (
        "nvidia-container-toolkit",
        "1.19.0-1",
        "nvidia-container-toolkit-base (= 1.19.0-1), libnvidia-container-tools (>= 1.19.0-1)",
    ),
    ("nvidia-container-toolkit-base", "1.19.0-1", ""),
    ("libnvidia-container-tools", "1.19.0-1", "libnvidia-container1 (>= 1.19.0-1)"),
    ("libnvidia-container1", "1.19.0-1", ""),
]
INSTALLED_580 = """\
Package: nvidia-driver-580-open
Status: install ok installed
Architecture: all
Version: 580.142-0ubuntu1
Depends: libnvidia-compute-580 (= 580.142-0ubuntu1)

Package: libnvidia-compute-580
Status: install ok installed
Architecture: all
Version: 580.142-0ubuntu1
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    private_apt.require_tools()
    return private_apt.build_repo(tmp_path_factory.mktemp("apt"), PACKAGES)


def apt(repo: Path, name: str, preferences: str, status: str = "") -> private_apt.PrivateApt:
    sources = f"deb [trusted=yes] file:{repo}/$(ARCH) /\n"
    apt = private_apt.PrivateApt(repo.parent / name, sources, preferences, status)
    apt.run("apt-get update")
    return apt


def test_without_the_pin_the_metapackage_would_bring_590(repo: Path) -> None:
    # The control: proves the repository would move the box, so the pinned tests mean something.
    unpinned = apt(repo, "unpinned", "")
    assert "Inst nvidia-driver-590-open" in unpinned.run("apt-get install -s nvidia-driver-open")


def test_the_pin_refuses_590_and_allows_580_and_the_toolkit(repo: Path) -> None:
    pinned = apt(repo, "fresh", pin_text())
    metapackage = pinned.run("apt-get install -s nvidia-driver-open", check=False)
    assert "Inst nvidia-driver-590-open" not in metapackage
    assert "has no installation candidate" in metapackage
    policy = pinned.run("apt-cache policy nvidia-driver-590-open libnvidia-container1")
    assert "nvidia-driver-590-open:\n  Installed: (none)\n  Candidate: (none)" in policy
    assert "libnvidia-container1:\n  Installed: (none)\n  Candidate: 1.19.0-1" in policy
    plan = pinned.run("apt-get install -s nvidia-driver-580-open nvidia-container-toolkit=1.19.0-1")
    for package in (
        "nvidia-driver-580-open (580.150",
        "libnvidia-compute-580 (580.150",
        "nvidia-container-toolkit (1.19.0-1",
        "nvidia-container-toolkit-base (1.19.0-1",
        "libnvidia-container-tools (1.19.0-1",
        "libnvidia-container1 (1.19.0-1",
    ):
        assert f"Inst {package}" in plan, plan


def test_a_held_580_moves_to_the_build_asked_under_real_apt(repo: Path) -> None:
    held = INSTALLED_580.replace("install ok installed", "hold ok installed")
    box = apt(repo, "held", pin_text(), held)
    asked = "580.150-0ubuntu1"  # the repository's other 580 build
    installed = captured("lab-dpkg-query-driver-580-held.txt")  # the same two packages, held
    host = FakeHost(
        {driver.DriverPackages: installed, driver.NvidiaSmi: "", **file_facts({PIN: pin_text()})}
    )
    command = run_op(driver.branch_held, 580, "nvidia-driver-580-open", asked, host=host)[0]
    options = command.split(" install -y ", 1)[1]
    # The control: without leave to change held packages apt refuses (-y: as the deploy asks).
    refused = box.run(
        f"apt-get install -s -y nvidia-driver-580-open={asked} libnvidia-compute-580={asked}",
        check=False,
    )
    assert "E: Held packages were changed and -y was used without" in refused, refused
    plan = box.run(f"apt-get install -s {options}")
    for name in ("nvidia-driver-580-open", "libnvidia-compute-580"):
        assert f"Inst {name} [580.142-0ubuntu1] ({asked}" in plan, plan
    assert "590" not in plan


def test_the_pin_lets_an_installed_580_upgrade_within_its_branch_only(repo: Path) -> None:
    installed = apt(repo, "installed", pin_text(), INSTALLED_580)
    upgrade = installed.run("apt-get -s dist-upgrade")
    assert "Inst nvidia-driver-580-open [580.142-0ubuntu1] (580.150-0ubuntu1" in upgrade
    assert "590" not in upgrade

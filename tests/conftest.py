"""Fixtures shared by the end-to-end tests: one simulated lab per test session."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.simlab import lab as simlab
from tests.simlab.paths import REPO, STATE

# The OpenCode client files the deploy writes (stages/run_summary.py): one folder per lab, whose
# boxes have the same names as another lab's.
CLIENTS = STATE / "clients"

PYINFRA = str(Path(REPO) / ".venv/bin/pyinfra")


def lab_unavailable() -> str | None:
    if os.environ.get("SIMLAB") == "0":
        return "SIMLAB=0: end-to-end tests on the simulated lab are switched off"
    if os.geteuid() != 0:
        return "the simulated lab needs root (namespaces, mounts, systemd-nspawn)"
    return None


# The modules on the shared deployed lab, in two halves, each deployed once by the worker that
# takes it: together they took 2,734 s of one worker in CI (3fd9a17), a unit longer than CI's
# budget allows one worker. Balanced by the seconds each module took (the summary of `make test`
# prints them: "deployed modules"); the half a module is not listed in is the first. CI's run of
# 359162b: 2,686 s and 1,695 s; test_on_demand's 368 s moved here, and test_lanes' lane bench
# cut by about 200 s (its long prompt sized in the llama.cpp lane's own tokens).
DEPLOYED_SECOND_HALF = frozenset(
    f"tests/e2e/test_{name}.py"
    for name in (
        "metrics",
        "netplan",
        "on_demand",
        "reboot",
        "reprovision",
        "router",
        "teardown",
        "tls",
        "weights",
    )
)

# Modules that deploy over the lab the module named beside them leaves, in the same unit right
# after it, instead of from bare: test_mp_turn's inventory is test_cluster's last one with its
# cluster lane made smaller and a lane added (a deploy from bare took 184 s of a CI worker).
CONTINUES = {"tests/e2e/test_mp_turn.py": "tests/e2e/test_cluster.py"}


def work_unit(item: pytest.Item) -> str:
    """What runs on one lab in one go: the modules on a shared deployed lab (deployed from
    bare once, not reimaged between them by a module that needs bare boxes), in two halves;
    a module that continues another's lab (CONTINUES), with it; else the test's module."""
    module = item.nodeid.split("::", 1)[0]
    if "deployed_lab" in getattr(item, "fixturenames", ()):
        return "deployed-2" if module in DEPLOYED_SECOND_HALF else "deployed-1"
    return CONTINUES.get(module, module)


def work_rank(item: pytest.Item) -> int:
    """When a unit is handed out (pytest-xdist's loadgroup gives a worker the next unit in the
    order collected once it is two tests from the end of its own): the longest first, the
    shortest last so they fill whichever worker ends first. The deployed halves first; then the
    other lab modules; then those that boot boxes cabled otherwise (`recabled`), so the
    session's pair is booted again (half a minute) only where a module after them needs it;
    the unit tests last, seconds each."""
    if work_unit(item).startswith("deployed"):
        return 0
    if item.get_closest_marker("recabled"):
        return 2
    return 1 if item.get_closest_marker("lab") else 3


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `make test` runs three pytest-xdist workers, a lab each, taking whole units (work_rank).
    rank = {item.nodeid: work_rank(item) for item in items}
    items.sort(key=lambda item: rank[item.nodeid])
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item)))
    reason = lab_unavailable()
    if reason:
        for item in items:
            if "lab" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


# A run that skips the lab proves nothing about what the deploy does to a host: it says so in
# capitals, and as root (CI runs as root, and so can the lab) it fails. `make unit` is the way
# to run only the unit tests: it deselects the lab tests instead of skipping them.
_lab_skipped: list[str] = []
# Seconds each work unit took, by worker (setup, call and teardown summed): what balancing the
# the workers (work_rank) is judged by, printed at the end of `make test`.
_unit_seconds: dict[tuple[str, str], float] = {}
# And the modules of the deployed halves (DEPLOYED_SECOND_HALF is balanced by them).
_deployed_module_seconds: dict[tuple[str, str], float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "lab" in report.keywords and report.when in ("setup", "call"):
        _lab_skipped.append(report.nodeid)
    worker = getattr(getattr(report, "node", None), "gateway", None)
    if worker is not None and "@" in report.nodeid:  # from a worker of `make test` (loadgroup)
        unit = report.nodeid.rpartition("@")[2]
        key = (worker.id, unit)
        _unit_seconds[key] = _unit_seconds.get(key, 0.0) + report.duration
        if unit.startswith("deployed"):
            key = (unit, report.nodeid.split("::", 1)[0])
            _deployed_module_seconds[key] = _deployed_module_seconds.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _unit_seconds and config.getoption("dist", None) == "loadgroup":
        terminalreporter.section("work units by worker, seconds")
        for worker in sorted({worker for worker, _ in _unit_seconds}):
            units = {u: t for (w, u), t in _unit_seconds.items() if w == worker}
            lab_units = sorted((t, u) for u, t in units.items() if t >= 10)
            terminalreporter.line(
                f"{worker}: {sum(units.values()):.0f} s in {len(units)} units; of 10 s or more: "
                + ", ".join(f"{u} {t:.0f}" for t, u in reversed(lab_units))
            )
        terminalreporter.section("deployed modules, seconds")
        for half in sorted({half for half, _ in _deployed_module_seconds}):
            modules = sorted((t, m) for (h, m), t in _deployed_module_seconds.items() if h == half)
            terminalreporter.line(
                f"{half}: " + ", ".join(f"{m} {t:.0f}" for t, m in reversed(modules))
            )
    if _lab_skipped:
        terminalreporter.section("LAB TESTS SKIPPED", sep="!", red=True, bold=True)
        terminalreporter.line(
            f"{len(_lab_skipped)} end-to-end tests on the simulated lab did not run "
            f"({lab_unavailable() or 'skipped inside the test'}), e.g. {_lab_skipped[0]}",
            red=True,
        )
        if must_run_lab():
            terminalreporter.line("as root (or in CI) every lab test must run: failing", red=True)


def must_run_lab() -> bool:
    return os.geteuid() == 0 or os.environ.get("CI", "").lower() in ("1", "true")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _lab_skipped and must_run_lab() and exitstatus == 0:
        session.exitstatus = 1


@pytest.fixture(scope="session")
def lab() -> Iterator[simlab.Lab]:
    """Two bare Sparks, booted once per session and torn down at its end, failure or not."""
    try:
        yield simlab.up(2)
    finally:
        simlab.down()


@dataclass
class Deployed:
    """The session's lab deployed as the repository's inventory and group_data say, and what
    the deploy that left it so printed."""

    lab: simlab.Lab
    output: str


# Whether the lab is as a deploy of the default inventory left it, with nothing failed since:
# reimage_all() and a failed module reset it.
_as_deployed = False


@pytest.fixture(scope="module")
def deployed_lab(lab: simlab.Lab, request: pytest.FixtureRequest) -> Iterator[Deployed]:
    """The lab deployed with the default inventory, shared by the modules that leave it as
    they found it: deployed from bare once (a minute and a half), then for each later module
    only deployed again (seconds), which repairs whatever the module before changed by hand
    and proves that deploy is as good as the first. A module that failed, or anything that
    reimaged the boxes in between, makes the next one start from bare again."""
    global _as_deployed
    (STATE / "hf-token").unlink(missing_ok=True)  # the default: no token for gated models
    if not _as_deployed:
        reimage_all(lab)
    result = pyinfra("inventories/sim.py", "deploy.py")
    _as_deployed = True
    failed_before = request.session.testsfailed
    yield Deployed(lab, result.stdout + result.stderr)
    if request.session.testsfailed != failed_before:
        _as_deployed = False


# Whether cabled() left its own boxes up in place of the session's.
_recabled = False


def reimage_all(lab: simlab.Lab) -> simlab.Lab:
    """Every host of the session's lab back to the bare image (about 5 s), trusted again; the
    deploy pulls the serving image from the lab's registry, as on a Spark."""
    global _as_deployed, _recabled
    _as_deployed = False
    if _recabled:  # booted bare again, as cabled as before
        lab.hosts[:] = _booted_bare(len(lab.hosts), lab.cabling).hosts
        _recabled = False
        return lab
    for host in lab.hosts:
        simlab.reimage(host.name)
    simlab.write_ssh_files(lab)
    for host in lab.hosts:
        simlab.wait_ready(host, time.monotonic() + simlab.BOOT_TIMEOUT)
    return lab


def cabled(
    lab: simlab.Lab,
    cabling: str,
    count: int | None = None,
    switch_ports: tuple[int, ...] | None = None,
) -> simlab.Lab:
    """The session's boxes booted bare again (or `count` bare boxes), cabled as `cabling`
    (simlab.CABLINGS; a switch on `switch_ports`). They stay up after the module: the
    next reimage_all() boots the session's boxes again (modules marked `recabled` run last)."""
    global _as_deployed, _recabled
    _as_deployed, _recabled = False, True
    return _booted_bare(count or len(lab.hosts), cabling, switch_ports)


def _booted_bare(
    count: int, cabling: str, switch_ports: tuple[int, ...] | None = None
) -> simlab.Lab:
    """`count` bare boxes cabled as `cabling`, in place of the lab that was up."""
    return simlab.up(count, cabling=cabling, switch_ports=switch_ports)


def run_on(host: simlab.Host, command: str, check: bool = True) -> str:
    """A command's stdout on a lab host, as its admin user (prefix sudo yourself)."""
    return simlab.ssh(host, command, check=check)


def pyinfra(
    *args: str, check: bool = True, timeout: float = 900, typed: bool = False
) -> subprocess.CompletedProcess:
    """The real pyinfra CLI, as a user runs it from the repository root: with -y, or ``typed``
    as the README shows it, without: pyinfra then shows the changes it detected and waits for
    Enter (given on stdin) before it changes anything."""
    feed = {"input": "\n"} if typed else {"stdin": subprocess.DEVNULL}
    result = subprocess.run(
        [PYINFRA, *["-y"] * (not typed), *args], cwd=REPO, capture_output=True, text=True,
        timeout=timeout, **feed,
        env=dict(os.environ, SIMLAB_STATE=str(STATE), SPARK_CLIENTS_DIR=str(CLIENTS)),
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"pyinfra {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result

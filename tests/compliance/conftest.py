"""Compliance checks: is every box still as the deploy left it? Read-only.

    .venv/bin/python -m pytest tests/compliance --inventory inventories/lab.py
    .venv/bin/python -m pytest tests/compliance --inventory inventories/lab.py --limit spark-2.local
    .venv/bin/python -m pytest tests/compliance --inventory inventories/lab.py -n 4 --dist loadgroup

Run from the repository root. The inventory is loaded as the pyinfra CLI loads it (group_data/
applied) and validated by operations.config, so the expected values are the deploy's own. Each
box is reached over the SSH connection pyinfra itself opens for it (address, user, port, key,
known_hosts and host key policy from the inventory), with sudo when the inventory sets `_sudo`;
the checks only read. With pytest-xdist (`-n N`, add `-p xdist` when plugin autoloading is off),
`--dist loadgroup` keeps each box's checks on one worker: one connection per box. The run ends
with a table: check by box, PASS or FAIL with the value found.

The suite runs only when tests/compliance is named on the command line: `pytest tests` (the
project's own tests) does not reach for the boxes of the default inventory.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from fnmatch import fnmatch
from pathlib import Path
from unittest import mock

import paramiko
import pytest
from pyinfra.api import Config, State
from pyinfra.api.exceptions import NoGroupError, PyinfraError
from pyinfra.api.host import Host as PyinfraHost
from pyinfra.api.inventory import Inventory
from testinfra.backend.base import CommandResult
from testinfra.backend.paramiko import ParamikoBackend
from testinfra.host import Host as TestinfraHost

from spark.inventory import FabricLink, HostConfig, SparkConfig
from spark.plan import BoxPlan
from stages.settings import InventoryRefused, plan, read_inventory
from stages.settings import load as load_config

# pyinfra_cli's __init__ monkey-patches the whole process for gevent, and pytest-xdist's workers
# then hang (their queue waits on a gevent event fed by a real thread). The inventory loader
# needs no patching: pyinfra's API runs unpatched, one connection at a time here.
with mock.patch("gevent.monkey.patch_all"):
    import pyinfra_cli  # noqa: F401 - stages.settings.read_inventory uses it, unpatched

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CELL_WIDTH = 48  # a found value longer than this is cut in the table (the failure shows it all)
BOXES = pytest.StashKey[list["Box"]]()


class Unreachable(Exception):
    """The box could not be reached (or sudo refused): every check of it errors with this."""


class InventoryBackend(ParamikoBackend):
    """testinfra's paramiko backend on the SSH client pyinfra opens for an inventory host,
    so the checks connect exactly as the deploy does (host key checking included)."""

    def __init__(self, host: PyinfraHost, sudo: bool):
        super().__init__(host.name, sudo=sudo)
        self.pyinfra_host = host

    @functools.cached_property
    def client(self) -> paramiko.SSHClient:
        self.pyinfra_host.connector.connect()
        return self.pyinfra_host.connector.client

    def get_sudo_command(self, command: str, sudo_user: str | None) -> str:
        # -n: a sudo that wants a password fails at once instead of waiting for one.
        return self.quote("sudo -n /bin/sh -c %s", command)


class Box:
    """One box of the inventory: its plan (the values the deploy made it to), its validated
    configuration, and a lazy testinfra host."""

    def __init__(self, host: PyinfraHost, spark: SparkConfig, plan: BoxPlan):
        self.name = host.name
        self.plan = plan
        self.config: HostConfig = spark.host(host.name)
        self.cluster_lane = spark.cluster_lane
        self._pyinfra_host = host
        self._testinfra: TestinfraHost | None = None
        self._failure: str | None = None
        self._outputs: dict[str, CommandResult] = {}

    def __repr__(self) -> str:
        return self.name

    @property
    def host(self) -> TestinfraHost:
        """The testinfra host, connected on first use; a failure is kept, not retried."""
        if self._failure:
            raise Unreachable(self._failure)
        if self._testinfra is None:
            sudo = bool(self._pyinfra_host.data.get("_sudo"))
            host = TestinfraHost(InventoryBackend(self._pyinfra_host, sudo))
            host.backend.set_host(host)
            try:
                result = host.run("true")
            except (PyinfraError, paramiko.SSHException, OSError, EOFError) as error:
                self._failure = f"cannot connect: {error}"
                raise Unreachable(self._failure) from error
            if result.rc != 0:
                self._failure = (
                    f"`true` failed{' under sudo' if sudo else ''}: {result.stderr.strip()}"
                    " (the checks need sudo without a password)"
                )
                raise Unreachable(self._failure)
            self._testinfra = host
        return self._testinfra

    def run(self, command: str) -> CommandResult:
        """A command's result, run once per session (several checks read one answer)."""
        if command not in self._outputs:
            self._outputs[command] = self.host.run(command)
        return self._outputs[command]

    def packages(self, *patterns: str) -> dict[str, tuple[str, bool]]:
        """Installed packages matching dpkg-query's glob patterns: {name: (version, held)}.
        dpkg itself keeps the holds (apt-mark's too); apt-mark would rewrite apt's cache."""
        output = self.run(
            "dpkg-query -W -f='${db:Status-Status} ${db:Status-Want} ${Package} ${Version}\\n' "
            + " ".join(shlex.quote(pattern) for pattern in patterns)
            + " 2>/dev/null"  # it exits 1 when a pattern matches no package: an answer
        ).stdout
        return {
            name: (version, want == "hold")
            for status, want, name, version in (line.split(" ", 3) for line in output.splitlines())
            if status == "installed"
        }

    def close(self) -> None:
        if self._testinfra is not None:
            self._testinfra.backend.client.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("compliance", "compliance of the boxes of a pyinfra inventory")
    group.addoption(
        "--inventory",
        default="inventories/lab.py",
        help="the pyinfra inventory whose boxes are checked (default: inventories/lab.py)",
    )
    group.addoption(
        "--limit",
        action="append",
        default=[],
        metavar="HOST",
        help="check only these boxes: a name, a glob or an inventory group, as pyinfra's"
        " --limit; repeat it or give a comma list",
    )


def suite_requested(config: pytest.Config) -> bool:
    """Whether tests/compliance (or a file or test in it) is named on the command line."""
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.parent == HERE and not suite_requested(config):
        return True
    return None  # not False: that would overrule every other plugin's ignoring


def limited(inventory: Inventory, patterns: list[str]) -> list[PyinfraHost]:
    """The hosts --limit picks, as pyinfra's --limit does (a group, else a name glob)."""
    patterns = [pattern for option in patterns for pattern in option.split(",") if pattern]
    if not patterns:
        return list(inventory)
    chosen = set()
    for pattern in patterns:
        try:
            hosts = inventory.get_group(pattern)
        except NoGroupError:
            hosts = [host for host in inventory if fnmatch(host.name, pattern)]
        if not hosts:
            names = ", ".join(host.name for host in inventory)
            raise pytest.UsageError(f"--limit {pattern}: no host or group matches ({names})")
        chosen.update(hosts)
    return [host for host in inventory if host in chosen]


def pytest_configure(config: pytest.Config) -> None:
    if not suite_requested(config):
        return
    state = State()
    state.cwd = str(REPO)  # relative ssh_key paths resolve as for the deploy
    try:
        inventory = read_inventory(config.getoption("inventory"), state)
        # The whole inventory: a worker box's environment names the head even under --limit.
        spark = load_config(inventory)
    except InventoryRefused as error:
        raise pytest.UsageError(str(error)) from None
    # Registered here too, for runs without xdist (`-p no:xdist`) under --strict-markers.
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one xdist worker")
    state.init(inventory, Config())  # gives each host its SSH connector
    hosts = limited(inventory, config.getoption("limit"))
    planned = plan(inventory)
    config.stash[BOXES] = [Box(host, spark, planned.box(host.name)) for host in hosts]


def pytest_unconfigure(config: pytest.Config) -> None:
    for box in config.stash.get(BOXES, []):
        box.close()


def _param(box: Box, *values: object, test_id: str) -> object:
    # One xdist group per box: with --dist loadgroup its checks share one worker and connection.
    return pytest.param(box, *values, id=test_id, marks=pytest.mark.xdist_group(box.name))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    boxes = metafunc.config.stash.get(BOXES, [])
    if "link" in metafunc.fixturenames:
        params = [
            _param(box, link, test_id=f"{box.name}-{link.ifname}")
            for box in boxes
            for link in (box.plan.fabric.links if box.plan.fabric else ())
        ]
        metafunc.parametrize(("box", "link"), params)
    elif "box" in metafunc.fixturenames:
        metafunc.parametrize("box", [_param(box, test_id=box.name) for box in boxes])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if not params or not isinstance(params.get("box"), Box):
            continue
        label = (item.function.__doc__ or item.name).strip().splitlines()[0]
        link: FabricLink | None = params.get("link")
        if link is not None:
            label = label.format(ifname=link.ifname, hca=link.hca)
        # Carried by every report of the test, also from xdist workers to the controller.
        item.user_properties += [("box", params["box"].name), ("check", label)]


@pytest.fixture(autouse=True)
def _reachable(request: pytest.FixtureRequest) -> None:
    """Connect at setup: the checks of a box that cannot be reached are not run (skipped, so
    that pytest lists none of them), and the box is named once, before the table
    (``unreachable``); the run fails (pytest_sessionfinish)."""
    params = getattr(request.node, "callspec", None) and request.node.callspec.params
    if not (params and isinstance(params.get("box"), Box)):
        return
    try:
        params["box"].host  # noqa: B018 (connects)
    except Unreachable as error:
        reason = str(error)
    else:
        return
    request.node.user_properties.append((UNREACHABLE, reason))  # carried by the report
    pytest.skip(reason)


@pytest.fixture
def found(request: pytest.FixtureRequest) -> Callable[[object], None]:
    """Record the value a check found, for the table (call it before asserting)."""

    def record(value: object) -> None:
        request.node.user_properties.append(("found", str(value)))

    return record


@pytest.fixture
def note(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Say something in the table of a check that passes (a PASS worth a second look)."""

    def record(text: str) -> None:
        request.node.user_properties.append(("note", text))

    return record


@pytest.fixture
def every_box(request: pytest.FixtureRequest, note: Callable[[str], None]) -> list[Box]:
    """Every box checked (--limit narrows them), for a check that compares the boxes; noted
    where one box alone is checked."""
    boxes = request.config.stash[BOXES]
    if len(boxes) < 2:
        note("one box checked: no other to compare")
    return boxes


def pytest_report_header(config: pytest.Config) -> list[str]:
    boxes = config.stash.get(BOXES, [])
    if not boxes:
        return []
    names = ", ".join(box.name for box in boxes)
    return [f"compliance: {config.getoption('inventory')}: {names} (read-only)"]


# --- the table --------------------------------------------------------------------------------

RANK = {"PASS": 0, "SKIP": 1, "FAIL": 2, "ERROR": 3}
UNREACHABLE = "unreachable"  # a report's property: its box could not be reached, and why
EXCEPTION_NAME = re.compile(r"^([\w.]*\.)?\w*(Error|Exception|Unreachable|Failed): ")


def _outcome(report: pytest.TestReport) -> str:
    if report.skipped:
        return "SKIP"
    if report.failed:
        return "FAIL" if report.when == "call" else "ERROR"
    return "PASS"


def _reason(report: pytest.TestReport) -> str:
    """Why a check did not pass or fail: the skip reason, or the exception's message line."""
    if isinstance(report.longrepr, tuple | list):  # a skip: (path, line, "Skipped: why")
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    lines = (crash.message if crash is not None else str(report.longrepr)).strip().splitlines()
    return EXCEPTION_NAME.sub("", lines[0]) if lines else ""


def _cell(outcome: str, detail: str) -> str:
    text = f"{outcome} {detail}" if detail else outcome
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 1] + "…"


def collect_results(reports: Iterator[pytest.TestReport]) -> dict[str, dict[str, str]]:
    """{check: {box: cell}} from the test reports, the worst phase of each test."""
    results: dict[str, dict[str, tuple[str, str]]] = {}
    for report in reports:
        properties = dict(report.user_properties)
        if "box" not in properties or UNREACHABLE in properties:
            continue
        outcome = _outcome(report)
        detail = properties.get({"FAIL": "found", "PASS": "note"}.get(outcome, ""))
        detail = detail or ("" if outcome == "PASS" else _reason(report))
        row = results.setdefault(properties["check"], {})
        previous = row.get(properties["box"], ("PASS", ""))
        if RANK[outcome] >= RANK[previous[0]]:
            row[properties["box"]] = (outcome, detail)
    return {
        check: {box: _cell(*result) for box, result in row.items()}
        for check, row in results.items()
    }


def format_table(results: dict[str, dict[str, str]], boxes: list[str]) -> list[str]:
    header = ["check", *boxes]
    body = [[check, *(row.get(box, "-") for box in boxes)] for check, row in results.items()]
    rows = [header, *body]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def unreachable(reports: Iterable[pytest.TestReport]) -> dict[str, str]:
    """{box: why} of the boxes that could not be reached, once each."""
    found: dict[str, str] = {}
    for report in reports:
        properties = dict(report.user_properties)
        if UNREACHABLE in properties:
            found.setdefault(properties["box"], properties[UNREACHABLE])
    return found


def _reports(terminalreporter: pytest.TerminalReporter) -> list[pytest.TestReport]:
    return [
        report
        for reports in terminalreporter.stats.values()
        for report in reports
        if isinstance(report, pytest.TestReport)
    ]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> Generator[None]:
    # Around pytest's own summary (its failures, then its short summary), so the table is last.
    result = yield
    reports = _reports(terminalreporter)
    lost = unreachable(reports)
    results = collect_results(reports)
    if not (results or lost):
        return result
    terminalreporter.section(f"compliance: {config.getoption('inventory')}")
    for box, why in lost.items():
        terminalreporter.write_line(f"{box}: not checked: {why}", red=True)
    boxes = [box.name for box in config.stash.get(BOXES, []) if box.name not in lost]
    if not results:
        return result
    for line in format_table(results, boxes):
        terminalreporter.write_line(line)
    outcomes = Counter(cell.split()[0] for row in results.values() for cell in row.values())
    counts = ", ".join(f"{outcomes[outcome]} {outcome}" for outcome in RANK if outcomes[outcome])
    terminalreporter.write_line(f"{len(boxes)} box(es) x {len(results)} checks: {counts}")
    return result


def pytest_report_teststatus(
    report: pytest.TestReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    """A check of a box that could not be reached is its own kind: counted once in the last
    line ("N unreachable"), listed nowhere (pytest lists its skips one by one)."""
    if report.skipped and UNREACHABLE in dict(report.user_properties):
        return UNREACHABLE, "u", "UNREACHABLE"
    return None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A box that could not be reached fails the run, though its checks were skipped."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if (
        reporter is not None
        and exitstatus == pytest.ExitCode.OK
        and unreachable(_reports(reporter))
    ):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

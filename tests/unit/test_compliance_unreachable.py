"""Compliance against boxes that cannot be reached (tests/compliance/conftest.py): each named
once, its checks not listed one by one, the table last, the run failed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compliance.conftest import UNREACHABLE, collect_results, unreachable

from .test_config import REPO, TWO_SPARKS
from .test_preconnect import closed_port


def report(box: str, outcome: str, *extra: tuple[str, str]) -> pytest.TestReport:
    properties = [("box", box), ("check", "driver held"), *extra]
    longrepr = ("x.py", 1, "Skipped: why") if outcome == "skipped" else None
    return pytest.TestReport(
        f"x.py::check[{box}]", ("x.py", 1, "check"), {}, outcome, longrepr, "setup", [],
        user_properties=properties,
    )  # fmt: skip


def test_an_unreachable_box_is_named_once_and_left_out_of_the_table() -> None:
    why = "cannot connect: Could not connect"
    reports = [
        report("spark-1", "passed"),
        report("spark-2", "skipped", (UNREACHABLE, why)),
        report("spark-2", "skipped", (UNREACHABLE, why)),
    ]

    assert unreachable(reports) == {"spark-2": why}
    assert collect_results(iter(reports)) == {"driver held": {"spark-1": "PASS"}}


def test_compliance_with_every_box_down_says_so_once_per_box(tmp_path: Path) -> None:
    port = closed_port()
    reached = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_connect_retries": 0}
    inventory = tmp_path / "down.py"
    boxes = [(name, reached | data) for name, data in TWO_SPARKS.items()]
    inventory.write_text(f"spark = {boxes!r}\n")

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/compliance", "--inventory", str(inventory),
         "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = run.stdout + run.stderr

    assert run.returncode == 1, output  # not compliant: nothing could be checked
    lines = output.splitlines()
    said = [line for line in lines if f"port {port}" in line]
    assert said == [
        f"{box}: not checked: cannot connect: Could not connect ([Errno None] Unable to connect"
        f" to port {port} on 127.0.0.1)"
        for box in TWO_SPARKS
    ], output
    assert "ERROR" not in output and "SKIPPED" not in output, output
    # The compliance section last: after it only pytest's own count, which says what happened.
    header = next(n for n, line in enumerate(lines) if re.fullmatch(r"=+ compliance: .+ =+", line))
    assert [line for line in lines[header + 1 :] if line.strip()] == [*said, lines[-1]], output
    # Every check collected is counted unreachable, none passed or failed.
    collected = re.search(r"^collected (\d+) items$", output, re.M)
    assert collected, output
    assert re.fullmatch(rf"=+ {collected[1]} unreachable in [\d.]+s =+", lines[-1]), output

"""A run whose lab tests were skipped says so loudly, and fails as root (CI runs as root)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.simlab.paths import REPO

ONE_LAB_TEST = "tests/simlab/test_lab.py::test_hosts_are_bare_sparks"


def run_pytest(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO, capture_output=True, text=True, env=os.environ | env, timeout=120,
    )  # fmt: skip


def test_a_skipped_lab_is_loud_and_fails_where_the_lab_must_run():
    result = run_pytest(ONE_LAB_TEST, SIMLAB="0", CI="true")
    assert "LAB TESTS SKIPPED" in result.stdout
    assert "1 end-to-end tests on the simulated lab did not run (SIMLAB=0" in result.stdout
    assert result.returncode == 1, result.stdout


def test_deselecting_the_lab_is_not_a_skip():
    result = run_pytest("-m", "not lab", ONE_LAB_TEST, "tests/unit/test_util.py", CI="true")
    assert "LAB TESTS SKIPPED" not in result.stdout
    assert result.returncode == 0, result.stdout

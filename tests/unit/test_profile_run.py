"""bench/profile_run.py: each phase's CPU seconds are its pyinfra function's cumulative time,
found by the function's module path and name (cProfile's stats keys, written here by hand);
a function of the same name elsewhere is not counted. The real functions are pinned in
test_pyinfra_internals.py."""

from __future__ import annotations

import cProfile
from types import SimpleNamespace

from bench import profile_run


def test_each_phase_is_its_pyinfra_functions_cumulative_time() -> None:
    # (file, line, function): (primitive calls, calls, own time, cumulative time, callers)
    stats = SimpleNamespace(
        stats={
            ("/v/site-packages/pyinfra/api/operations.py", 377, "run_ops"): (1, 1, 0.01, 0.5, {}),
            ("/v/site-packages/pyinfra_cli/util.py", 242, "load_deploy_file"): (1, 1, 0, 0.25, {}),
            ("/v/site-packages/pyinfra/api/connect.py", 12, "connect_all"): (1, 1, 0, 0.125, {}),
            ("/repo/stages/mine.py", 1, "run_ops"): (1, 1, 0, 9.0, {}),
        }
    )
    assert profile_run.phases(stats) == {
        "inventory and group_data": 0.0,
        "connect": 0.125,
        "deploy.py loaded per box (operations called)": 0.25,
        "operations executed": 0.5,
    }


def reading(lines: int) -> int:
    return sum(range(lines))


def test_the_top_entries_are_pstats_table_from_its_header() -> None:
    profile = cProfile.Profile()
    profile.runcall(reading, 1000)
    text = profile_run.top(profile, 5)
    assert text.startswith(
        "   ncalls  tottime  percall  cumtime  percall filename:lineno(function)"
    )
    assert "(reading)" in text

"""bench/on_demand.py's pure figures, worked out by hand; nothing here is timed and no lab is
booted.

SHOWN is `systemctl show -p InactiveExitTimestampMonotonic,ActiveEnterTimestampMonotonic
spark-lane-fast.service` on a lab host after a start of the lane (the values as the lab gave
them, in microseconds of CLOCK_MONOTONIC)."""

from __future__ import annotations

import pytest

from bench import on_demand

SHOWN = {
    "InactiveExitTimestampMonotonic": "62370431209",
    "ActiveEnterTimestampMonotonic": "62373926702",
}


def test_the_lanes_own_start_is_from_leaving_inactive_to_active() -> None:
    # 62373.926702 - 62370.431209 s
    assert on_demand.own_start(SHOWN, after=62370.0) == pytest.approx(3.495493)


def test_a_start_from_before_the_request_is_refused() -> None:
    # The timestamps are of an earlier start (the deploy's check): not this request's.
    with pytest.raises(RuntimeError, match=r"no start of the lane since 62371\.000 s"):
        on_demand.own_start(SHOWN, after=62371.0)


def test_a_start_that_did_not_reach_active_is_refused() -> None:
    # Left inactive again after the last time it was active: this start never got there.
    failed = SHOWN | {"InactiveExitTimestampMonotonic": "62380000000"}
    with pytest.raises(RuntimeError, match="reached active"):
        on_demand.own_start(failed, after=62370.0)


def test_figures_are_the_medians_and_their_ratio() -> None:
    samples = {
        "on_demand_first_token": [3.9, 3.6, 4.4],
        "start_within_request": [3.5, 3.3, 4.0],
        "warm_first_token": [0.05, 0.04, 0.06],
        "own_start": [3.1, 3.2, 3.0, 5.0],
    }
    assert on_demand.figures(samples) == {
        "medians_s": {
            "on_demand_first_token": 3.9,
            "start_within_request": 3.5,
            "warm_first_token": 0.05,
            "own_start": 3.15,  # (3.1 + 3.2) / 2
        },
        "ratio": 1.238,  # 3.9 / 3.15 = 1.2380...
    }


def test_the_table_gives_each_median_its_samples_the_ratio_and_the_load() -> None:
    results = {
        "samples_s": {
            "on_demand_first_token": [3.9, 3.6],
            "start_within_request": [3.5, 3.3],
            "warm_first_token": [0.05, 0.07],
            "own_start": [3.1, 3.2],
        },
        "medians_s": {
            "on_demand_first_token": 3.75,
            "start_within_request": 3.4,
            "warm_first_token": 0.06,
            "own_start": 3.15,
        },
        "ratio": 1.19,
        "load_average": {"start": 2.5, "end": 3.25, "samples": [4.0, 6.5, 5.0, 3.0]},
    }
    assert on_demand.table(results) == [
        " " * 52 + "  median s  samples",
        "(a) first token of a request that started the lane".ljust(52) + "      3.75  3.90 3.60",
        "    the lane's start within it (systemd)".ljust(52) + "      3.40  3.50 3.30",
        "    the same request again, the lane serving".ljust(52) + "      0.06  0.05 0.07",
        "(b) the lane's own start (unit started directly)".ljust(52) + "      3.15  3.10 3.20",
        "ratio (a) / (b), medians".ljust(52) + "      1.19  load average 2.50 at the start,"
        " 3.25 at the end, 3.00-6.50 over the samples",
    ]

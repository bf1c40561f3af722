"""operations/memguard.py's arguments: what the inventory refuses before connecting, given
anyway, stops that box alone (its other behaviour: tests/unit/test_lanes.py, the memory guard)."""

from __future__ import annotations

import pytest

from operations import memguard
from tests.unit.harness import FakeHost, refusal, run_op


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"min_available_gib": 0}, "memory_guard_min_available_gib must be above 0 (got 0)"),
        ({"lanes": [("Bad Name", 1)]}, "lane names are 1-32 of a-z 0-9 - (got 'Bad Name')"),
    ],
)
def test_each_refusal_alone(changes: dict, said: str) -> None:
    arguments = {"lanes": [("coder", 2)], "min_available_gib": 8.0} | changes
    commands = run_op(memguard.memory_guard, **arguments, host=FakeHost({}))
    assert refusal(commands) == f"spark-test: the memory guard: {said}"


def test_a_floor_of_zero_and_a_bad_lane_name_stop_this_box_alone() -> None:
    # memory_guard_min_available_gib is above 0 and a lane's name a slug (spark/inventory/,
    # spark/lane.py); both problems said at once, nothing asked of the box first.
    commands = run_op(
        memguard.memory_guard,
        lanes=[("coder", 2), ("Fast lane", 1)],
        min_available_gib=0,
        host=FakeHost({}),
    )
    assert refusal(commands) == (
        "spark-test: the memory guard: memory_guard_min_available_gib must be above 0 (got 0);"
        " lane names are 1-32 of a-z 0-9 - (got 'Fast lane')"
    )

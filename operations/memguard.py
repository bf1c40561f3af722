"""The memory guard: stop the lowest-priority vLLM lane before unified memory runs out."""

from __future__ import annotations

import json

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from operations import util
from operations.asked import Question, answer, question
from operations.lanes import PREFIX, unit_name
from spark.lane import SLUG

SERVICE = "spark-memguard.service"
SCRIPT = "/usr/local/lib/spark/memguard.py"
CONFIG = "/etc/spark/memguard.json"


def stop_order(lanes: list[tuple[str, int]]) -> list[dict]:
    """The lanes as the guard stops them: lowest priority first; of equal priorities the one
    started last first (it was the last one to fit)."""
    order = sorted(range(len(lanes)), key=lambda i: (lanes[i][1], -i))
    return [
        {
            "name": lanes[i][0],
            "unit": unit_name(lanes[i][0]),
            "container": PREFIX + lanes[i][0],
            "priority": lanes[i][1],
        }
        for i in order
    ]


@operation()
def memory_guard(
    lanes: list[tuple[str, int]],
    min_available_gib: float,
    script: str = SCRIPT,
    config: str = CONFIG,
):
    """
    Run the memory guard: every second it reads MemAvailable and, below the threshold, stops
    the running lane of the lowest priority, logging why in its journal (spark-memguard).

    + lanes: (name, priority) of each lane in start order; the guard stops the lowest first
    + min_available_gib: the MemAvailable below which a lane is stopped
    + script: where the guard's program goes
    + config: its configuration (threshold and stop order), root:root 0644

    It runs with no lanes too (it then only watches), so it is in place before the first one
    loads. A changed script, configuration or unit restarts it; it holds no state.
    """
    # Both checked before any box is contacted (spark/inventory/: memory_guard_min_available_gib,
    # a lane's name): here they stop this box alone.
    wrong = [
        f"lane names are 1-32 of a-z 0-9 - (got {name!r})"
        for name, _ in lanes
        if not SLUG.fullmatch(name)
    ]
    if not min_available_gib > 0:
        wrong.insert(0, f"memory_guard_min_available_gib must be above 0 (got {min_available_gib})")
    if wrong:
        yield from util.refused(f"{host.name}: the memory guard: {'; '.join(wrong)}")
        return
    settings = {"min_available_gib": min_available_gib, "lanes": stop_order(lanes)}
    unit_path = f"/etc/systemd/system/{SERVICE}"
    found = util.on_box(script, config, unit_path)
    changes = [
        *util.template("spark-memguard.py.j2", script, "755", found),
        *util.template(
            "spark-memguard.json.j2", config, found=found, config=json.dumps(settings, indent=2)
        ),
    ]
    unit = util.template(
        "spark-memguard.service.j2", unit_path, found=found, script=script, config=config
    )
    yield from changes
    yield from unit
    running = answer(SystemdStatus, services=[SERVICE]).get(SERVICE)
    enabled = answer(SystemdEnabled, services=[SERVICE]).get(SERVICE)
    yield from util.unit_started(
        SERVICE,
        unit_changed=bool(unit),
        enabled="enabled" if enabled else None,
        running=bool(running),
        changed=bool(changes or unit),
    )
    if running and enabled and not (changes or unit):
        host.noop(f"{SERVICE} is running")


def questions() -> list[Question]:
    """What ``memory_guard`` reads (operations/asked.py)."""
    return [
        question(util.RootFiles, paths=(SCRIPT, CONFIG, f"/etc/systemd/system/{SERVICE}")),
        question(SystemdStatus, services=[SERVICE]),
        question(SystemdEnabled, services=[SERVICE]),
    ]

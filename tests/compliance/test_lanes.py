"""The lanes: each unit enabled, serving and started after the one before; /health and /v1/models
answer; /v1 refuses a request without the key; the keys root-only; the memory guard watching."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from operations.lanes import LANE_DIR, PREFIX, SECRETS_DIR, UNIT_DIR, key_path, unit_name
from operations.memguard import SERVICE, stop_order

if TYPE_CHECKING:
    from operations.recipes import Lane
    from tests.compliance.conftest import Box


def _http(box: Box, lane: Lane, path: str, with_key: bool) -> tuple[str, str]:
    """(status, body) of a GET to the lane on the box itself; the key, when sent, is read from
    its file on the box and given to curl on its standard input (`-H @-`, curl 7.55 and later),
    so it is in no command line (ps shows argv) and never in this process."""
    url = shlex.quote(f"http://127.0.0.1:{lane.port}{path}")
    curl = "curl -s --max-time 10 -w '\\n%{http_code}'"
    if with_key:
        header = f"{{ printf 'Authorization: Bearer '; cat {key_path(lane.name)}; echo; }}"
        curl = f"{header} | {curl} -H @-"
    result = box.run(f"{curl} {url}")
    body, _, status = result.stdout.rpartition("\n")
    return status.strip() or "no answer", body


def _report(found: Callable[[object], None], problems: list[str], what: str) -> None:
    found("; ".join(problems))
    assert not problems, f"expected {what}, found: {'; '.join(problems)}"


def test_lanes_enabled_active_in_order(box: Box, found: Callable[[object], None]) -> None:
    """lanes enabled, serving, in order"""
    problems, previous = [], None
    for lane in box.config.lanes:
        shown = box.run(f"systemctl show -p ActiveState,UnitFileState,After {unit_name(lane.name)}")
        state = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
        if (state.get("ActiveState"), state.get("UnitFileState")) != ("active", "enabled"):
            problems.append(f"{lane.name} {state.get('ActiveState')} {state.get('UnitFileState')}")
        if previous and unit_name(previous) not in state.get("After", "").split():
            problems.append(f"{lane.name} not after {previous}")
        previous = lane.name
    _report(found, problems, "every lane's unit enabled, active and after the lane before it")


def test_no_lane_beyond_the_inventory(box: Box, found: Callable[[object], None]) -> None:
    """no lane units beyond the inventory's"""
    listed = box.run(f"ls -1 {UNIT_DIR}/{PREFIX}*.service {LANE_DIR}/*.env 2>/dev/null").stdout
    names = {
        path.rpartition("/")[2].removeprefix(PREFIX).removesuffix(".service").removesuffix(".env")
        for path in listed.split()
    }
    extra = sorted(names - {lane.name for lane in box.config.lanes})
    _report(found, [f"{name} is not in the inventory" for name in extra], "only configured lanes")


def test_lanes_answer_health(box: Box, found: Callable[[object], None]) -> None:
    """lanes /health"""
    answers = [(lane, _http(box, lane, "/health", False)[0]) for lane in box.config.lanes]
    problems = [f"{lane.name}: {status}" for lane, status in answers if status != "200"]
    _report(found, problems, "/health answering 200 on every lane's port")


def test_lanes_serve_their_names(box: Box, found: Callable[[object], None]) -> None:
    """lanes /v1/models names"""
    problems = []
    for lane in box.config.lanes:
        status, body = _http(box, lane, "/v1/models", lane.api_key)
        try:
            names = [model["id"] for model in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError):
            names = None
        if (status, names) != ("200", [lane.served_name]):
            problems.append(f"{lane.name}: {status} {names}")
    _report(found, problems, "each lane's /v1/models listing its served name")


def test_lanes_refuse_requests_without_the_key(box: Box, found: Callable[[object], None]) -> None:
    """lanes 401 without key"""
    answers = [(lane, _http(box, lane, "/v1/models", False)[0]) for lane in box.config.lanes]
    problems = [
        f"{lane.name}: {status}" for lane, status in answers if lane.api_key and status != "401"
    ]
    _report(found, problems, "401 from /v1 without the key on every lane that has one")


def test_lane_secrets_root_only(box: Box, found: Callable[[object], None]) -> None:
    """lane secrets root 0600"""
    paths = [SECRETS_DIR, *(key_path(lane.name) for lane in box.config.lanes if lane.api_key)]
    modes = {}
    for path in paths:
        file = box.host.file(path)
        modes[path] = f"{file.user} {file.mode:o}" if file.exists else "absent"
    want = {path: "root 600" for path in paths} | {SECRETS_DIR: "root 700"}
    problems = [f"{path}: {mode}" for path, mode in modes.items() if mode != want[path]]
    _report(found, problems, f"{SECRETS_DIR} root 0700 and each lane's key root 0600")


def test_memory_guard_watching(box: Box, found: Callable[[object], None]) -> None:
    """memory guard active, threshold"""
    problems = []
    state = box.run(f"systemctl is-enabled {SERVICE}; systemctl is-active {SERVICE}").stdout
    if state.split() != ["enabled", "active"]:
        problems.append(f"{SERVICE} {' '.join(state.split())}")
    text = box.run("cat /etc/spark/memguard.json").stdout
    try:
        config = json.loads(text)
    except ValueError:
        config = {}
    threshold = box.config.memory_guard_min_available_gib
    if config.get("min_available_gib") != threshold:
        problems.append(f"threshold {config.get('min_available_gib')} (want {threshold})")
    order = stop_order([(lane.name, lane.priority) for lane in box.config.lanes])
    if config.get("lanes") != order:
        problems.append("stop order differs from the inventory's priorities")
    _report(found, problems, f"{SERVICE} enabled and active, with the inventory's threshold")

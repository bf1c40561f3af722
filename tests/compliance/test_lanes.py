"""The lanes: each unit enabled, serving and started after the one before; /health and /v1/models
answer through the front; each answers the canary's question right; every path refuses a request
without the key; each server (vLLM, llama.cpp) on loopback only; the keys and the front's key
maps root-only; the memory guard watching. A lane on demand (docs/on-demand.md) is idle by
design: its socket listening, its unit not enabled; no check here sends it a request (that would
start it), the ones that need its server read it only while it runs."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from operations.front import KEYS_DIR
from operations.lanes import (
    CANARY_COMMAND,
    LANE_DIR,
    PREFIX,
    SECRETS_DIR,
    UNIT_DIR,
    key_path,
    unit_name,
)
from operations.memguard import SERVICE, stop_order
from operations.on_demand import proxy_name, socket_name

if TYPE_CHECKING:
    from spark.lane import Lane
    from tests.compliance.conftest import Box


def _show(box: Box, unit: str, properties: str) -> dict[str, str]:
    shown = box.run(f"systemctl show -p {properties} {unit}").stdout
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def _idle(box: Box, lane: Lane) -> bool:
    """An on-demand lane not running now: a request would start it."""
    if lane.on_demand_idle_s is None:
        return False
    return _show(box, unit_name(lane.name), "ActiveState").get("ActiveState") != "active"


def _awake(box: Box) -> tuple[list[Lane], list[str]]:
    """The box's lanes a request may be sent to (resident, or on demand and running), and a
    note naming the idle ones left alone."""
    idle = [lane for lane in box.config.lanes if _idle(box, lane)]
    awake = [lane for lane in box.config.lanes if lane not in idle]
    names = ", ".join(lane.name for lane in idle)
    return awake, [f"{names} idle on demand (not woken)"] if idle else []


def _http(box: Box, lane: Lane, path: str, with_key: bool) -> tuple[str, str]:
    """(status, body) of a GET to the lane's port (the front's) on the box itself; the key,
    when sent, is read from its file on the box and given to curl on its standard input (`-H
    @-`, curl 7.55 and later), so it is in no command line (ps shows argv) and never in this
    process. With TLS the certificate is not checked: it names the box, not 127.0.0.1."""
    scheme = "https" if box.plan.front.tls else "http"
    url = shlex.quote(f"{scheme}://127.0.0.1:{lane.port}{path}")
    curl = "curl -s -k --max-time 10 -w '\\n%{http_code}'"
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
    on_demand = {lane.served.name for lane in box.plan.lanes if lane.served.on_demand}
    for name in box.plan.lane_units:  # an mp cluster lane's rank too, after the box's own lanes
        state = _show(box, unit_name(name), "ActiveState,UnitFileState,After")
        found_state = (state.get("ActiveState"), state.get("UnitFileState"))
        if name in on_demand:  # not enabled (no [Install]), running or not
            if found_state not in (("active", "static"), ("inactive", "static")):
                problems.append(f"{name} {found_state[0]} {found_state[1]} (on demand)")
        elif found_state != ("active", "enabled"):
            problems.append(f"{name} {state.get('ActiveState')} {state.get('UnitFileState')}")
        if previous and unit_name(previous) not in state.get("After", "").split():
            problems.append(f"{name} not after {previous}")
        previous = name
    _report(found, problems, "every lane's unit enabled, active and after the lane before it")


def test_no_lane_beyond_the_inventory(box: Box, found: Callable[[object], None]) -> None:
    """no lane units beyond the inventory's"""
    listed = box.run(f"ls -1 {UNIT_DIR}/{PREFIX}*.service {LANE_DIR}/*.env 2>/dev/null").stdout
    names = {
        path.rpartition("/")[2].removeprefix(PREFIX).removesuffix(".service").removesuffix(".env")
        for path in listed.split()
    }
    extra = sorted(names - set(box.plan.lane_units))
    _report(found, [f"{name} is not in the inventory" for name in extra], "only configured lanes")


def test_lanes_answer_health(
    box: Box, found: Callable[[object], None], note: Callable[[str], None]
) -> None:
    """lanes /health"""
    awake, idle = _awake(box)
    answers = [(lane, _http(box, lane, "/health", lane.api_key)[0]) for lane in awake]
    problems = [f"{lane.name}: {status}" for lane, status in answers if status != "200"]
    found("; ".join(problems + idle))
    if idle:
        note("; ".join(idle))
    assert not problems, (
        f"expected /health answering 200 on every lane's port, with its key, found: {problems}"
    )


def test_lanes_serve_their_names(
    box: Box, found: Callable[[object], None], note: Callable[[str], None]
) -> None:
    """lanes /v1/models names"""
    problems = []
    awake, idle = _awake(box)
    for lane in awake:
        status, body = _http(box, lane, "/v1/models", lane.api_key)
        try:
            names = [model["id"] for model in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError):
            names = None
        if (status, names) != ("200", [lane.served_name]):
            problems.append(f"{lane.name}: {status} {names}")
    found("; ".join(problems + idle))
    if idle:
        note("; ".join(idle))
    assert not problems, f"expected each lane's /v1/models listing its served name: {problems}"


def test_lanes_answer_the_canary(box: Box, found: Callable[[object], None]) -> None:
    """lanes answer the canary"""
    # The question each lane's start asks (templates/spark-lane-canary.j2), asked again: a lane
    # can answer right at its start and garbage later (its weights replaced under it, say).
    problems = []
    awake, off = _awake(box)
    for lane in awake:
        if not lane.canary:  # its model cannot answer it (a lane's setting): said in the report
            off.append(f"{lane.name}: canary off (canary = false)")
            continue
        result = box.run(f"{CANARY_COMMAND} {lane.name} {lane.server_port}")
        if result.rc != 0:
            said = result.stdout.strip().splitlines()
            problems.append(said[0] if said else f"{lane.name}: exit {result.rc}")
    found("; ".join(problems + off))
    assert not problems, (
        f"expected every lane answering the canary's question right, found: {'; '.join(problems)}"
    )


# vLLM's own key guards /v1 only; these answer anyone who reaches vLLM (vllm-project/vllm#18892).
UNGUARDED_BY_VLLM = ("/invocations", "/tokenize", "/metrics")


def test_lanes_refuse_requests_without_the_key(box: Box, found: Callable[[object], None]) -> None:
    """lanes 401 without key, every path"""
    problems = []
    for lane in (lane for lane in box.config.lanes if lane.api_key):
        for path in ("/v1/models", "/health", *UNGUARDED_BY_VLLM):
            status = _http(box, lane, path, False)[0]
            if status != "401":
                problems.append(f"{lane.name} {path}: {status}")
    _report(found, problems, "401 without the key on every path of every lane that has one")


def _listeners(box: Box, port: int) -> list[tuple[str, str]]:
    """(address, ss's users column) of each TCP listener on the port."""
    lines = box.run(f"ss -ltnpH 'sport = :{port}'").stdout.splitlines()
    return [(f[3].rpartition(":")[0], f[-1]) for f in (line.split() for line in lines) if f]


def test_servers_listen_on_loopback_only(box: Box, found: Callable[[object], None]) -> None:
    """servers on loopback, nginx on the port"""
    problems = []
    for lane in box.config.lanes:
        server, front = (_listeners(box, port) for port in (lane.backend_port, lane.port))
        if sorted({address for address, _ in server}) != ["127.0.0.1"]:
            problems.append(f"{lane.name}: {lane.backend_port} on {server or 'nothing'}")
        behind = _listeners(box, lane.server_port) if lane.server_port != lane.backend_port else []
        if any(address != "127.0.0.1" for address, _ in behind):  # on demand, while it runs
            problems.append(f"{lane.name}: {lane.server_port} on {behind}")
        if not front or any('"nginx"' not in users for _, users in front):
            problems.append(f"{lane.name}: {lane.port} held by {front or 'nothing'}, not nginx")
    _report(found, problems, "each lane's server on 127.0.0.1 only, its port held by nginx")


def test_lane_secrets_root_only(box: Box, found: Callable[[object], None]) -> None:
    """lane secrets root 0600"""
    keyed = [lane.name for lane in box.config.lanes if lane.api_key]
    paths = [SECRETS_DIR, *(key_path(name) for name in keyed)]
    paths += [KEYS_DIR, *(f"{KEYS_DIR}/{name}.conf" for name in keyed)]
    modes = {}
    for path in paths:
        file = box.host.file(path)
        modes[path] = f"{file.user} {file.mode:o}" if file.exists else "absent"
    want = {path: "root 600" for path in paths} | {SECRETS_DIR: "root 700", KEYS_DIR: "root 700"}
    # With no lane keys (a box of no lanes) the directories need not exist; any there is checked.
    optional = set() if keyed else {SECRETS_DIR, KEYS_DIR}
    problems = [
        f"{path}: {mode}"
        for path, mode in modes.items()
        if mode != want[path] and not (path in optional and mode == "absent")
    ]
    _report(found, problems, "the keys and the front's key maps root 0600, their directories 0700")


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
    threshold = box.plan.memory_guard.floor_gib
    if config.get("min_available_gib") != threshold:
        problems.append(f"threshold {config.get('min_available_gib')} (want {threshold})")
    order = stop_order(list(box.plan.memory_guard.lanes))
    if config.get("lanes") != order:
        problems.append("stop order differs from the inventory's priorities")
    _report(found, problems, f"{SERVICE} enabled and active, with the inventory's threshold")


def test_on_demand_lanes_wait_on_their_sockets(
    box: Box, found: Callable[[object], None], note: Callable[[str], None]
) -> None:
    """on-demand lanes: socket, proxy, conflicts"""
    problems, checked = [], []
    for own in box.plan.lanes:
        wanted, name = own.served.on_demand, own.served.name
        if wanted is None:
            continue
        checked.append(name)
        socket = _show(box, socket_name(name), "ActiveState,UnitFileState,Listen")
        if (socket.get("ActiveState"), socket.get("UnitFileState")) != ("active", "enabled"):
            problems.append(f"{socket_name(name)} {socket.get('ActiveState')}")
        if socket.get("Listen") != f"127.0.0.1:{wanted.socket_port} (Stream)":
            problems.append(f"{socket_name(name)} listens on {socket.get('Listen')}")
        proxy = _show(box, proxy_name(name), "ExecStart")
        target = f"--exit-idle-time={wanted.idle_s}s 127.0.0.1:{wanted.server_port}"
        if target not in proxy.get("ExecStart", ""):
            problems.append(f"{proxy_name(name)} not passing to {target}")
        lane = _show(box, unit_name(name), "StopWhenUnneeded,Conflicts")
        if lane.get("StopWhenUnneeded") != "yes":
            problems.append(f"{name}: StopWhenUnneeded={lane.get('StopWhenUnneeded')}")
        conflicts = set(lane.get("Conflicts", "").split())
        missing = [other for other in wanted.conflicts if unit_name(other) not in conflicts]
        if missing:
            problems.append(f"{name}: no Conflicts= with {', '.join(missing)}")
    found("; ".join(problems))
    note(", ".join(checked) or "no lane on demand")
    assert not problems, f"expected each on-demand lane's socket, proxy and conflicts: {problems}"

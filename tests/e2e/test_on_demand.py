"""Lanes on demand on the simulated lab (tests/e2e/on_demand_inventory.py): two lanes of each box
that do not fit together, on demand with 20 s of idle time, beside the resident coder lane.

One deploy over the deployed lab (the shared `deployed_lab`: its fast lane resident, made on
demand here, the spare one added), then on the first box: the deploy started each on-demand lane
(its check) and stopped it; a request through the front with the lane's key starts its lane and
is answered once it serves; the lane stops after its idle time; a request to the other lane
stops the first before the second starts (both units' states read on the box while it loads,
and their timestamps); a second deploy changes nothing and starts no lane, and compliance passes
without waking one. A power cut and boot of the box: its sockets listen again, its on-demand
lanes wait for a request, which starts one. Last, inventories/sim.py deployed again puts every
box back as it was before the module (its fast lane resident, no socket, the spare lane gone but
its key, which a lane keeps: operations/lanes.py lanes_removed), for the deployed lab's next
module.

The bench row (the time from the on-demand request to its first token against the lane's own
start) is `make on-demand-bench`'s (bench/on_demand.py: a lab of its own, this module's inventory).

Tests in this module run in order, each on what the one before left.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

from operations import ray
from spark import box_paths
from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.on_demand_lanes import CODER, FAST, IDLE_S, SPARE
from tests.e2e.runs import INVENTORY as DEFAULT_INVENTORY
from tests.e2e.runs import power_cut, power_on
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.e2e.test_lanes import HTTP, key_of, unit
from tests.simlab import lab as simlab
from tests.simlab.waits import until

pytestmark = pytest.mark.lab

INVENTORY = "tests/e2e/on_demand_inventory.py"
SOCKET = "spark-ondemand-{}.socket"
# How long a lane may take to start on the shared machine, and to stop after its idle time.
PATIENCE_S = 300


# What the deploy puts on a box for its lanes, read as root: their units' and the front's files
# (their contents' hashes), which units are enabled, who listens on the lanes' ports (the fronts'
# 101xx, the servers' 111xx, an on-demand server's 121xx), the files under /etc/spark.
LANES_LAYER = r"""
cd /etc/systemd/system && sha256sum spark-* 2>/dev/null
systemctl list-unit-files --no-legend --plain 'spark-*' | awk '{print "unit " $1 " " $2}'
ss -Hltnp | awk '$4 ~ /:1[012]1[0-9][0-9]$/ {split($6, u, "\""); print "listening " $4 " " u[2]}' |
  sort -u
sha256sum /etc/nginx/conf.d/*.conf
find /etc/spark | sort
"""


def lanes_layer(host: simlab.Host) -> list[str]:
    return run_on(host, f"sudo sh -c {shlex.quote(LANES_LAYER)}").splitlines()


@dataclass
class OnDemand:
    hosts: list[simlab.Host]  # the first is where the module's requests go
    deploy_started: float  # CLOCK_MONOTONIC as the deploy started: one clock for the lab's boxes
    before: dict[str, list[str]]  # each box's lanes layer as the deployed lab had it


@pytest.fixture(scope="module")
def on_demand(deployed_lab: Deployed) -> OnDemand:
    hosts = deployed_lab.lab.hosts
    before = {host.name: lanes_layer(host) for host in hosts}
    started = time.monotonic()
    pyinfra(INVENTORY, "deploy.py")
    print(f"on demand: deploy over the deployed lab {time.monotonic() - started:.0f} s")
    return OnDemand(hosts, started, before)


@pytest.fixture(scope="module")
def box(on_demand: OnDemand) -> simlab.Host:
    return on_demand.hosts[0]


def states(host: simlab.Host, *units: str) -> dict[str, dict[str, str]]:
    """Each unit's properties that say whether and when it ran (`systemctl show`)."""
    properties = "Id,ActiveState,UnitFileState,InactiveExitTimestampMonotonic"
    properties += ",ActiveEnterTimestampMonotonic,InactiveEnterTimestampMonotonic"
    text = run_on(host, f"systemctl show -p {properties} {' '.join(units)}")
    shown = {}
    for block in text.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines())
        shown[fields["Id"]] = fields
    return shown


def active(host: simlab.Host, lane: dict[str, Any]) -> str:
    return states(host, unit(lane))[unit(lane)]["ActiveState"]


def streamed_chat(host: simlab.Host, lane: dict[str, Any]) -> None:
    """A streamed chat to the lane through the front, with its key, answered: its first line an
    event, its last [DONE]."""
    body = {"model": lane["served_name"], "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "count to 3"}]}  # fmt: skip
    req = urllib.request.Request(
        f"http://{host.mgmt_ip}:{lane['port']}/v1/chat/completions", json.dumps(body).encode()
    )
    req.add_header("Authorization", f"Bearer {key_of(host, lane).strip()}")
    req.add_header("Content-Type", "application/json")
    with HTTP.open(req, timeout=PATIENCE_S) as response:
        assert response.status == 200
        first = response.readline()
        text = (first + response.read()).decode()
    assert first.startswith(b"data: ") and text.rstrip().endswith("data: [DONE]"), text


def stopped(host: simlab.Host, lane: dict[str, Any]) -> None:
    until(lambda: active(host, lane) == "inactive", PATIENCE_S, f"{lane['name']} stopped")


def test_the_deploy_leaves_the_on_demand_lanes_stopped_their_sockets_listening(
    on_demand: OnDemand, box: simlab.Host
) -> None:
    shown = states(box, unit(FAST), unit(SPARE), SOCKET.format("fast"), SOCKET.format("spare"))
    for lane in (FAST, SPARE):
        # Not enabled (its unit has no [Install]: "static"), stopped after the deploy's check.
        lane_state = shown[unit(lane)]
        assert (lane_state["ActiveState"], lane_state["UnitFileState"]) == ("inactive", "static")
        socket = shown[SOCKET.format(lane["name"])]
        assert (socket["ActiveState"], socket["UnitFileState"]) == ("active", "enabled")
    # The deploy started each (health and canary), and systemd stopped it right after: the
    # fast lane too, which was resident before the deploy and stopped by it.
    for lane in (FAST, SPARE):
        lane_state = shown[unit(lane)]
        last_start = int(lane_state["InactiveExitTimestampMonotonic"]) / 1e6
        assert last_start > on_demand.deploy_started, (lane["name"], lane_state)
        assert int(lane_state["InactiveEnterTimestampMonotonic"]) / 1e6 > last_start, lane_state
    listeners = run_on(box, "sudo ss -ltnpH")
    assert "127.0.0.1:11102 " in listeners and '"systemd"' in listeners, listeners
    assert "127.0.0.1:12102 " not in listeners, listeners  # no server while idle
    assert run_on(box, f"systemctl is-active {unit(CODER)}").strip() == "active"


def test_a_request_starts_its_lane_which_stops_after_its_idle_time(box: simlab.Host) -> None:
    # How long that first token takes against the lane's own start: bench/on_demand.py.
    streamed_chat(box, FAST)
    assert active(box, FAST) == "active"
    stopped(box, FAST)
    shown = states(box, "spark-ondemand-fast.service", SOCKET.format("fast"))
    assert shown["spark-ondemand-fast.service"]["ActiveState"] == "inactive"
    assert shown[SOCKET.format("fast")]["ActiveState"] == "active"  # listening for the next
    # The proxy ended cleanly, with the plan's idle time (--exit-idle-time), and the lane with it.
    proxy = run_on(box, "systemctl show -p Result,ExecStart spark-ondemand-fast.service")
    assert "Result=success" in proxy.splitlines(), proxy
    assert f"--exit-idle-time={IDLE_S}s 127.0.0.1:12102" in proxy, proxy


def test_two_lanes_that_do_not_fit_together_are_swapped_never_both_up(box: simlab.Host) -> None:
    streamed_chat(box, FAST)
    assert active(box, FAST) == "active"
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            shown = states(box, unit(FAST), unit(SPARE))
            seen.append((shown[unit(FAST)]["ActiveState"], shown[unit(SPARE)]["ActiveState"]))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        streamed_chat(box, SPARE)
    finally:
        done.set()
        watcher.join()
    up = ("active", "activating", "reloading")
    assert not [pair for pair in seen if pair[0] in up and pair[1] in up], seen
    assert any(pair[1] == "activating" for pair in seen), seen  # watched while it loaded
    shown = states(box, unit(FAST), unit(SPARE))
    assert shown[unit(FAST)]["ActiveState"] == "inactive"
    # The first stopped before the second left inactive (systemd's own timestamps).
    fast_stopped = int(shown[unit(FAST)]["InactiveEnterTimestampMonotonic"])
    assert fast_stopped <= int(shown[unit(SPARE)]["InactiveExitTimestampMonotonic"])
    stopped(box, SPARE)


def test_after_a_reboot_the_socket_listens_and_its_lane_waits_for_a_request(
    box: simlab.Host,
) -> None:
    power_cut(box)
    power_on(box)
    socket, coder = SOCKET.format("fast"), unit(CODER)

    def booted() -> bool:
        shown = states(box, socket, coder)
        return shown[socket]["ActiveState"] == "active" and shown[coder]["ActiveState"] == "active"

    until(booted, PATIENCE_S, "the socket listening and the resident lane serving after boot")
    # Ray's two nodes joined again, as the head sees them (test_reboot.py's bound after a boot):
    # the compliance run below gives a worker rejoining a minute.
    run_on(box, f"sudo {ray.NODES_COMMAND} 2 120")
    assert (active(box, FAST), active(box, SPARE)) == ("inactive", "inactive")
    streamed_chat(box, FAST)
    stopped(box, FAST)


def test_a_second_deploy_changes_nothing_and_compliance_passes_waking_no_lane(
    box: simlab.Host,
) -> None:
    again = pyinfra(INVENTORY, "deploy.py")
    assert changes(again) == 0, again.stdout
    assert (active(box, FAST), active(box, SPARE)) == ("inactive", "inactive")
    code, table, output = compliance(inventory=INVENTORY)
    assert code == 0 and not_passing(table) == {}, output
    assert table["on-demand lanes: socket, proxy, conflicts"][box.name] == "PASS fast, spare"
    idle = "PASS fast, spare idle on demand (not woken)"
    assert table["lanes /health"][box.name] == idle, table["lanes /health"]
    assert (active(box, FAST), active(box, SPARE)) == ("inactive", "inactive")


def test_the_default_inventory_deployed_again_puts_every_box_back(on_demand: OnDemand) -> None:
    pyinfra(DEFAULT_INVENTORY, "deploy.py")
    for host in on_demand.hosts:
        after = lanes_layer(host)
        # All as before, but the spare lane's key, which stays (operations/lanes.py).
        assert set(after) - set(on_demand.before[host.name]) == {box_paths.key_path(SPARE["name"])}
        assert set(on_demand.before[host.name]) - set(after) == set(), host.name
        lanes = f"systemctl is-active {unit(CODER)} {unit(FAST)}"
        assert run_on(host, lanes).split() == ["active", "active"], host.name

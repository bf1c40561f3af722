"""Lanes on demand (docs/on-demand.md): the server port behind the socket (spark/ports.py,
spark/lane.py), the plan's OnDemand of each lane and its conflicts (spark/plan.py), `make plan`'s
line, and the units operations/lanes.py and operations/on_demand.py write and start.

The lanes are tests/unit/test_fleet.py's: Qwen/Qwen3-0.6B at 8192 tokens on a lone Spark, 0.4
resident and the router's 1 GiB (0.008218) leaving 0.491782 to on-demand lanes: y (0.3) and z
(0.25) conflict (0.55 above it), w (0.15) fits beside either.
"""

from __future__ import annotations

from typing import Any

import pytest

from operations import lanes
from operations import on_demand as demand
from operations.util import RootFiles
from spark.engines.vllm import serve_args
from spark.inventory import load_from_dicts
from spark.lane import Lane, clash_problems
from spark.plan import OnDemand, ServedLane, on_demand, plan, served_lane
from spark.ports import on_demand_server_port
from stages.show_plan import served_line
from tests.unit.harness import FakeHost, captured, refusal, run_op
from tests.unit.test_config import merged
from tests.unit.test_fleet import RESIDENT, W, Y, Z, refused, small
from tests.unit.test_lanes import ENVIRONMENT, lane_facts, lane_host, paths

SOCKET = "/etc/systemd/system/spark-ondemand-coder.socket"
PROXY = "/etc/systemd/system/spark-ondemand-coder.service"
LANE_UNIT = "/etc/systemd/system/spark-lane-coder.service"
# Lane coder of tests/unit/test_lanes.py on demand: port 10101, its socket on 11101 (port +
# 1000), its server on 12101 (+ 1000 more), after 20 s idle stopped, never beside lane fast.
COMING = OnDemand(idle_s=20, socket_port=11101, server_port=12101, conflicts=("fast",))
CHECK_START = (
    "systemctl reset-failed spark-lane-coder.service; systemctl restart spark-lane-coder.service"
    " || { journalctl -u spark-lane-coder.service -n 40 --no-pager >&2; exit 1; }"
)
# OnDemandSockets' command on the lab's spark-1 after tests/e2e/test_on_demand.py's deploy
# (systemd 252): lanes fast and spare on demand, both sockets listening
# (captured/lab-ondemand-sockets.txt); below, its first three lines with the lane renamed coder.
LISTENING = "Id=spark-ondemand-coder.socket\nActiveState=active\nUnitFileState=enabled\n"


def coder_on_demand(**unit: Any) -> ServedLane:
    return served_lane(
        Lane.model_validate(
            small("coder", 10101, 0.3, on_demand_idle_s=20) | {"served_name": "coder"}
        ),
        environment=ENVIRONMENT,
        start_timeout_s=600,
        on_demand=COMING,
        **unit,
    )


def on_demand_host(capture: str, files: dict[str, str | None], sockets: str | None) -> FakeHost:
    host = lane_host(capture, files)
    host.outputs[(RootFiles, (("paths", (SOCKET, PROXY)),))] = "".join(
        f"{path} absent\n" for path in (SOCKET, PROXY) if files.get(path) is None
    )
    host.outputs[demand.OnDemandSockets] = sockets
    return host


# --- the model --------------------------------------------------------------------------------


def test_an_on_demand_lanes_server_listens_1000_above_its_loopback_port() -> None:
    assert on_demand_server_port(11102) == 12102
    assert Lane.model_validate(small("y", 10102, 0.3)).server_port == 11102  # resident
    assert Lane.model_validate(small("y", 10102, 0.3, on_demand_idle_s=60)).server_port == 12102
    lane = Lane.model_validate(small("y", 10102, 0.3, on_demand_idle_s=60, loopback_port=15000))
    assert (lane.backend_port, lane.server_port) == (15000, 16000)
    args = serve_args(lane)
    assert args[args.index("--port") + 1] == "16000"  # the server's, never the socket's


def test_an_on_demand_lanes_server_port_clashes_like_any_port() -> None:
    # y on demand: front 10102, socket 11102, server 12102; x's front port is 12102.
    both = [
        Lane.model_validate(small("y", 10102, 0.3, on_demand_idle_s=60)),
        Lane.model_validate(small("x", 12102, 0.3)),
    ]
    assert clash_problems(both, []) == [
        "y's server port on demand (loopback_port + 1000) and x's port are all 12102; give each"
        " its own (loopback_port defaults to port + 1000)"
    ]
    lone = [Lane.model_validate(small("y", 28501, 0.3, on_demand_idle_s=60))]  # server 30501
    assert clash_problems(lone, [(30000, 30999, "someone's")]) == [
        "y: server port on demand (loopback_port + 1000) 30501 is someone's; pick another port"
    ]


def test_the_plan_gives_each_on_demand_lane_its_socket_server_idle_time_and_conflicts() -> None:
    box = plan(load_from_dicts(merged({"spark-1": {"lanes": [RESIDENT, Y, Z, W]}}))).box("spark-1")
    served = {own.served.name: own.served.on_demand for own in box.lanes}
    # Y, Z, W are ports 10102, 10103, 10104; z conflicts with y, the earlier one.
    assert served == {
        "resident": None,
        "y": OnDemand(idle_s=900, socket_port=11102, server_port=12102, conflicts=()),
        "z": OnDemand(idle_s=600, socket_port=11103, server_port=12103, conflicts=("y",)),
        "w": OnDemand(idle_s=300, socket_port=11104, server_port=12104, conflicts=()),
    }
    # Nothing reads an idle lane through its socket: its /health and /metrics on its server.
    metrics = box.metrics
    assert metrics is not None
    assert [(lane.name, lane.backend_port, lane.on_demand) for lane in metrics.expected.lanes] == [
        ("resident", 11101, False), ("y", 12102, True), ("z", 12103, True), ("w", 12104, True)
    ]  # fmt: skip
    assert [lane.backend_port for lane in metrics.lanes] == [11101, 12102, 12103, 12104]
    # The front still forwards to the loopback port: the socket's.
    assert [lane.backend_port for lane in box.front.lanes] == [11101, 11102, 11103, 11104]
    assert served_line(box.lanes[2].served).endswith(
        "; on demand: a socket on loopback 11103, the server on 12103, stopped after 600 s"
        " idle, stops y first"
    )


def test_on_demand_pairs_name_the_later_lanes_earlier_conflicts() -> None:
    lane = Lane.model_validate(small("c", 10103, 0.3, on_demand_idle_s=5))
    pairs = (("a", "b"), ("a", "c"), ("b", "c"), ("c", "d"))
    assert on_demand(lane, pairs) == OnDemand(
        idle_s=5, socket_port=11103, server_port=12103, conflicts=("a", "b")
    )
    assert on_demand(Lane.model_validate(small("c", 10103, 0.3)), pairs) is None


# --- the operations --------------------------------------------------------------------------


def test_a_fresh_box_gets_the_units_a_check_start_and_the_socket_listening() -> None:
    files = dict.fromkeys([*paths(), SOCKET, PROXY])
    host = on_demand_host("lab-lanehost-bare.txt", files, None)
    commands = run_op(lanes.serving, host=host, unit=coder_on_demand())
    assert commands[-4:] == [
        "systemctl daemon-reload",
        CHECK_START,
        "systemctl enable spark-ondemand-coder.socket",
        "systemctl restart spark-ondemand-coder.socket",
    ]
    assert "systemctl enable spark-lane-coder.service" not in commands
    assert host.uploads[SOCKET].splitlines()[-8:] == [
        "Description=Lane coder on demand: started by a request to 127.0.0.1:11101",
        "",
        "[Socket]",
        "ListenStream=127.0.0.1:11101",
        "Service=spark-ondemand-coder.service",
        "",
        "[Install]",
        "WantedBy=sockets.target",
    ]
    assert host.uploads[PROXY].splitlines()[-6:] == [
        "Description=Lane coder on demand: 127.0.0.1:11101 to its server on 12101",
        "Requires=spark-ondemand-coder.socket spark-lane-coder.service",
        "After=spark-ondemand-coder.socket spark-lane-coder.service",
        "",
        "[Service]",
        "ExecStart=/usr/lib/systemd/systemd-socket-proxyd --exit-idle-time=20s 127.0.0.1:12101",
    ]
    unit = host.uploads[LANE_UNIT]
    for line in (
        "StopWhenUnneeded=yes",
        "Conflicts=spark-lane-fast.service",
        "After=spark-lane-fast.service",
        "Description=vLLM lane coder (port 10101 through the front, vLLM on 127.0.0.1:12101)",
    ):
        assert line in unit.splitlines(), line
    assert "until curl -fs -o /dev/null http://127.0.0.1:12101/health" in unit
    assert "spark-lane-canary coder 12101 " in unit
    assert "[Install]" not in unit and "WantedBy=" not in unit  # never enabled: not resident


def test_an_idle_lane_in_place_changes_nothing_and_is_not_woken() -> None:
    first = on_demand_host("lab-lanehost-bare.txt", dict.fromkeys([*paths(), SOCKET, PROXY]), None)
    run_op(lanes.serving, host=first, unit=coder_on_demand())
    written = {path: first.uploads[path] for path in (*paths(), SOCKET, PROXY)}
    # The serving capture: coder's unit active and enabled; here idle and static (no [Install]).
    idle = captured("lab-lanehost-serving.txt").replace(
        "unit Id=spark-lane-coder.service\nunit ActiveState=active\nunit UnitFileState=enabled",
        "unit Id=spark-lane-coder.service\nunit ActiveState=inactive\nunit UnitFileState=static",
    )
    host = on_demand_host("lab-lanehost-serving.txt", written, LISTENING)
    host.outputs.update(lane_facts(idle))
    assert run_op(lanes.serving, host=host, unit=coder_on_demand()) == []
    assert host.noops[-1] == (
        "lane coder on demand: listening on 127.0.0.1:11101, stopped after 20 s idle"
    )


def test_a_resident_lane_made_on_demand_is_disabled_and_stopped_before_its_socket() -> None:
    files = dict.fromkeys([SOCKET, PROXY])
    resident = {path: text for path, text in zip(paths(), ("old unit", "old env"), strict=True)}
    host = on_demand_host("lab-lanehost-serving.txt", files | resident, None)
    commands = run_op(lanes.serving, host=host, unit=coder_on_demand())
    assert [c for c in commands if isinstance(c, str)][-6:] == [
        "systemctl daemon-reload",
        "systemctl disable spark-lane-coder.service",
        "systemctl stop spark-lane-coder.service",
        CHECK_START,
        "systemctl enable spark-ondemand-coder.socket",
        "systemctl restart spark-ondemand-coder.socket",
    ]


def test_the_socket_on_the_loopback_port_is_the_lanes_own_not_a_taken_port() -> None:
    # The bare capture's listeners plus systemd holding 11101 (the socket): the line `ss -ltnpH`
    # printed for lane fast's socket on the lab's spark-1 (11102 there), with the fact's prefix.
    systemd = 'listen LISTEN 1 4096 127.0.0.1:11101 0.0.0.0:* users:(("systemd",pid=1,fd=85))\n'
    bare = captured("lab-lanehost-bare.txt") + systemd
    files = dict.fromkeys([*paths(), SOCKET, PROXY])
    host = on_demand_host("lab-lanehost-bare.txt", files, None)
    host.outputs.update(lane_facts(bare))
    assert run_op(lanes.serving, host=host, unit=coder_on_demand())[-1] == (
        "systemctl restart spark-ondemand-coder.socket"
    )
    # A resident lane on that port: someone else's.
    resident = served_lane(
        Lane.model_validate(small("coder", 10101, 0.3)), environment={}, start_timeout_s=1200
    )
    host = lane_host("lab-lanehost-bare.txt", dict.fromkeys(paths()))
    host.outputs.update(lane_facts(bare))
    assert refusal(run_op(lanes.serving, host=host, unit=resident)) == (
        "spark-test: loopback_port 11101 of lane coder is taken by systemd; stop that service or"
        " give the lane another loopback_port in group_data `lanes`"
    )


def test_the_deploy_asks_no_canary_of_an_on_demand_lane() -> None:
    asked = {fact for fact, _ in lanes.serving_questions(coder_on_demand())}
    assert lanes.LaneAnswer not in asked
    assert demand.OnDemandSockets in asked


def test_sockets_fact_reads_systemctl_show() -> None:
    assert demand.OnDemandSockets().process(captured("lab-ondemand-sockets.txt").splitlines()) == {
        "fast": {"ActiveState": "active", "UnitFileState": "enabled"},
        "spare": {"ActiveState": "active", "UnitFileState": "enabled"},
    }
    assert demand.OnDemandSockets().command().endswith("; true")  # absent: no failure


@pytest.mark.parametrize(
    ("keep", "commands"),
    [
        (["coder"], []),
        (
            [],
            [
                "systemctl disable --now spark-ondemand-coder.socket",
                "systemctl stop spark-ondemand-coder.service",
                f"rm -f {SOCKET} {PROXY}",
                "systemctl daemon-reload",
            ],
        ),
    ],
)
def test_the_socket_of_a_lane_no_longer_on_demand_is_removed(
    keep: list[str], commands: list[str]
) -> None:
    host = FakeHost({demand.OnDemandSockets: LISTENING})
    assert run_op(demand.on_demand_removed, host=host, keep=keep) == commands


def test_the_router_port_on_an_on_demand_lanes_server_port_is_refused() -> None:
    # y on demand at port 10102: its server on 12102 (11102 + 1000); the router on 12102 there.
    box = {"lanes": [RESIDENT, small("y", 10102, 0.3, on_demand_idle_s=60)], "router_port": 12102}
    assert (
        "spark-1: router_port: 12102 (the router's) is the server port on demand (loopback_port +"
        " 1000) of lane y (lanes); give router_port another port"
    ) in refused({"spark-1": box})

"""spark/fleet.py and the on-demand budget of spark/memory.py: the router's keys and boxes, the
replicas of a served name, lanes on demand, the route table in the plan and in `make plan`.

Every expected number is worked out here: the lanes are Qwen/Qwen3-0.6B (catalog: 1.5 GiB of
weights, 28 layers, 8 KV heads of 128, bf16) at 8192 tokens, needing 1.5 + 2 x 28 x 8 x 128 x 2
bytes x 8192 / GiB (0.875) + 4 (spark/memory.py OVERHEAD_GIB) = 6.375 GiB, which each share
below holds; the router's 1 GiB and port 10100, its health checks every 10 s (group_data); the
fraction limit 0.9 (spark/memory.py FRACTION_LIMIT).
"""

from __future__ import annotations

from typing import Any

import pytest

from spark.box_paths import FLEET_KEY
from spark.inventory import ConfigError, load_from_dicts
from spark.lane import Lane
from spark.memory import budget
from spark.plan import Backend, Plan, RouterBox, plan
from stages.show_plan import text

from .test_config import BIG, PROBLEM_LINE, TWO_SPARKS, group_defaults, merged

IMAGE = "nvcr.io/nvidia/vllm:26.04-py3"


def small(name: str, port: int, fraction: float, **changes: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE,
        "model": "Qwen/Qwen3-0.6B",
        "served_name": name,
        "port": port,
        "memory_fraction": fraction,
        "max_model_len": 8192,
        **changes,
    }


def lanes(*dicts: dict[str, Any]) -> list[Lane]:
    return [Lane.model_validate(lane) for lane in dicts]


def refused(hosts: dict[str, dict[str, Any]]) -> list[str]:
    """The problems these boxes (over group_data) are refused with; [] if none."""
    try:
        load_from_dicts(merged(hosts))
    except ConfigError as error:
        assert all(PROBLEM_LINE.fullmatch(line) for line in error.problems), error.problems
        return error.problems
    return []


def independent(**boxes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {"fabric_topology": "independent", **data} for name, data in boxes.items()}


# The on-demand budget (spark/memory.py).

RESIDENT = small("resident", 10101, 0.4)
Y = small("y", 10102, 0.3, on_demand_idle_s=900)
Z = small("z", 10103, 0.25, on_demand_idle_s=600)
W = small("w", 10104, 0.15, on_demand_idle_s=300)


def test_two_on_demand_lanes_that_cannot_fit_together_conflict_and_the_larger_counts() -> None:
    # A 128 GiB box: the resident 0.4 and a router of 1.28 GiB (1.28/128 = 0.01) leave
    # 0.9 - 0.41 = 0.49; y and z together take 0.55: they conflict. The most memory up at once
    # is y alone (0.3 > 0.25): 0.41 + 0.3 = 0.71 of the box, leaving 128 x 0.29 = 37.12 GiB.
    box = budget(lanes(RESIDENT, Y, Z), 128, router_gib=1.28)

    assert box.room == 0.49
    assert box.conflicts == (("y", "z"),)
    assert [share.lane.name for share in box.largest_set] == ["y"]
    assert box.fraction == 0.71
    assert round(box.free_gib, 2) == 37.12
    assert box.problems() == []


def test_the_largest_set_is_the_most_memory_no_two_of_it_in_conflict() -> None:
    # w (0.15) fits beside either: y + w = 0.45 and z + w = 0.4, both under the room of 0.49;
    # y and z still conflict. Of {y, w} (0.45) and {z, w} (0.4), {y, w} holds more: 0.86.
    box = budget(lanes(RESIDENT, Y, Z, W), 128, router_gib=1.28)

    assert box.conflicts == (("y", "z"),)
    assert [share.lane.name for share in box.largest_set] == ["y", "w"]
    assert box.fraction == 0.86


def test_without_on_demand_lanes_the_budget_is_the_lanes_and_the_router() -> None:
    # 0.4 + 1.28/128 on a 128 GiB box: 128 x (1 - 0.41) = 75.52 GiB free.
    box = budget(lanes(RESIDENT), 128, router_gib=1.28)

    assert (box.conflicts, box.largest_set, box.fraction) == ((), (), 0.41)
    assert round(box.free_gib, 2) == 75.52


def test_on_demand_lanes_that_all_fit_together_do_not_conflict() -> None:
    # 0.4 + 0.15 + 0.25 = 0.8 on a box without the router: under 0.9, both may be up at once.
    box = budget(lanes(RESIDENT, Z, W), 128)

    assert box.conflicts == ()
    assert [share.lane.name for share in box.largest_set] == ["z", "w"]
    assert box.fraction == 0.8


def test_three_on_demand_lanes_that_fit_two_by_two_but_not_together_are_refused() -> None:
    # Three of 0.2 beside 0.4 resident (no router): each pair 0.8, under 0.9, so none conflict
    # and all three may be up at once: 0.4 + 0.6 = 1.0, above 0.9.
    three = [small(name, port, 0.2, on_demand_idle_s=60) for name, port in (("a", 10111),
             ("b", 10112), ("c", 10113))]  # fmt: skip

    assert budget(lanes(RESIDENT, *three), 128).problems() == [
        "a and b and c: on demand, no two in conflict, so all may be up at once: 0.6 beside the"
        " 0.4 (resident 0.4) always held is above 0.9; lower their memory_fraction to a total of"
        " 0.5 or less, or serve one from another box"
    ]


def test_an_on_demand_lane_the_box_can_never_hold_is_refused_naming_box_lane_and_fix() -> None:
    # 0.4 resident and 0.55 on demand: 0.95, above 0.9 with no other lane up; the room is 0.5.
    # (Refused by the box's own check, before the router's share is added across the boxes.)
    too_large = small("y", 10102, 0.55, on_demand_idle_s=900)

    assert refused({"spark-1": {"lanes": [RESIDENT, too_large]}}) == [
        "spark-1: lanes: y: on demand at memory_fraction 0.55, but the box always holds 0.4"
        " (resident 0.4): above 0.9 with it, it could never start; lower its memory_fraction to"
        " 0.5 or less, or serve it from another box"
    ]


def test_the_routers_share_can_leave_an_on_demand_lane_no_room_on_its_box() -> None:
    # On a lone Spark (121.69 GiB) 0.4 resident and 0.5 on demand fill 0.9 exactly; the
    # router's 1 GiB (1/121.69 = 0.008218) puts it above: only the router's box is refused.
    box = {"lanes": [RESIDENT, small("y", 10102, 0.5, on_demand_idle_s=900)]}

    assert refused(independent(a=box, b=box)) == [
        "a: lanes: y: on demand at memory_fraction 0.5, but the box always holds 0.408218"
        " (resident 0.4, the router 1 GiB): above 0.9 with it, it could never start; lower its"
        " memory_fraction to 0.491782 or less, or serve it from another box"
    ]


@pytest.mark.parametrize("idle", [0, -30])
def test_an_idle_time_of_zero_or_below_is_refused(idle: int) -> None:
    (problem,) = refused({"spark-1": {"lanes": [small("y", 10102, 0.3, on_demand_idle_s=idle)]}})

    assert problem.startswith(
        f"spark-1: lanes: y: on_demand_idle_s: Input should be greater than 0 (got {idle});"
        " allowed: None: resident"
    )


def test_a_cluster_lane_is_never_on_demand() -> None:
    hosts = {
        "spark-1": TWO_SPARKS["spark-1"] | {"lanes": [BIG | {"on_demand_idle_s": 900}]},
        "spark-2": TWO_SPARKS["spark-2"] | {"lanes": []},
    }

    assert refused(hosts) == [
        "spark-1: lanes: big: on_demand_idle_s: a cluster lane holds a rank on every box of the"
        " cluster, which start together; keep it resident (leave on_demand_idle_s out)"
    ]


# The router's box, port and keys (spark/fleet.py).


def test_the_router_runs_on_the_head_by_default_and_counts_there_only() -> None:
    # The default appliance (0.45 + 0.35) on both boxes of a pair; the router on the head:
    # 121.69 x (1 - 0.8) - 1 = 23.338 GiB left there, 24.338 on the worker.
    whole = plan(load_from_dicts(merged(TWO_SPARKS)))

    assert whole.fleet.boxes == (RouterBox(name="spark-1", address="spark-1"),)
    assert (whole.fleet.port, whole.fleet.loopback_port) == (10100, 11100)
    assert (whole.fleet.key_path, FLEET_KEY) == ("/etc/spark/secrets/_fleet.key",) * 2
    assert (whole.fleet.health_interval_s, whole.fleet.memory_gib) == (10, 1.0)
    head, worker = whole.box("spark-1").memory, whole.box("spark-2").memory
    assert (head.router_gib, head.free_gib) == (1.0, 23.34)
    assert (worker.router_gib, worker.free_gib) == (0.0, 24.34)


def test_of_independent_boxes_the_first_runs_the_router_and_a_failover_counts_too() -> None:
    hosts = independent(a={}, b={}, c={})
    assert plan(load_from_dicts(merged(hosts))).fleet.boxes == (RouterBox(name="a", address="a"),)

    hosts = {name: data | {"router_box": "b", "router_failover_box": "c"} for name, data in
             hosts.items()}  # fmt: skip
    whole = plan(load_from_dicts(merged(hosts)))
    assert [box.name for box in whole.fleet.boxes] == ["b", "c"]
    assert [whole.box(name).memory.router_gib for name in "abc"] == [0.0, 1.0, 1.0]


def test_a_router_box_not_in_the_inventory_is_refused() -> None:
    hosts = independent(a={"router_box": "z"}, b={"router_box": "z"})

    assert refused(hosts) == [
        "a, b: router_box: 'z' is no box of the inventory (a, b); name one of them, or None"
        " (the head)"
    ]
    hosts = independent(a={"router_failover_box": "a"}, b={"router_failover_box": "a"})
    assert refused(hosts) == [
        "a: router_failover_box: 'a' is the router's own box; name another box, or None (no"
        " failover)"
    ]
    hosts = independent(a={"router_failover_box": "y"}, b={"router_failover_box": "y"})
    assert refused(hosts) == [
        "a, b: router_failover_box: 'y' is no box of the inventory (a, b); name one of them, or"
        " None (no failover)"
    ]


def test_router_keys_that_differ_between_boxes_are_refused_against_the_heads() -> None:
    hosts = {**TWO_SPARKS, "spark-2": TWO_SPARKS["spark-2"] | {"router_port": 10200}}

    assert refused(hosts) == [
        "spark-2: router_port: 10200 differs from spark-1's 10100; set the router's keys once, in"
        " group_data, for every box"
    ]


@pytest.mark.parametrize(
    ("port", "problem"),
    [
        # the default lanes: coder on 10101 (its server on 11101), fast on 10102 (11102)
        (10101, "10101 (the router's) is the port of lane coder (lanes)"),
        # the router's own port is router_port + 1000: 10102 + 1000 = 11102, fast's server
        (
            10102,
            "11102 (the router's own, on 127.0.0.1 (router_port + 1000)) is the loopback_port of"
            " lane fast (lanes)",
        ),
        (9100, "9100 (the router's) is the metrics endpoint's (metrics_port)"),
        (9101, "9101 (the router's) is the node exporter's (metrics_port + 1)"),
        # Ray's GCS 6379 and the six ports after it (spark/ports.py)
        (6380, "6380 (the router's) is Ray's (6379-6385, 8265, 10001, 20000-20999)"),
    ],
)
def test_a_router_port_taken_on_its_box_is_refused(port: int, problem: str) -> None:
    hosts = {name: data | {"router_port": port} for name, data in TWO_SPARKS.items()}

    found = refused(hosts)
    assert f"spark-1: router_port: {problem}; give router_port another port" in found
    assert all(line.startswith("spark-1: router_port: ") for line in found)


def test_a_router_port_is_checked_on_the_routers_box_only() -> None:
    # The worker serves a lane on 10100; the router runs on the head, whose lanes leave it free.
    on_10100 = small("other", 10100, 0.3)
    hosts = {**TWO_SPARKS, "spark-2": TWO_SPARKS["spark-2"] | {"lanes": [on_10100]}}

    assert refused(hosts) == []
    moved = {name: data | {"router_box": "spark-2"} for name, data in hosts.items()}
    # and both ports' servers behind the front: the lane's on 11100, the router's own too
    assert refused(moved) == [
        "spark-2: router_port: 10100 (the router's) is the port of lane other (lanes); give"
        " router_port another port",
        "spark-2: router_port: 11100 (the router's own, on 127.0.0.1 (router_port + 1000)) is"
        " the loopback_port of lane other (lanes); give router_port another port",
    ]


# Replicas: one served name on several boxes.


def test_identical_lanes_of_one_served_name_are_replicas_in_one_route() -> None:
    # memory_fraction, the lane's name and its port may differ: not its answers.
    a = small("coder", 10101, 0.4, served_name="coder")
    b = small("coder-b", 10105, 0.3, served_name="coder", on_demand_idle_s=600)
    whole = plan(load_from_dicts(merged(independent(a={"lanes": [a]}, b={"lanes": [b]}))))

    (route,) = whole.fleet.routes
    assert route.served_name == "coder"
    assert route.backends == (
        Backend(box="a", address="a", port=10101, lane="coder", key=True, tls=False,
                on_demand=False, key_variable="SPARK_LANE_KEY_1", timeout_s=3600),
        # On demand: its load (lane_start_timeout_min 20, group_data) before its answer.
        Backend(box="b", address="b", port=10105, lane="coder-b", key=True, tls=False,
                on_demand=True, key_variable="SPARK_LANE_KEY_2", timeout_s=20 * 60 + 3600),
    )  # fmt: skip


def test_a_cluster_lane_is_routed_to_the_head_that_serves_it() -> None:
    # Seed 004's cluster lane on the head of a pair (a rank on the worker serves nothing), the
    # worker's own lane beside it: two routes, each one backend.
    hosts = {
        "spark-1": TWO_SPARKS["spark-1"] | {"lanes": [BIG]},
        "spark-2": TWO_SPARKS["spark-2"] | {"lanes": [small("small", 10102, 0.07)]},
    }
    routes = plan(load_from_dicts(merged(hosts))).fleet.routes

    assert [(route.served_name, [(b.box, b.port) for b in route.backends]) for route in routes] == [
        ("big", [("spark-1", 10103)]),
        ("small", [("spark-2", 10102)]),
    ]


def test_replicas_that_would_answer_differently_are_refused_naming_both_boxes() -> None:
    a = small("coder", 10101, 0.4, served_name="coder")
    b = a | {"model": "inference-optimization/Qwen3.6-35B-A3B-NVFP4", "max_model_len": 16384}

    assert refused(independent(a={"lanes": [a]}, b={"lanes": [b]})) == [
        "a, b: lanes: coder (a) and coder (b) both serve coder, but their model differs"
        " ('Qwen/Qwen3-0.6B' and 'inference-optimization/Qwen3.6-35B-A3B-NVFP4'): another"
        " model gives other answers; set the same model on both, or give one its own"
        " served_name",
        "a, b: lanes: coder (a) and coder (b) both serve coder, but their max_model_len differs"
        " (8192 and 16384): a request one replica takes, the other refuses; set the same"
        " max_model_len on both, or give one its own served_name",
    ]
    c = a | {"kv_cache_dtype": "fp8"}
    (problem,) = refused(independent(a={"lanes": [a]}, c={"lanes": [c]}))
    assert problem.startswith(
        "a, c: lanes: coder (a) and coder (c) both serve coder, but their kv_cache_dtype differs"
        " (None and 'fp8'): the cache's precision changes answers"
    )


def test_every_problem_of_the_fleet_and_the_cluster_is_shown_at_once() -> None:
    # A router box that is none of them, replicas of another model, and an MTU that differs
    # (the cluster's own check): three independent problems, one refusal.
    other = merged({"spark-1": {}})["spark-1"]["lanes"][0] | {"max_model_len": 65536}
    hosts = {
        "spark-1": TWO_SPARKS["spark-1"] | {"router_box": "spark-9"},
        "spark-2": TWO_SPARKS["spark-2"] | {"router_box": "spark-9", "fabric_mtu": 9216,
                                            "lanes": [other]},
    }  # fmt: skip

    found = refused(hosts)
    assert [line.split(": ")[1] for line in found] == ["fabric_mtu", "router_box", "lanes"]
    assert found[1] == (
        "spark-1, spark-2: router_box: 'spark-9' is no box of the inventory (spark-1, spark-2);"
        " name one of them, or None (the head)"
    )


# The plan and `make plan`.


def test_the_plan_lists_each_boxs_on_demand_lanes_conflicts_and_largest_set() -> None:
    # A lone Spark: 0.4 resident and the router's 1 GiB (0.008218) leave 0.491782; y (0.3)
    # and z (0.25) conflict (0.55), w (0.15) fits beside either: the most is y and w, 0.45.
    # 121.69 x (1 - 0.4 - 0.45) - 1 = 17.2535 GiB free at most loaded.
    whole = plan(load_from_dicts(merged({"spark-1": {"lanes": [RESIDENT, Y, Z, W]}})))
    memory = whole.box("spark-1").memory

    assert [(share.lane, share.on_demand_idle_s) for share in memory.shares] == [
        ("resident", None), ("y", 900), ("z", 600), ("w", 300)
    ]  # fmt: skip
    assert memory.conflicts == (("y", "z"),)
    assert memory.largest_on_demand == ("y", "w")
    assert memory.free_gib == 17.25
    assert [backend.on_demand for route in whole.fleet.routes for backend in route.backends] == [
        False, True, True, True
    ]  # fmt: skip
    assert Plan.model_validate_json(whole.model_dump_json()) == whole

    shown = text(whole)
    assert (
        "              y: 0.3 = 36.51 GiB, needs ~6.38 GiB; on demand, stopped after 900 s idle\n"
        in shown
    )
    assert "              the fleet's router: 1 GiB\n" in shown
    assert "              on demand: never up together: y and z\n" in shown
    assert "              on demand: the most up at once (counted above): y, w\n" in shown


def test_make_plan_shows_the_router_and_every_route_with_its_replicas() -> None:
    hosts = independent(a={}, b={"router_box": "b"}, c={})
    hosts = {name: data | {"router_box": "b", "router_failover_box": "c"} for name, data in
             hosts.items()}  # fmt: skip
    whole = plan(load_from_dicts(merged(hosts)))

    assert Plan.model_validate_json(whole.model_dump_json()) == whole
    shown = text(whole)
    # group_data's lanes on every box: each served name has three replicas.
    assert (
        "the fleet endpoint\n"
        "  router      on b (b), failover c (c), port 10100 (the router on 127.0.0.1:11100)\n"
        "              fleet key /etc/spark/secrets/_fleet.key; each lane checked every 10 s;"
        " 1 GiB of its box\n"
        "              litellm[proxy]==1.106.12 prometheus-client==0.26.0: 119 pinned packages"
        " from the default index of pip\n"
        "              unit spark-router.service: /var/lib/spark/router/venv/bin/litellm"
        " --config /etc/spark/router/litellm.yaml --host 127.0.0.1 --port 11100"
        " --num_workers 1\n"
        # Resident lanes: each waited for ANSWER_WAIT_S (spark/plan.py) between two reads.
        "  routes      qwen3-coder-next -> a:10101 (coder, timeout 3600 s), b:10101 (coder,"
        " timeout 3600 s), c:10101 (coder, timeout 3600 s); 3 replicas\n"
        "              qwen3.6-35b-a3b -> a:10102 (fast, timeout 3600 s), b:10102 (fast,"
        " timeout 3600 s), c:10102 (fast, timeout 3600 s); 3 replicas\n"
    ) in shown


def test_a_boxs_own_problem_does_not_hide_the_fleets() -> None:
    # spark-2's driver branch is its own problem (group_data's stands in for the checks across
    # the boxes); the router on a box the inventory lacks is listed in the same round.
    hosts = {name: data | {"router_box": "spark-9"} for name, data in TWO_SPARKS.items()}
    hosts["spark-2"] = hosts["spark-2"] | {"driver_branch": 590}

    with pytest.raises(ConfigError) as caught:
        load_from_dicts(merged(hosts), defaults=group_defaults())
    assert [line.split(": ")[:2] for line in caught.value.problems] == [
        ["spark-2", "driver_branch"],
        ["spark-1, spark-2", "router_box"],
    ]

"""spark/plan.py: each box's plan from the validated inventory, for every fabric shape and lane mix.

The expected values are written here from the sources the planner follows, each named beside
it (NVIDIA's spark_cluster_setup.py, vLLM's docs, the field's seeds, group_data/all.py's
defaults), never read back from the planner. group_data's defaults in play: the two lanes of
seed 003 (coder on 10101 at 0.45, fast on 10102 at 0.35), ray_port 6379, ray_image
nvcr.io/nvidia/vllm:26.04-py3, the NCCL test up to 1 GiB.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from spark.inventory import load_from_dicts
from spark.lane import MpRank
from spark.plan import BoxPlan, Plan, Share, fetching, plan
from stages.show_plan import box_text
from tests.e2e.cluster_lane import CLUSTER_LANE
from tests.e2e.readme_lane import readme_lane
from tests.unit.test_config import REPO, TWO_SPARKS, merged
from tests.unit.test_llamacpp import SEED_002
from tests.unit.test_topology import boxes, ring

NGC = "nvcr.io/nvidia/vllm:26.04-py3"  # group_data's ray_image and the default lanes' image


def planned(hosts: dict[str, dict[str, Any]]) -> Plan:
    return plan(load_from_dicts(hosts))


def box(hosts: dict[str, dict[str, Any]], name: str) -> BoxPlan:
    return planned(hosts).box(name)


# Fabric shapes.


def test_a_pair_worker_reaches_the_head_on_each_twin_and_joins_its_ray() -> None:
    worker = box(merged(TWO_SPARKS), "spark-2")

    assert worker.fabric is not None and worker.cluster is not None
    # Each twin's peer is the head's twin on the same /24 (NVIDIA's two-Spark plan).
    assert [(p.ifname, p.box, p.address) for p in worker.fabric.peers] == [
        ("enp1s0f1np1", "spark-1", "192.168.100.10"),
        ("enP2p1s0f1np1", "spark-1", "192.168.101.10"),
    ]
    assert worker.fabric.ports == (("enp1s0f1np1", 1), ("enP2p1s0f1np1", 1))  # a pair: port 1
    assert worker.fabric.ifnames == ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert worker.fabric.management is None  # only a ring's rendezvous goes over it
    # torch's rendezvous at the head's first twin, vLLM's own address the box's (vLLM docs).
    assert worker.environment.variables["MASTER_ADDR"] == "192.168.100.10"
    assert worker.environment.variables["VLLM_HOST_IP"] == "192.168.100.11"
    assert worker.environment.variables["RAY_memory_monitor_refresh_ms"] == "0"  # seed 001
    ray = worker.cluster.ray
    assert ray is not None
    assert (ray.role, ray.node_ip, ray.head_ip, ray.port, ray.auth, ray.image) == (
        "worker",
        "192.168.100.11",
        "192.168.100.10",
        6379,
        True,
        NGC,
    )
    firewall = worker.cluster.firewall
    assert firewall is not None
    assert firewall.fabric == {
        "enp1s0f1np1": "192.168.100.0/24",
        "enP2p1s0f1np1": "192.168.101.0/24",
    }
    assert firewall.open_ports == (22, 10101, 10102)  # SSH and seed 003's two lanes
    # Ray's GCS at 6379 and its six ports after it, the dashboard, the client server, the
    # workers' 20000-20999 (spark/ports.py, from Ray's own port options).
    assert firewall.ports == ((6379, 6385), (8265, 8265), (10001, 10001), (20000, 20999))
    run = worker.cluster.nccl_test
    assert run is not None
    # NVIDIA's MIN_NCCL_TEST_BW (spark_cluster_setup.py), group_data's 1 GiB.
    assert (run.rank, run.world, run.min_busbw_gbs, run.max_bytes) == (1, 2, 21.875, 1 << 30)
    assert run.image == NGC and run.boxes == ("spark-1", "spark-2")
    assert run.hcas == ("rocep1s0f1", "roceP2p1s0f1")
    assert worker.cluster.nccl_image is None  # Ray's node pulls its image
    assert worker.cluster.lane is None


def test_a_ring_goes_over_the_management_network_without_ray_or_firewall() -> None:
    # spark_cluster_setup.py run_nccl_test: a ring's ranks at the nodes' management addresses,
    # NCCL's sockets on enP7s7; its pass mark MIN_NCCL_TEST_BW_RING = 10.
    second = box(ring(), "spark-2")

    assert second.fabric is not None and second.cluster is not None
    assert second.fabric.management == ("enP7s7", "10.0.0.22")  # the inventory's enP7s7
    variables = second.environment.variables
    assert variables["MASTER_ADDR"] == "10.0.0.21"
    assert variables["VLLM_HOST_IP"] == "10.0.0.22"
    assert variables["NCCL_SOCKET_IFNAME"] == "enP7s7"
    assert variables["NCCL_IB_MERGE_NICS"] == "0" and variables["NCCL_NET_PLUGIN"] == "none"
    assert second.cluster.firewall is None and second.cluster.ray is None
    assert second.cluster.nccl_image == NGC  # no Ray node pulls it there
    run = second.cluster.nccl_test
    assert run is not None and (run.rank, run.world, run.min_busbw_gbs) == (1, 3, 10.0)


def test_a_rings_peers_are_the_other_ends_of_each_cable() -> None:
    second = box(ring(), "spark-2")

    assert second.fabric is not None
    # spark-2's port 1 meets spark-1's port 0, its port 0 spark-3's port 1 (connect-three-
    # sparks); one /24 per twin per cable, counted from 192.168.100.0 (eugr's NETWORKING.md).
    assert [(p.ifname, p.box, p.address) for p in second.fabric.peers] == [
        ("enp1s0f1np1", "spark-1", "192.168.100.10"),
        ("enP2p1s0f1np1", "spark-1", "192.168.101.10"),
        ("enp1s0f0np0", "spark-3", "192.168.102.12"),
        ("enP2p1s0f0np0", "spark-3", "192.168.103.12"),
    ]


def test_every_box_of_a_switch_has_a_peer_per_other_box_on_each_twin() -> None:
    fourth = box(boxes(4, fabric_topology="switch"), "spark-4")

    assert fourth.fabric is not None and fourth.cluster is not None
    # One /24 per twin, the fourth box .13 (spark_cluster_setup.py LAST_OCTET_START = 10).
    assert [str(link.address) for link in fourth.fabric.links] == [
        "192.168.100.13/24",
        "192.168.101.13/24",
    ]
    # The same twin on every other box, in the inventory's order.
    assert [(p.ifname, p.box, p.address) for p in fourth.fabric.peers] == [
        ("enp1s0f1np1", "spark-1", "192.168.100.10"),
        ("enp1s0f1np1", "spark-2", "192.168.100.11"),
        ("enp1s0f1np1", "spark-3", "192.168.100.12"),
        ("enP2p1s0f1np1", "spark-1", "192.168.101.10"),
        ("enP2p1s0f1np1", "spark-2", "192.168.101.11"),
        ("enP2p1s0f1np1", "spark-3", "192.168.101.12"),
    ]
    assert fourth.environment.variables["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"
    run = fourth.cluster.nccl_test
    assert run is not None and (run.rank, run.world) == (3, 4)


def test_a_pair_on_two_cables_uses_all_four_twins() -> None:
    second = box(boxes(2, fabric_topology="pair-dual"), "spark-2")

    assert second.fabric is not None
    assert second.fabric.ports == (
        ("enp1s0f1np1", 1),
        ("enP2p1s0f1np1", 1),
        ("enp1s0f0np0", 0),
        ("enP2p1s0f0np0", 0),
    )
    assert second.fabric.ifnames == [
        "enp1s0f1np1",
        "enP2p1s0f1np1",
        "enp1s0f0np0",
        "enP2p1s0f0np0",
    ]
    assert second.environment.variables["NCCL_IB_HCA"] == (
        "rocep1s0f1,roceP2p1s0f1,rocep1s0f0,roceP2p1s0f0"
    )


def test_a_lone_box_has_no_fabric_and_no_cluster() -> None:
    lone = box(merged({"spark-1": {}}), "spark-1")

    assert lone.fabric is None and lone.cluster is None
    assert lone.environment.variables == {"RAY_memory_monitor_refresh_ms": "0"}
    assert lone.lane_units == ("coder", "fast")
    # One lane loads at a time (seed 003): fast after coder.
    assert [(lane.served.name, lane.served.after) for lane in lone.lanes] == [
        ("coder", None),
        ("fast", "coder"),
    ]
    assert lone.images == (NGC,)
    assert lone.front.lanes[0].port == 10101 and lone.front.lanes[0].backend_port == 11101


def test_independent_boxes_are_each_planned_as_a_lone_box_and_say_so() -> None:
    hosts = merged({name: {"fabric_topology": "independent"} for name in ("gx10-1", "gx10-2")})
    whole = planned(hosts)

    assert [each.name for each in whole.boxes] == ["gx10-1", "gx10-2"]
    for each in whole.boxes:
        # Each its own head and server: no twin, no cluster, a lone box's environment
        # (Ray's memory monitor off, seed 001: no NCCL variable), its own two default lanes.
        assert (each.role, each.independent) == ("head", True)
        assert each.fabric is None and each.cluster is None
        assert each.environment.variables == {"RAY_memory_monitor_refresh_ms": "0"}
        assert each.lane_units == ("coder", "fast")
        assert [lane.port for lane in each.front.lanes] == [10101, 10102]
    assert box(merged(TWO_SPARKS), "spark-1").independent is False


def test_make_plan_says_a_box_is_independent(tmp_path) -> None:
    inventory = tmp_path / "independent.py"
    boxes = [(name, {"fabric_topology": "independent"}) for name in ("gx10-1", "gx10-2")]
    inventory.write_text(f"spark = {boxes!r}\n")

    shown = show("--inventory", str(inventory), "--box", "gx10-2")

    assert shown.returncode == 0, shown.stderr
    assert "gx10-2 (independent), reached at gx10-2" in shown.stdout
    said = "none: an independent server (fabric_topology independent)"
    assert f"  fabric      {said}" in shown.stdout
    assert f"  cluster     {said}" in shown.stdout


# Lane mixes.


def cluster_pair(executor: str) -> dict[str, dict[str, Any]]:
    lane = CLUSTER_LANE | {"executor": executor} if executor == "mp" else CLUSTER_LANE
    hosts = merged(TWO_SPARKS)
    hosts["spark-1"]["lanes"] = [lane]
    hosts["spark-2"]["lanes"] = []
    return hosts


def test_a_cluster_lane_on_ray_runs_from_the_head_and_its_rank_counts_on_the_worker() -> None:
    both = planned(cluster_pair("ray"))
    head, worker = both.box("spark-1"), both.box("spark-2")

    assert head.cluster is not None and worker.cluster is not None
    lane = head.cluster.lane
    assert lane is not None and lane.served is not None
    assert lane.served.ray_address == "192.168.100.10:6379"  # the head's GCS on its first twin
    assert lane.served.after is None  # no lane of its own before it
    # Checked on each box (fetch_weights off, group_data's default): no fetch, no copy.
    assert not lane.weights.fetch and lane.served.fetch_unit is None
    # Each box loads the cluster lane's model from its own copy: in use on both, never pruned.
    assert CLUSTER_LANE["model"] in head.models_in_use
    assert CLUSTER_LANE["model"] in worker.models_in_use
    on_worker = worker.cluster.lane
    assert on_worker is not None
    assert on_worker.served is None  # the worker's Ray node holds its rank
    assert on_worker.weights.model == CLUSTER_LANE["model"] and not on_worker.weights.fetch
    # The test proves the fabric in the lane's own image, before the lane starts.
    assert worker.cluster.nccl_test is not None and worker.cluster.nccl_test.image == NGC
    # Seed 004's 0.87 of each box: on the worker, its rank's share of 121.69 GiB, 105.87 GiB.
    # It needs seed 004's 57.64 GiB of weights per node; its fp8 KV cache for 40960 tokens,
    # 2 (K and V) x 94 layers x 2 KV heads (4 over 2 ranks) x 128 x 1 byte = 48128 B a token,
    # 1.836 GiB; and 4 GiB beside them (spark/memory.py OVERHEAD_GIB): 63.48 GiB.
    assert worker.memory.shares == (
        Share(
            lane="big",
            rank=True,
            fraction=0.87,
            share_gib=105.87,
            needs_gib=63.48,
            on_demand_idle_s=None,
        ),
    )
    # 121.69 x (1 - 0.87) = 15.82 GiB free once loaded.
    assert worker.memory.free_gib == 15.82
    assert worker.lane_units == ()  # on Ray the rank has no unit of its own


def test_a_cluster_lane_on_mp_has_a_rank_unit_on_every_box() -> None:
    both = planned(cluster_pair("mp"))
    head, worker = both.box("spark-1"), both.box("spark-2")

    assert head.cluster is not None and worker.cluster is not None
    assert head.cluster.ray is None and head.cluster.ray_removed
    head_lane, worker_lane = head.cluster.lane, worker.cluster.lane
    assert head_lane is not None and worker_lane is not None
    assert head_lane.served is not None and worker_lane.served is not None
    # vLLM's multi-node mode: node rank 0 serves, the others are headless, all meeting at the
    # head's first twin on the master port 29501 (vLLM's default).
    assert head_lane.served.rank == MpRank(0, "192.168.100.10", 29501)
    assert worker_lane.served.rank == MpRank(1, "192.168.100.10", 29501)
    assert head_lane.served.peers == ("192.168.100.11",)
    assert worker_lane.served.peers == ("192.168.100.10",)
    assert (head_lane.served.peer_boxes, worker_lane.served.peer_boxes) == (
        ("spark-2",),
        ("spark-1",),
    )
    assert worker.lane_units == ("big",)  # the guard watches the rank's unit too
    assert [lane for lane, _ in worker.memory_guard.lanes] == ["big"]


def test_a_llama_cpp_lane_is_fetched_on_the_host_and_its_command_names_a_vllm_image() -> None:
    llama = {"spark-1": {"lanes": [SEED_002], "fetch_weights": True}}
    lone = box(merged(llama), "spark-1")

    gguf = lone.lanes[0]
    # Fetched by the box's own fetch unit (files/spark_fetch.py on the host): no other image.
    assert gguf.served.fetch_unit == "spark-fetch-unsloth--Qwen3-Coder-Next-GGUF.service"
    assert gguf.weights.files == ("Qwen3-Coder-Next-UD-Q4_K_XL.gguf",)
    assert lone.images == ("ghcr.io/ardge-labs/llama-cpp-dgx-spark:server",)
    # The command shown with fetch_weights off runs `hf`, which a llama.cpp image lacks: Ray's
    # image (group_data's NGC one).
    assert gguf.weights.image == NGC


def test_fetch_weights_gives_each_own_lane_its_fetch_unit_and_the_hub() -> None:
    # group_data's two lanes (seed 003's models) and its hub, huggingface_hub's default endpoint.
    on = box(merged({"spark-1": {"fetch_weights": True}}), "spark-1")
    assert [lane.served.fetch_unit for lane in on.lanes] == [
        "spark-fetch-bullpoint--Qwen3-Coder-Next-AWQ-4bit.service",
        "spark-fetch-inference-optimization--Qwen3.6-35B-A3B-NVFP4.service",
    ]
    assert {lane.weights.endpoint for lane in on.lanes} == {"https://huggingface.co"}
    # The room a fetch needs where the hub does not answer: the catalog's weights_gib
    # (spark/data/model-catalog.json: 40.0 and 20.0 GiB), in bytes.
    assert [lane.weights.catalog_bytes for lane in on.lanes] == [40 * 2**30, 20 * 2**30]
    assert on.models_in_use == (
        "bullpoint/Qwen3-Coder-Next-AWQ-4bit",
        "inference-optimization/Qwen3.6-35B-A3B-NVFP4",
    )
    assert not on.prune_unused  # group_data: never by default
    off = box(merged({"spark-1": {"hf_endpoint": "http://hub.lab:8790/"}}), "spark-1")
    assert [lane.served.fetch_unit for lane in off.lanes] == [None, None]
    assert {lane.weights.endpoint for lane in off.lanes} == {"http://hub.lab:8790"}


def test_a_model_both_boxes_serve_comes_from_the_hub_to_the_first_and_over_the_fabric_after() -> (
    None
):
    # A pair: group_data's two lanes on both boxes; the first box in the inventory (the head)
    # fetches from the hub and serves its blobs on its first twin (NVIDIA's plan: .10).
    hosts = merged(TWO_SPARKS)
    for data in hosts.values():
        data["fetch_weights"] = True
    head, worker = box(hosts, "spark-1"), box(hosts, "spark-2")
    assert head.weights_share == "192.168.100.10"
    assert [lane.weights.source for lane in head.lanes] == [None, None]
    assert worker.weights_share is None
    assert [lane.weights.source for lane in worker.lanes] == [
        "http://192.168.100.10:60991/models--bullpoint--Qwen3-Coder-Next-AWQ-4bit/blobs",
        "http://192.168.100.10:60991/models--inference-optimization--Qwen3.6-35B-A3B-NVFP4/blobs",
    ]
    # fleet_copy_weights off: each box from the hub.
    for data in hosts.values():
        data["fleet_copy_weights"] = False
    off = box(hosts, "spark-2")
    assert off.weights_share is None and box(hosts, "spark-1").weights_share is None
    assert [lane.weights.source for lane in off.lanes] == [None, None]


def fetching_cluster_pair(executor: str) -> dict[str, dict[str, Any]]:
    hosts = cluster_pair(executor)
    for data in hosts.values():
        data["fetch_weights"] = True
    return hosts


BIG_UNIT = "spark-fetch-Qwen--Qwen3-235B-A22B-GPTQ-Int4.service"  # box_paths.fetch_unit's form
BIG_BLOBS = "http://192.168.100.10:60991/models--Qwen--Qwen3-235B-A22B-GPTQ-Int4/blobs"


def test_a_cluster_lanes_model_comes_from_the_hub_to_the_head_and_over_the_fabric_after() -> None:
    # fetch_weights on: the head's fetch unit takes it from the hub and the head serves its
    # blobs on its first twin (NVIDIA's two-Spark plan: .10, port 60991, box_paths.WEIGHTS_PORT);
    # the worker's unit copies them from there, the hub's hashes checked all the same.
    both = planned(fetching_cluster_pair("ray"))
    head, worker = both.box("spark-1"), both.box("spark-2")
    assert head.cluster is not None and worker.cluster is not None
    on_head, on_worker = head.cluster.lane, worker.cluster.lane
    assert on_head is not None and on_worker is not None
    assert on_head.weights.fetch and on_head.weights.source is None
    assert on_worker.weights.fetch and on_worker.weights.source == BIG_BLOBS
    assert head.weights_share == "192.168.100.10" and worker.weights_share is None
    # The head's lane starts once its fetch lands, queued after it (After=).
    assert on_head.served is not None and on_head.served.fetch_unit == BIG_UNIT
    # The room each box's fetch needs where the hub does not answer: the whole model, the
    # catalog's weights_gib (spark/data/model-catalog.json: 115.28, twice seed 004's 57.64 GiB
    # a node), in bytes: every box holds every file, each rank loading its share.
    assert on_worker.weights.catalog_bytes == on_head.weights.catalog_bytes == int(115.28 * 2**30)
    # The NCCL test waits for the model on every box (the copy shares the fabric it measures).
    assert head.cluster.nccl_test is not None and worker.cluster.nccl_test is not None
    assert head.cluster.nccl_test.waits_for == CLUSTER_LANE["model"]
    assert worker.cluster.nccl_test.waits_for == CLUSTER_LANE["model"]
    # make plan says where the worker's copy comes from.
    assert f"its model copied over the fabric from {BIG_BLOBS}" in box_text(worker)
    assert "copied over the fabric" not in box_text(head)


def test_a_cluster_lanes_rank_on_mp_waits_for_its_own_boxs_fetch() -> None:
    both = planned(fetching_cluster_pair("mp"))
    worker = both.box("spark-2").cluster
    assert worker is not None and worker.lane is not None and worker.lane.served is not None
    assert worker.lane.served.fetch_unit == BIG_UNIT


def test_without_the_fleet_copy_each_box_fetches_the_cluster_lanes_model_from_the_hub() -> None:
    hosts = fetching_cluster_pair("ray")
    for data in hosts.values():
        data["fleet_copy_weights"] = False
    both = planned(hosts)
    for name in ("spark-1", "spark-2"):
        cluster = both.box(name).cluster
        assert cluster is not None and cluster.lane is not None
        assert cluster.lane.weights.fetch and cluster.lane.weights.source is None
        assert both.box(name).weights_share is None


def test_the_head_fetches_the_cluster_lanes_model_first_wherever_the_inventory_lists_it() -> None:
    hosts = fetching_cluster_pair("ray")
    worker_first = {"spark-2": hosts["spark-2"], "spark-1": hosts["spark-1"]}
    spark = load_from_dicts(worker_first)
    assert [box.name for box in fetching(spark, CLUSTER_LANE["model"])] == ["spark-1", "spark-2"]
    # A model no lane loads is fetched by no box; without fetch_weights neither is the cluster's.
    assert fetching(spark, "org/other") == []
    assert fetching(load_from_dicts(cluster_pair("ray")), CLUSTER_LANE["model"]) == []


def test_without_fetch_weights_the_nccl_test_waits_for_nothing() -> None:
    both = planned(cluster_pair("ray"))
    for name in ("spark-1", "spark-2"):
        cluster = both.box(name).cluster
        assert cluster is not None and cluster.nccl_test is not None
        assert cluster.nccl_test.waits_for is None
    # Nor with fetch_weights but no cluster lane: group_data's own lanes only.
    hosts = merged(TWO_SPARKS)
    for data in hosts.values():
        data["fetch_weights"] = True
    cluster = box(hosts, "spark-2").cluster
    assert cluster is not None and cluster.nccl_test is not None
    assert cluster.nccl_test.waits_for is None


# The plan as data.


def test_the_plans_json_reads_back_as_the_same_plan() -> None:
    independent = {name: {"fabric_topology": "independent"} for name in ("a", "b")}
    fetching = fetching_cluster_pair("ray")
    for hosts in (merged(TWO_SPARKS), cluster_pair("mp"), fetching, ring(), merged(independent)):
        whole = planned(hosts)
        assert Plan.model_validate_json(whole.model_dump_json()) == whole


def show(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stages.show_plan", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_make_plan_prints_every_box_of_the_owners_inventory_without_reaching_one() -> None:
    # inventories/lab.py names spark-1.local and spark-2.local: no such box answers here.
    shown = show("--inventory", "inventories/lab.py")

    assert shown.returncode == 0, shown.stderr
    assert "spark-1.local (head), reached at spark-1.local" in shown.stdout
    assert "spark-2.local (worker), reached at spark-2.local" in shown.stdout
    # group_data: metrics_port 9100 (the exporter on the next port), every 30 s
    assert (
        "  metrics     node exporter on 127.0.0.1:9101, nginx on 9100 asking the metrics key;"
        " collected every 30 s\n" in shown.stdout
    )
    # group_data: driver_version None (the build apt installs first, kept: operations/driver.py)
    assert "driver nvidia-driver-580-open at the build apt installs first (branch 580)" in (
        shown.stdout
    )
    as_json = show("--inventory", "inventories/lab.py", "--json", "--box", "spark-2.local")
    read = Plan.model_validate_json(as_json.stdout)
    assert [each.name for each in read.boxes] == ["spark-2.local"]
    assert json.loads(as_json.stdout)["boxes"][0]["role"] == "worker"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--box", "spark-9"], "--box spark-9: no such box (spark-1.local, spark-2.local)"),
        (["--inventory", "inventories/none.py"], "inventories/none.py: no such inventory file"),
    ],
)
def test_make_plan_refuses_what_it_cannot_show(args: list[str], said: str) -> None:
    shown = show(*args)

    assert shown.returncode == 2
    assert said in shown.stderr


def test_the_readmes_model_outside_the_catalog_planned_from_its_model_spec() -> None:
    small = readme_lane()
    coder = merged({"spark-1": {}})["spark-1"]["lanes"][0]
    lone = box(merged({"spark-1": {"lanes": [coder, small]}}), "spark-1")
    own = {lane.served.name: lane for lane in lone.lanes}
    assert own["small"].weights.model == "Qwen/Qwen3-0.6B"
    assert own["small"].served.after == "coder"  # one lane after the other, in the list's order
    assert [(lane.name, lane.port) for lane in lone.front.lanes] == [
        ("coder", 10101),
        ("small", 10103),
    ]
    # Qwen/Qwen3-0.6B's config.json (docs/reference.md): 2 (K and V) x 28 layers x 8 KV heads x 128
    # x 2 bytes (bf16) = 114688 B a token, 4.375 GiB for 40960 tokens; with its 1.5 GiB of weights
    # and 4 GiB beside them (spark/memory.py OVERHEAD_GIB): 9.875 GiB. Its share: 0.1 of the
    # Spark's 121.69 GiB (the planner's unified memory, as in the cluster lane's test above).
    small_share = Share(
        lane="small",
        rank=False,
        fraction=0.1,
        share_gib=12.17,
        needs_gib=9.88,
        on_demand_idle_s=None,
    )
    assert small_share in (lone.memory.shares)


# The GPU clock's lock (group_data: gpu_clock_lock_mhz, capetron/gb10-cluster-bench's
# `nvidia-smi -lgc 300,2200` unit).


def test_every_box_locks_its_gpu_clock_at_300_2200_by_default_and_one_box_may_differ() -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-2"]["gpu_clock_lock_mhz"] = (300, 2100)
    whole = planned(hosts)

    head, worker = whole.box("spark-1"), whole.box("spark-2")
    assert head.gpu_clock_lock is not None and worker.gpu_clock_lock is not None
    assert head.gpu_clock_lock.unit == "spark-gpu-clock-lock.service"
    assert head.gpu_clock_lock.command == "/usr/bin/nvidia-smi -lgc 300,2200"
    assert worker.gpu_clock_lock.command == "/usr/bin/nvidia-smi -lgc 300,2100"
    # The collector compares the unit's journal line with the same range.
    assert head.metrics is not None and head.metrics.expected.gpu_clock_lock == head.gpu_clock_lock
    assert (
        "GPU clock locked to 300-2200 MHz at every boot: spark-gpu-clock-lock.service runs"
        " `/usr/bin/nvidia-smi -lgc 300,2200` after nvidia-persistenced" in box_text(head)
    )


@pytest.mark.parametrize("off", [None, False])
def test_a_box_with_the_lock_off_has_no_unit_in_its_plan(off: object) -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-2"]["gpu_clock_lock_mhz"] = off
    worker = box(hosts, "spark-2")

    assert worker.gpu_clock_lock is None
    assert worker.metrics is not None and worker.metrics.expected.gpu_clock_lock is None
    assert "GPU clock not locked (gpu_clock_lock_mhz None): no unit, clocks reset" in box_text(
        worker
    )

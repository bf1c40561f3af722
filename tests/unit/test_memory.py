"""spark/memory.py: a box's memory shares (its own lanes and a cluster lane's rank), and the
totals, warnings, guard floors and fit advice read from them, on the head and the workers.

Every expected number is worked out here from the sources' figures: the catalog's entries
(spark/data/model-catalog.json), the 121.69 GiB CUDA reports of a Spark's 128 GB
(group_data/all.py), vLLM's KV heads per rank (max(1, kv_heads // tensor_parallel_size):
vllm/config/model.py, ModelConfig.get_num_kv_heads), llama.cpp's q8_0 (34 bytes per 32 values:
spark/llamacpp.py) and the project's 4 GiB of overhead per lane (spark/memory.py, OVERHEAD_GIB).
"""

from __future__ import annotations

from typing import Any

import pytest

from spark.inventory import ConfigError, load_from_dicts
from spark.lane import Lane
from spark.memory import GUARD_FLOOR_GIB, budget, kv_heads_per_rank

from .test_config import BIG, TWO_SPARKS, group_defaults, merged
from .test_llamacpp import gguf
from .test_recipes import SPARK_GIB, accepted, problems

GIB = 2**30
# Qwen/Qwen3-0.6B (catalog: 1.5 GiB, 28 layers, 8 KV heads of 128, bf16) with 8192 tokens:
# 1.5 + 2 x 28 x 8 x 128 x 2 bytes x 8192 / GiB (0.875) + 4 = 6.375 GiB, in 0.07 x 121.69 =
# 8.52 GiB; 0.08 gives 9.74.
SMALL = {
    "name": "small",
    "image": "nvcr.io/nvidia/vllm:26.04-py3",
    "model": "Qwen/Qwen3-0.6B",
    "served_name": "small",
    "port": 10102,
    "memory_fraction": 0.07,
    "max_model_len": 8192,
}
GUARD = "memory_guard_min_available_gib"
RANK_STOPS = (
    " (the cluster lane's rank counted: on executor mp the guard stops it, and the cluster lane"
    " with it)"
)
LOWER_IT = (
    "; lower the lanes' memory_fraction, or the floor (not below 8.5: there the guard stops a"
    " lane only after the driver fails)"
)


def checked(
    head: list[dict], worker: list[dict], head_data: dict | None = None, **worker_data: Any
) -> tuple[list[str], tuple[str, ...]]:
    """Two Sparks (TWO_SPARKS) with these lanes and data: (problems, the memory warnings; the
    short contexts' warnings are test_recipes.py's)."""
    hosts = {
        "spark-1": TWO_SPARKS["spark-1"] | {"lanes": head} | (head_data or {}),
        "spark-2": TWO_SPARKS["spark-2"] | {"lanes": worker} | worker_data,
    }
    try:
        warnings = load_from_dicts(merged(hosts)).warnings
    except ConfigError as error:
        return error.problems, ()
    return [], tuple(warning for warning in warnings if "memory fractions" in warning)


# The cluster lane BIG: Qwen/Qwen3-235B-A22B-GPTQ-Int4 (catalog: 115.28 GiB of weights, 94
# layers, 4 KV heads of 128) at tensor parallel 2, fp8 cache (1 byte), 40960 tokens, 0.8 of
# each box. One rank: 115.28 / 2 = 57.64 GiB of weights (seed 004's per node); KV heads
# max(1, 4 // 2) = 2: 2 x 94 x 2 x 128 x 1 bytes = 48128 a token, x 40960 = 1.8359375 GiB;
# + 4 overhead = 63.4759375 GiB in 0.8 x 121.69 = 97.352: it fits each box. It leaves
# 121.69 x (1 - 0.8) = 24.338 GiB free on a box with nothing else.
CASES = {
    "worker with the rank alone, default floor 8.5 < 24.3": ([BIG], [], {}, {}, [], ()),
    # 0.07 + 0.8 = 0.87: at the safe total, not above it; 121.69 x 0.13 = 15.82 GiB free
    "worker lane and rank at 0.87, floor 8.5 < 15.8": ([BIG], [SMALL], {}, {}, [], ()),
    # 0.08 + 0.8 = 0.88 > 0.87: a warning for the worker only (the head holds 0.8)
    "worker lane and rank at 0.88 warned": (
        [BIG],
        [SMALL | {"memory_fraction": 0.08}],
        {},
        {},
        [],
        (
            "spark-2: lanes: the memory fractions add up to 0.88 (small 0.08, the cluster lane"
            " big 0.8), above 0.87: a Spark has ~102 GiB free after boot, a later lane may not"
            " start; a total of 0.87 or less is safe",
        ),
    ),
    # The worker has no lane of its own: alone, nothing is taken and 30 < 121.69 passed; the
    # rank leaves 24.338 GiB, and a floor of 30 would stop it whenever it is loaded.
    "worker floor 30 leaves the rank no room": (
        [BIG],
        [],
        {},
        {GUARD: 30},
        [
            "spark-2: memory_guard_min_available_gib: 30 GiB is not below the 24.3 GiB the"
            " lanes leave free (of 121.69 GiB: the cluster lane big 0.8); the guard would stop a"
            f" lane whenever all are loaded{RANK_STOPS}{LOWER_IT}"
        ],
        (),
    ),
    # 121.69 x (1 - 0.07 - 0.8) = 15.82 GiB free: a floor of 16 is above it
    "worker floor 16 above what its lane and the rank leave": (
        [BIG],
        [SMALL],
        {},
        {GUARD: 16},
        [
            "spark-2: memory_guard_min_available_gib: 16 GiB is not below the 15.8 GiB the"
            " lanes leave free (of 121.69 GiB: small 0.07, the cluster lane big 0.8); the guard"
            f" would stop a lane whenever all are loaded{RANK_STOPS}{LOWER_IT}"
        ],
        (),
    ),
    # The head's floor against its own lanes, the cluster lane among them: 24.338 GiB free
    "head floor 30 above what the cluster lane leaves": (
        [BIG],
        [],
        {GUARD: 30},
        {},
        [
            "spark-1: memory_guard_min_available_gib: 30 GiB is not below the 24.3 GiB the"
            " lanes leave free (of 121.69 GiB: big 0.8); the guard would stop a lane whenever"
            f" all are loaded{LOWER_IT}"
        ],
        (),
    ),
    # A worker whose CUDA reports 70 GiB: the rank asks 0.8 x 70 = 56 GiB, less than its
    # 63.4759375; 63.4759375 / 70 = 0.907, above 0.90: no fraction does; no context either
    # (56 - 57.64 - 4 < 0). It leaves 70 x 0.2 = 14 GiB free: the floor of 8.5 passes.
    "worker of 70 GiB cannot hold the rank": (
        [BIG],
        [],
        {},
        {"unified_memory_gib": 70},
        [
            "spark-2: lanes: the cluster lane big: needs ~63.5 GiB (weights 57.64 + KV cache 1.8"
            " for 40960 tokens + 4 overhead) but memory_fraction 0.8 of 70 GiB gives 56.0; pick a"
            " smaller build: its share does not fit one box"
        ],
        (),
    ),
    # 0.1 + 0.8 = 0.9: at the limit, allowed and warned; 0.11 + 0.8 = 0.91 refused, and the
    # 121.69 x 0.09 = 10.95 GiB left is still above the floor of 8.5
    "worker total 0.91 refused": (
        [BIG],
        [SMALL | {"memory_fraction": 0.11}],
        {},
        {},
        [
            "spark-2: lanes: the memory fractions add up to 0.91 (small 0.11, the cluster lane"
            " big 0.8), above 0.9: the cluster lane takes its memory_fraction of every box;"
            " lower them to a total of 0.87 or less, or remove lanes"
        ],
        (),
    ),
}


@pytest.mark.parametrize(
    ("head", "worker", "head_data", "worker_data", "refusals", "warned"),
    CASES.values(),
    ids=CASES.keys(),
)
def test_each_box_is_checked_with_every_share_it_holds(
    head: list[dict],
    worker: list[dict],
    head_data: dict,
    worker_data: dict,
    refusals: list[str],
    warned: tuple[str, ...],
) -> None:
    assert checked(head, worker, head_data, **worker_data) == (refusals, warned)


def test_a_workers_shares_are_its_lanes_and_the_cluster_lanes_rank() -> None:
    small, big = Lane.model_validate(SMALL), Lane.model_validate(BIG)

    box = budget([small], SPARK_GIB, rank=big)

    assert [(share.label, share.rank) for share in box.shares] == [
        ("small", False),
        ("the cluster lane big", True),
    ]
    rank = box.shares[1].estimate
    assert rank.weights_gib == 115.28 / 2 == 57.64  # seed 004: per node at TP=2
    assert rank.kv_cache_gib == 2 * 94 * 2 * 128 * 1 * 40960 / GIB == 1.8359375
    assert rank.share_gib == pytest.approx(0.8 * 121.69)  # 97.352
    assert box.fraction == 0.87  # 0.07 + 0.8
    assert box.free_gib == pytest.approx(121.69 * 0.13)  # 15.8197
    # The head's cluster lane is one rank too: the same figures against its own box
    head = budget([big], SPARK_GIB)
    assert head.shares[0].estimate == rank and not head.shares[0].rank


@pytest.mark.parametrize(
    ("kv_heads", "ranks", "per_rank"),
    [
        (4, 1, 4),  # one box holds them all
        (4, 2, 2),  # Qwen3-235B at TP=2
        (2, 2, 1),  # Qwen3-Coder-Next, Qwen3.6 at TP=2
        (1, 2, 1),  # fewer heads than ranks: replicated, one each
        (2, 4, 1),
    ],
)
def test_kv_heads_per_rank_as_vllm_splits_them(kv_heads: int, ranks: int, per_rank: int) -> None:
    assert kv_heads_per_rank(kv_heads, ranks) == per_rank


# The fit advice: the longest context the rest of a share holds, in the lane's own terms.
#
# BIG in bf16 (2 bytes) at 0.53: one rank's token is 2 x 94 x 2 heads x 128 x 2 = 96256 bytes
# (3.671875 GiB for 40960 tokens): 57.64 + 3.671875 + 4 = 65.311875 GiB in 0.53 x 121.69 =
# 64.4957. The rest after weights and overhead, 64.4957 - 61.64 = 2.8557 GiB, holds
# 2.8557 x 2**30 / 96256 = 31855 tokens: 31744 in whole 1024s (counting all 4 heads, as if one
# box held them, gave 15360). 65.311875 / 121.69 = 0.5367: a fraction of 0.54 fits.
#
# Seed 002's GGUF (catalog: 46.2 GiB, 12 layers, 2 KV heads of 256) in llama.cpp's q8_0 at 0.43
# with 262144 tokens: 2 x 12 x 2 x 256 x 34/32 = 13056 bytes a token, 3.1875 GiB; 46.2 +
# 3.1875 + 4 = 53.3875 GiB in 0.43 x 121.69 = 52.3267. The rest, 52.3267 - 50.2 = 2.1267 GiB,
# holds 2.1267 x 2**30 / 13056 = 174904 tokens: 174080 in whole 1024s (in bf16's 2 bytes it
# would be 92160). 53.3875 / 121.69 = 0.4387: 0.44 fits.
BIG_BF16 = BIG | {"kv_cache_dtype": None, "memory_fraction": 0.53}
GGUF_043 = gguf(memory_fraction=0.43, max_model_len=262144)


def test_the_fit_advice_for_a_tensor_parallel_lane_is_per_rank() -> None:
    assert checked([BIG_BF16], []) == (
        [
            "spark-1: lanes: big: needs ~65.3 GiB (weights 57.64 + KV cache 3.7 for 40960 tokens"
            " + 4 overhead) but memory_fraction 0.53 of 121.69 GiB gives 64.5; lower"
            " max_model_len to 31744 or less, or raise memory_fraction to 0.54"
        ],
        (),
    )
    # 57.64 + 96256 x 31744 / 2**30 (2.8457) + 4 = 64.4857 <= 64.4957: the advice fits, and
    # the next 1024 (2.9375 GiB for 32768: 64.5775) does not
    assert checked([BIG_BF16 | {"max_model_len": 31744}], []) == ([], ())
    assert checked([BIG_BF16 | {"max_model_len": 32768}], [])[0]
    assert checked([BIG_BF16 | {"memory_fraction": 0.54}], []) == ([], ())


def test_the_fit_advice_for_a_llama_cpp_lane_counts_its_cache_type() -> None:
    assert problems(GGUF_043) == [
        "spark-1: lanes: gguf: needs ~53.4 GiB (weights 46.2 + KV cache 3.2 for 262144 tokens +"
        " 4 overhead) but memory_fraction 0.43 of 121.69 GiB gives 52.3; lower max_model_len to"
        " 174080 or less, or raise memory_fraction to 0.44"
    ]
    # 46.2 + 13056 x 174080 / 2**30 (2.1167) + 4 = 52.3167 <= 52.3267; 175104: 52.3292 > it
    assert accepted(GGUF_043 | {"max_model_len": 174080})
    assert problems(GGUF_043 | {"max_model_len": 175104})


# The guard's floor against the driver's own failures (spark/memory.py GUARD_FLOOR_GIB). From
# vllm#56824: the driver failed with 119.2 of 121.7 GiB in use (2.5 GiB free), after
# MemAvailable fell from 29 to 2.5 GiB in 9 s; the guard reads every second and a stopped
# lane's memory returns about a second later (templates/spark-memguard.py.j2, INTERVAL_S).
DRIVER_FAILS_AT = 121.7 - 119.2
FALL_PER_S = (29 - 2.5) / 9
DEFAULT_FREE = 121.69 * (1 - 0.45 - 0.35)  # group_data's two lanes leave 24.338 GiB


def test_the_default_floor_stops_a_lane_before_the_driver_fails() -> None:
    floor = group_defaults()[GUARD]
    assert floor >= DRIVER_FAILS_AT + 2 * FALL_PER_S  # 2.5 + 5.89 = 8.39
    assert floor == GUARD_FLOOR_GIB  # the figure the refusals name is group_data's default
    # ... and stays below what the default appliance leaves once every lane is loaded.
    assert budget(lanes_of(merged({"spark-1": {}})), 121.69).guard_problems(floor) == []


@pytest.mark.parametrize(
    ("floor", "refused"),
    [
        (24.33, False),  # just below the 24.338 GiB the two lanes leave: allowed
        (24.338, True),  # at it: the guard would stop a lane whenever both are loaded
        # What it would take to catch vllm#56824's failure while MemAvailable still showed
        # 22.5 GiB (page cache it counted): a second of the fall above it, ~25.4 GiB. Refused on
        # the default appliance: no floor catches that failure there.
        (22.5 + FALL_PER_S, True),
    ],
)
def test_the_floors_boundary_on_the_default_appliance(floor: float, refused: bool) -> None:
    box = budget(lanes_of(merged({"spark-1": {}})), 121.69)
    assert round(box.free_gib, 3) == round(DEFAULT_FREE, 3)
    assert bool(box.guard_problems(floor)) is refused


def test_the_fraction_limit_still_leaves_the_default_floor_room() -> None:
    # 0.90 leaves 121.69 x 0.1 = 12.169 GiB, above 8.5; two lanes at 0.9 + 0.04 (refused as a
    # total anyway) would leave 7.3, below it.
    assert budget([lane_with(0.9)], 121.69).guard_problems(GUARD_FLOOR_GIB) == []
    over = budget([lane_with(0.9), lane_with(0.04)], 121.69)
    assert over.guard_problems(GUARD_FLOOR_GIB) != []


def lanes_of(hosts: dict[str, dict[str, Any]]) -> list[Lane]:
    return list(load_from_dicts(hosts).host("spark-1").lanes)


def lane_with(fraction: float) -> Lane:
    """SMALL at another memory fraction (its 6.4 GiB fit any of these shares)."""
    return Lane.model_validate(SMALL | {"memory_fraction": fraction})

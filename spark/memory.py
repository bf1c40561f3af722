"""A box's unified memory and the lanes' shares of it.

What each lane needs (its weights, the KV cache of one max_model_len sequence, vLLM's overhead)
against the share its memory_fraction gives it; the shares on one box, its own lanes' and a
cluster lane's rank, from one function (budget), which every total, warning and refusal reads:
a total above the limit, a lane that does not fit its share (with the context or the fraction
that would), a memory guard floor at or above what the lanes leave free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from spark import llamacpp

if TYPE_CHECKING:
    from collections.abc import Iterable

    from spark.lane import Lane

# The sum of the lanes' fractions: never above 0.90, 0.85-0.87 safe (seed 001). vLLM checks at
# each start that fraction x total is free, and a Spark shows only ~102 of 121.69 GiB free
# after boot (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47): above 0.87 a later lane may not
# start, and an overcommitted box freezes whole (seed 003). The fraction is of each GPU, each
# rank of a cluster lane asking it of its own box ("a per-instance limit": vLLM's engine
# arguments, --gpu-memory-utilization; vllm/v1/worker/utils.py, request_memory).
# The driver's own failures do not move this headroom: vllm#56824 exhausted the box with one
# engine at 0.70 (a start's peak is not bounded by its fraction), so a lower limit would not
# have prevented it; 0.90 still leaves 12.2 GiB, above the guard's floor (GUARD_FLOOR_GIB).
FRACTION_LIMIT = 0.90
FRACTION_WARNING = 0.87
# The memory guard's floor (group_data memory_guard_min_available_gib), from the driver's own
# failures on GB10: NV_ERR_NO_MEMORY from _memdescAllocInternal, after which the whole host can
# wedge with no OOM kill and no panic (NVIDIA/open-gpu-kernel-modules#1358, on 6.17 and drivers
# 595.84 and 595.91.07). vllm#56824 (driver 580.173.02): the driver failed with 119.2 of
# 121.7 GiB in use, ~2.5 GiB truly free, and MemAvailable fell at ~2.9 GiB/s (29 to 2.5 GiB in
# 9 s, the fastest fall reported). Where MemAvailable is what is truly free (the page cache
# dropped before a lane loads), the guard, which reads it every second and whose stopped lane's
# memory comes back about a second later, needs two seconds at that pace (~5.9 GiB) above the
# ~2.5 GiB the driver fails at: 8.4 GiB.
# What no floor catches: the same report's driver failed while MemAvailable still showed
# 22.5 GiB, 19.8 GiB of it page cache (and on a 7.x kernel ~9.3 GiB of kexec handover's CMA
# blocks: spark/kernel.py) that the driver did not get in time. A floor above that, ~25 GiB,
# would stop a lane of the default appliance whenever all are loaded (its fractions leave
# 24.3 GiB, ~14 seen at rest: seed 003). There the defence is elsewhere: the page cache dropped
# before each lane loads, one lane loading at a time, kho=off.
DRIVER_FAILS_FREE_GIB = 2.5
FASTEST_FALL_GIB_PER_S = (29 - 2.5) / 9
GUARD_REACTION_S = 2
# In half GiB, up: 8.5 (group_data's default, which a unit test holds to this).
GUARD_FLOOR_GIB = (
    math.ceil((DRIVER_FAILS_FREE_GIB + FASTEST_FALL_GIB_PER_S * GUARD_REACTION_S) * 2) / 2
)
# What vLLM holds beside weights and KV cache: CUDA context and cuBLAS/Marlin workspaces, the
# CUDA graph pools, the activation peak of its profiling run. An estimate (no field figure
# splits it out), on the side of refusing a lane that might just have fitted.
OVERHEAD_GIB = 4.0


class MemoryEstimate(BaseModel):
    """What a lane (a cluster lane: one rank) needs against what its memory fraction gives it,
    in GiB."""

    model_config = ConfigDict(frozen=True)

    weights_gib: float
    kv_cache_gib: float  # one sequence of max_model_len: vLLM refuses to start without it
    overhead_gib: float
    share_gib: float

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_cache_gib + self.overhead_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.share_gib


def kv_heads_per_rank(kv_heads: int, ranks: int) -> int:
    """The KV heads one tensor-parallel rank holds: its part of them, at least one (vLLM
    replicates the heads where there are fewer than ranks: vllm/config/model.py,
    ModelConfig.get_num_kv_heads, max(1, total_num_kv_heads // tensor_parallel_size))."""
    return max(1, kv_heads // ranks)


def kv_gib_per_token(lane: Lane) -> float:
    """One token's keys and values on one rank of the lane, in GiB, in the lane's cache type:
    a llama.cpp lane that names none caches in llamacpp.DEFAULT_KV_CACHE (q8_0, its
    --cache-type-k and -v), a vLLM one in the model's own dtype."""
    spec = lane.spec
    assert spec is not None  # a validated lane has one
    default = llamacpp.DEFAULT_KV_CACHE if lane.engine == "llama.cpp" else None
    every_head = spec.kv_bytes_per_token(lane.kv_cache_dtype or default)
    heads = kv_heads_per_rank(spec.kv_heads, lane.tensor_parallel_size)
    return every_head * heads / spec.kv_heads / 2**30


def estimate(lane: Lane, unified_memory_gib: float) -> MemoryEstimate:
    """Weights, the KV cache of one max_model_len sequence and the overhead, against
    memory_fraction of the box's unified memory (the total CUDA reports). A cluster lane's
    figures are one rank's, on any of its boxes: 1/N of the weights (seed 004: 57.64 GiB per
    node at TP=2) and the KV cache of the heads that rank holds (kv_heads_per_rank)."""
    spec = lane.spec
    assert spec is not None  # a validated lane has one
    return MemoryEstimate(
        weights_gib=spec.weights_gib / lane.tensor_parallel_size,
        kv_cache_gib=kv_gib_per_token(lane) * lane.max_model_len,
        overhead_gib=OVERHEAD_GIB,
        share_gib=lane.memory_fraction * unified_memory_gib,
    )


@dataclass(frozen=True)
class Share:
    """A lane's part of a box: one of its own lanes, or the rank of a cluster lane served from
    another box (the head)."""

    lane: Lane
    estimate: MemoryEstimate
    rank: bool

    @property
    def label(self) -> str:
        return f"the cluster lane {self.lane.name}" if self.rank else self.lane.name


@dataclass(frozen=True)
class Budget:
    """A box's unified memory (GiB, as CUDA reports it) and every share of it."""

    unified_memory_gib: float
    shares: tuple[Share, ...]

    @property
    def fraction(self) -> float:
        """The shares' memory fractions added up."""
        return round(sum(share.lane.memory_fraction for share in self.shares), 6)

    @property
    def free_gib(self) -> float:
        """What the lanes leave of the box once every one is loaded."""
        return self.unified_memory_gib * (1 - self.fraction)

    @property
    def has_rank(self) -> bool:
        return any(share.rank for share in self.shares)

    def listing(self) -> str:
        return ", ".join(f"{share.label} {share.lane.memory_fraction:g}" for share in self.shares)

    def problems(self) -> list[str]:
        """What the box cannot hold: a total above FRACTION_LIMIT, a share its lane does not
        fit in."""
        problems = []
        if self.fraction > FRACTION_LIMIT:
            why, remedy = (
                ("the cluster lane takes its memory_fraction of every box", ", or remove lanes")
                if self.has_rank
                else ("an out-of-memory on unified memory freezes the whole box", "")
            )
            problems.append(
                f"the memory fractions add up to {self.fraction:g} ({self.listing()}), above"
                f" {FRACTION_LIMIT}: {why}; lower them to a total of {FRACTION_WARNING} or"
                f" less{remedy}"
            )
        fits = (_fit_problem(share, self.unified_memory_gib) for share in self.shares)
        return problems + [problem for problem in fits if problem]

    def warnings(self) -> list[str]:
        """What is allowed but risky: a total above the 0.85-0.87 the field runs safely."""
        if FRACTION_WARNING < self.fraction <= FRACTION_LIMIT:
            return [
                f"the memory fractions add up to {self.fraction:g} ({self.listing()}), above"
                f" {FRACTION_WARNING}: a Spark has ~102 GiB free after boot, a later lane may"
                f" not start; a total of {FRACTION_WARNING} or less is safe"
            ]
        return []

    def guard_problems(self, floor_gib: float) -> list[str]:
        """The memory guard's floor at or above what the lanes leave free once loaded: it would
        stop a lane each time all of them are up (the OS takes its part of the rest too)."""
        free = self.free_gib
        if floor_gib < free:
            return []
        # On executor mp the rank has a unit on the box, in the guard's list (SparkConfig.units).
        rank = (
            " (the cluster lane's rank counted: on executor mp the guard stops it, and the"
            " cluster lane with it)"
        )
        return [
            f"{floor_gib:g} GiB is not below the {free:.1f} GiB the lanes leave free (of"
            f" {self.unified_memory_gib:g} GiB: {self.listing()}); the guard would stop a lane"
            f" whenever all are loaded{rank if self.has_rank else ''}; lower the lanes'"
            f" memory_fraction, or the floor (not below {GUARD_FLOOR_GIB:g}: there the guard"
            " stops a lane only after the driver fails)"
        ]


def budget(lanes: Iterable[Lane], unified_memory_gib: float, rank: Lane | None = None) -> Budget:
    """The shares on a box of ``unified_memory_gib``: each of its own ``lanes`` and, on a box
    other than the head, the ``rank`` of the cluster lane served from there."""
    shares = [Share(lane, estimate(lane, unified_memory_gib), rank=False) for lane in lanes]
    if rank is not None:
        shares.append(Share(rank, estimate(rank, unified_memory_gib), rank=True))
    return Budget(unified_memory_gib, tuple(shares))


def _fit_problem(share: Share, unified_memory_gib: float) -> str:
    """A share its lane does not fit, with what would: the longest context the rest of the
    share holds (per rank, in the lane's cache type), a larger fraction, or a smaller build."""
    lane, need = share.lane, share.estimate
    if need.fits:
        return ""
    room = need.share_gib - need.weights_gib - need.overhead_gib
    longest = int(room / kv_gib_per_token(lane)) // 1024 * 1024 if room > 0 else 0
    needed = math.ceil(need.total_gib / unified_memory_gib * 100) / 100
    remedies = [f"lower max_model_len to {longest} or less"] if longest >= 1024 else []
    if needed <= FRACTION_LIMIT:
        remedies.append(f"raise memory_fraction to {needed:g}")
    else:
        remedies.append(
            "pick a smaller build, or spread it over the boxes of a cluster with"
            " tensor_parallel_size (a cluster lane)"
            if not lane.is_cluster
            else "pick a smaller build: its share does not fit one box"
        )
    return (
        f"{share.label}: needs ~{need.total_gib:.1f} GiB (weights {need.weights_gib:g}"
        f" + KV cache {need.kv_cache_gib:.1f} for {lane.max_model_len} tokens +"
        f" {need.overhead_gib:g} overhead) but memory_fraction {lane.memory_fraction:g} of"
        f" {unified_memory_gib:g} GiB gives {need.share_gib:.1f}; {', or '.join(remedies)}"
    )

"""A box's unified memory and the lanes' shares of it.

What each lane needs (its weights, the KV cache of one max_model_len sequence, vLLM's overhead)
against the share its memory_fraction gives it; the shares on one box, its own lanes' and a
cluster lane's rank, from one function (budget), which every total, warning and refusal reads:
a total above the limit, a lane that does not fit its share (with the context or the fraction
that would), a memory guard floor at or above what the lanes leave free.

A lane on demand (on_demand_idle_s) is not resident: the box holds its resident lanes, the
fleet's router where it runs (spark/fleet.py), and at most the largest set of on-demand lanes
that can be up at once: two that do not fit together beside the rest conflict (never up
together), and a set with no conflict in it must fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from spark.inventory import HostConfig
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
    one that names none in its engine's default (llama.cpp's q8_0, its --cache-type-k and -v),
    or the model's own dtype (vLLM's)."""
    spec = lane.spec
    assert spec is not None  # a validated lane has one
    cache = lane.kv_cache_dtype or lane.engine_record.default_kv_cache
    every_head = spec.kv_bytes_per_token(cache)
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

    @property
    def on_demand(self) -> bool:
        """Started by a request, stopped when idle (a cluster lane is never: spark/lane.py)."""
        return self.lane.on_demand_idle_s is not None and not self.rank


@dataclass(frozen=True)
class Budget:
    """A box's unified memory (GiB, as CUDA reports it), every share of it, and the fleet's
    router where it runs on the box."""

    unified_memory_gib: float
    shares: tuple[Share, ...]
    router_gib: float = 0.0
    # The figures below are read by every total and message: each is worked out once.

    @cached_property
    def resident(self) -> tuple[Share, ...]:
        return tuple(share for share in self.shares if not share.on_demand)

    @cached_property
    def on_demand(self) -> tuple[Share, ...]:
        return tuple(share for share in self.shares if share.on_demand)

    @cached_property
    def base_fraction(self) -> float:
        """What the box always holds: the resident shares' fractions and the router's GiB as a
        fraction of the box."""
        resident = sum(share.lane.memory_fraction for share in self.resident)
        return round(resident + self.router_gib / self.unified_memory_gib, 6)

    @cached_property
    def room(self) -> float:
        """The fraction left to on-demand lanes: FRACTION_LIMIT less what is always held."""
        return round(FRACTION_LIMIT - self.base_fraction, 6)

    @cached_property
    def startable(self) -> tuple[Share, ...]:
        """The on-demand lanes that fit beside what is always held (the others are refused)."""
        return tuple(share for share in self.on_demand if share.lane.memory_fraction <= self.room)

    @cached_property
    def conflicts(self) -> tuple[tuple[str, str], ...]:
        """The pairs of on-demand lanes whose fractions add up above the room: never up
        together (the other is stopped before one starts)."""
        lanes = self.startable
        return tuple(
            (first.lane.name, second.lane.name)
            for n, first in enumerate(lanes)
            for second in lanes[n + 1 :]
            if round(first.lane.memory_fraction + second.lane.memory_fraction, 6) > self.room
        )

    @cached_property
    def largest_set(self) -> tuple[Share, ...]:
        """The on-demand lanes that can be up at once (no two in conflict) holding the most
        memory; of equal ones the one with more lanes, then the one earlier in the list."""
        conflicts = {frozenset(pair) for pair in self.conflicts}
        return max(
            _co_resident(self.startable, conflicts),
            key=lambda lanes: (_fraction(lanes), len(lanes)),
        )

    @property
    def fraction(self) -> float:
        """The most the box holds at once: what is always held and the largest on-demand set."""
        return round(self.base_fraction + _fraction(self.largest_set), 6)

    @property
    def free_gib(self) -> float:
        """What the box leaves free with every resident lane and the largest on-demand set
        loaded."""
        return self.unified_memory_gib * (1 - self.fraction)

    @property
    def has_rank(self) -> bool:
        return any(share.rank for share in self.shares)

    def listing(self, on_demand: Iterable[Share] | None = None) -> str:
        """The shares that count: the resident ones, the router's, ``on_demand`` (None: the
        largest set)."""
        shown = [f"{share.label} {share.lane.memory_fraction:g}" for share in self.resident]
        if self.router_gib:
            shown.append(f"the router {self.router_gib:g} GiB")
        lanes = self.largest_set if on_demand is None else on_demand
        shown += [f"{share.label} {share.lane.memory_fraction:g} on demand" for share in lanes]
        return ", ".join(shown)

    def problems(self) -> list[str]:
        """What the box cannot hold: a total above FRACTION_LIMIT, a share its lane does not
        fit in."""
        problems = []
        if self.base_fraction > FRACTION_LIMIT:
            why, remedy = (
                ("the cluster lane takes its memory_fraction of every box", ", or remove lanes")
                if self.has_rank
                else ("an out-of-memory on unified memory freezes the whole box", "")
            )
            problems.append(
                f"the memory fractions add up to {self.base_fraction:g} ({self.listing(())}),"
                f" above {FRACTION_LIMIT}: {why}; lower them to a total of {FRACTION_WARNING} or"
                f" less{remedy}"
            )
        else:
            problems += self.on_demand_problems()
        fits = (_fit_problem(share, self.unified_memory_gib) for share in self.shares)
        return problems + [problem for problem in fits if problem]

    def on_demand_problems(self) -> list[str]:
        """An on-demand lane that can never be up beside what the box always holds, and a set
        of them with no conflict in it (all may be up at once) that does not fit."""
        if not self.on_demand:
            return []
        held = f"{self.base_fraction:g} ({self.listing(())})" if self.base_fraction else "nothing"
        problems = [
            f"{share.lane.name}: on demand at memory_fraction {share.lane.memory_fraction:g},"
            f" but the box always holds {held}: above {FRACTION_LIMIT} with it, it could never"
            f" start; lower its memory_fraction to {self.room:g} or less, or serve it from"
            " another box"
            for share in self.on_demand
            if share not in self.startable
        ]
        most = self.largest_set
        if _fraction(most) > self.room:
            names = " and ".join(share.lane.name for share in most)
            problems.append(
                f"{names}: on demand, no two in conflict, so all may be up at once:"
                f" {_fraction(most):g} beside the {held} always held is above {FRACTION_LIMIT};"
                f" lower their memory_fraction to a total of {self.room:g} or less, or serve one"
                " from another box"
            )
        return problems

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


def budget(
    lanes: Iterable[Lane],
    unified_memory_gib: float,
    rank: Lane | None = None,
    router_gib: float = 0.0,
) -> Budget:
    """The shares on a box of ``unified_memory_gib``: each of its own ``lanes`` and, on a box
    other than the head, the ``rank`` of the cluster lane served from there; ``router_gib`` where
    the fleet's router runs on the box."""
    shares = [Share(lane, estimate(lane, unified_memory_gib), rank=False) for lane in lanes]
    if rank is not None:
        shares.append(Share(rank, estimate(rank, unified_memory_gib), rank=True))
    return Budget(unified_memory_gib, tuple(shares), router_gib)


def box_budget(host: HostConfig, cluster: Lane | None, router_gib: float = 0.0) -> Budget:
    """A box's memory: its own lanes, on a worker the cluster lane's rank, and the router's
    share where it runs there."""
    rank = cluster if host.role != "head" else None
    return budget(host.lanes, host.unified_memory_gib, rank, router_gib)


def _fraction(shares: Iterable[Share]) -> float:
    return round(sum(share.lane.memory_fraction for share in shares), 6)


def _co_resident(
    shares: tuple[Share, ...], conflicts: set[frozenset[str]]
) -> Iterator[tuple[Share, ...]]:
    """Every set of ``shares`` with no two in conflict, those with the first lane first (a box
    has a few lanes: every set is looked at)."""
    if not shares:
        yield ()
        return
    first, rest = shares[0], shares[1:]
    beside = tuple(s for s in rest if frozenset((first.lane.name, s.lane.name)) not in conflicts)
    for others in _co_resident(beside, conflicts):
        yield (first, *others)
    yield from _co_resident(rest, conflicts)


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

"""The lanes' keys: the box's unified memory, its lanes and their memory guard, the weights
they serve; and the check across boxes of a cluster lane, which takes a share of every box."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, HttpUrl, field_validator

from spark import memory
from spark.inventory.hosts import names
from spark.lane import Lane, clash_problems
from spark.memory import box_budget
from spark.options import option

if TYPE_CHECKING:
    from spark.inventory.hosts import HostConfig

# A Spark has 128 GB of LPDDR5X in all, shared by CPU and GPU (seed 003); CUDA reports 121.69
# GiB of it. No value of unified_memory_gib or of the guard's floor can be above that.
SPARK_MEMORY_GIB = 128


class LaneKeys(BaseModel):
    """A box's keys for its lanes, their memory and their weights."""

    unified_memory_gib: float = option(
        f"the GiB CUDA reports as total memory (121.69 on a Spark), at most the"
        f" {SPARK_MEMORY_GIB} GB the box has",
        why="What vLLM's --gpu-memory-utilization is a fraction of: on a Spark's 128 GB LPDDR5X"
        " CUDA reports 121.69 GiB (vLLM asks 105.87 GiB at 0.87:"
        " MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47), /proc/meminfo's MemTotal byte for"
        " byte (130663006208: unslothai/unsloth PR 10486): no carve-out.",
        ge=1,
        le=SPARK_MEMORY_GIB,
    )
    lanes: list[Lane] = option(
        "a list of lanes, each a dict of name, image, model, served_name, port,"
        " memory_fraction, max_model_len and optional keys (docs/variables.md, A lane's keys)",
        why="The model servers of each box, started in this order, one after the other"
        " (simultaneous starts contend for memory: seed 003). The default is the field's"
        " two-lane appliance (seed 003); memory fractions add up to 0.80: at most 0.87 is safe,"
        " above 0.90 is refused (seed 001). A box's own data replaces the whole list.",
    )
    memory_guard_min_available_gib: float = option(
        "GiB of MemAvailable below which a lane is stopped, e.g. 8; below what the"
        " lanes leave free",
        why="On unified memory the box freezes (SSH too) before the OOM killer acts, and cgroup"
        " limits do not hold CUDA allocations. The driver fails its allocations with ~2.5 GiB"
        " still free, and the host can then wedge (open-gpu-kernel-modules#1358); MemAvailable"
        " has fallen ~2.9 GiB/s (vllm#56824): 8.5 stops a lane the two seconds before that which"
        " the guard needs (spark/memory.py GUARD_FLOOR_GIB). It stays clear of the default"
        " appliance at rest (about 14 GiB left, seed 003). No floor catches a failure while"
        " MemAvailable still counts page cache the driver does not get (22.5 GiB 'available' at"
        " one: vllm#56824); the lanes drop it before each load.",
        gt=0,
        le=SPARK_MEMORY_GIB,
    )
    lane_start_timeout_min: int = option(
        "minutes a lane may take to load until /health answers (20)",
        why="A 120B model loads in about 8 minutes, a 235B one over two boxes in about 15"
        " (seed 004).",
        ge=1,
        le=240,
    )
    hf_token_file: str | None = option(
        "None, or a file on this machine holding a Hugging Face token",
        why="Gated models need a token: the deploy copies it to /etc/spark/secrets/hf-token"
        " (root 0600) on each box, where the lanes and fetches read it, never from a command"
        " line or an environment.",
    )
    fetch_weights: bool = option(
        "True or False (fetch a lane's missing model in the background, the lane"
        " starting once it lands)",
        why="A lane itself never downloads (HF_HUB_OFFLINE=1); a ~120 GB model can take hours"
        " per box, not a wait to hide in a deploy. False stops the box with the `hf download`"
        " command to run; True starts a resumable, hash-checked fetch unit and goes on"
        " (docs/reference.md, The weights).",
    )
    hf_endpoint: HttpUrl = option(
        "the Hugging Face hub the boxes fetch from, e.g. https://huggingface.co",
        why="huggingface_hub's default endpoint (constants.py, _HF_DEFAULT_ENDPOINT; HF_ENDPOINT"
        " overrides it there), or a mirror of it.",
    )
    fleet_copy_weights: bool = option(
        "True or False (a model several boxes serve comes from the hub to one of"
        " them, the others copying it over the fabric)",
        why="From the internet once per fleet: the first box in the inventory fetches from the"
        " hub, the others copy from it over the fabric (a shape where one address reaches every"
        " box), every file checked against the hub's hash.",
    )
    prune_unused: bool = option(
        "True or False (remove the cached models and serving images no lane of the"
        " box uses any more, and the router's virtualenv where the box runs no router)",
        why="Never by default: a model is hours of download and an image may serve what the"
        " owner runs by hand (docker's `image prune -a` asks before it removes an image no"
        " container uses: docker's reference); off, a box without room names them instead.",
    )

    @field_validator("hf_token_file")
    @classmethod
    def _hf_token_file(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).expanduser().is_file():
            raise ValueError(
                "the value is no file on this machine (not shown: it may be a token pasted by"
                " mistake); put the Hugging Face token in a file and give its path, or set None"
            )
        return path

    def lane_problems(self, owners: list[tuple[int, int, str]]) -> dict[str, list[str]]:
        """The lanes against the ports the box's services hold (``owners``: spark/ports.py
        port_owners) and the box's memory, and the guard's floor against what they leave free;
        a worker's rank of a cluster lane is checked across the boxes (cluster_lane_problems)."""
        box = memory.budget(self.lanes, self.unified_memory_gib)
        return {
            "lanes": clash_problems(self.lanes, owners) + box.problems(),
            "memory_guard_min_available_gib": box.guard_problems(
                self.memory_guard_min_available_gib
            ),
        }


def cluster_lane_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """A cluster lane runs on the head and on every box: one of them, as wide as the cluster,
    and room for its share next to each worker's own lanes."""
    problems = []
    heads = [host for host in hosts if host.role == "head"]
    cluster_lanes = [(host, lane) for host in hosts for lane in host.lanes if lane.is_cluster]
    for host, lane in cluster_lanes:
        where = f"{host.name}: lanes: {lane.name}: tensor_parallel_size"
        size = lane.tensor_parallel_size
        if len(hosts) == 1:
            problems.append(
                f"{where}: {size} makes a cluster lane, but the inventory has one box; set 1,"
                " or add the other boxes (a head and its workers)"
            )
        elif host.role != "head" and not heads:
            continue  # the missing head's problem names this box (spark/inventory/cluster.py)
        elif host.role != "head":
            problems.append(
                f"{where}: {size} makes a cluster lane, which is served from the head; move the"
                f" lane to the head's lanes ({names(heads)}'s), or make this box the head"
            )
        elif lane.cluster_executor == "ray" and lane.image != host.ray.image:
            problems.append(
                f"{host.name}: lanes: {lane.name}: image: {lane.image}, but a cluster lane's"
                f" ranks run in Ray's containers ({host.ray.image}); set ray_image and the"
                " lane's image to the same image"
            )
        elif size != len(hosts):
            problems.append(
                f"{where}: {size}, but the cluster has {len(hosts)} boxes ({names(hosts)});"
                f" set {len(hosts)}: one rank on each box (each box has one GPU)"
            )
        elif host.shape.neighbours_only:
            problems.append(
                f"{where}: {size} makes a cluster lane, and this collection does not yet run"
                " one over a ring3 (each box's fabric addresses reach one neighbour each; Ray's"
                " head and vLLM's --master-addr need one address every box reaches); serve it"
                " from a pair or a switch, or set 1"
            )
    if len(cluster_lanes) > 1:
        problems.append(
            f"{names(host for host, _ in cluster_lanes)}: lanes:"
            f" {' and '.join(lane.name for _, lane in cluster_lanes)} are cluster lanes; keep"
            " one (each holds the one GPU of every box)"
        )
    if problems or not cluster_lanes or len(heads) != 1:
        return problems
    lane = cluster_lanes[0][1]
    for host in hosts:
        if host.role == "head":
            continue  # the head's lanes, the cluster lane among them, were checked together
        box = box_budget(host, lane)
        problems += [f"{host.name}: lanes: {problem}" for problem in box.problems()]
        problems += [
            f"{host.name}: memory_guard_min_available_gib: {problem}"
            for problem in box.guard_problems(host.memory_guard_min_available_gib)
        ]
    return problems

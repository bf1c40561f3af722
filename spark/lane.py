"""A lane: one model server on a box, its settings, and what it may run.

A lane is one model server in a container (`vllm serve`, or llama.cpp's `llama-server` for a
GGUF), on its own port, with its own share of the box's unified memory. Everything here is
checked before any host is contacted; what depends on the server is its engine's record
(spark/engines/: the options against the own option list of the release the lane's image
carries, the settings known to break the GB10, the command line); the model's figures come from
spark/catalog.py, and the memory each lane needs is spark/memory.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from spark import llamacpp
from spark.catalog import CATALOG, ModelSpec
from spark.checks import HF_ID, matching, refused
from spark.engines import DEFAULT, ENGINES, Engine
from spark.llamacpp_release import DEFAULT_COMMIT
from spark.memory import FRACTION_LIMIT
from spark.ports import MASTER_PORT, on_demand_server_port
from spark.vllm_release import Release, image_has_ray, image_release, without_ray

SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
# registry/repository:tag (a digest may follow the tag); the registry may carry a port.
IMAGE = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::\d+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+"
    r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})(?:@sha256:[0-9a-f]{64})?"
)
MODEL_PATH = re.compile(r"(/[A-Za-z0-9_.-]+)+")
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
IMAGE_PROBLEM = "{!r} is not registry/repository:tag; pin a tag, e.g. nvcr.io/nvidia/vllm:26.04-py3"

# Agent clients refuse a shorter context: Hermes Agent says "below the minimum 64,000 required"
# (seed 003); 65536 is the 64K the field gives its lanes (seed 003's lane B).
AGENT_CONTEXT = 65536


def pinned_image(image: str) -> str:
    """``image`` if it is registry/repository:tag with a tag that stays put, else ValueError
    (a lane's image and Ray's alike)."""
    match = IMAGE.fullmatch(image)
    if not match:
        raise ValueError(IMAGE_PROBLEM.format(image))
    if match["tag"] == "latest":
        raise ValueError(
            f"{image!r} moves with every release; pin a tag, e.g. nvcr.io/nvidia/vllm:26.04-py3"
        )
    return image


def image_with_ray(image: str) -> str:
    """``image`` pinned and not one the image table knows to lack Ray, else ValueError."""
    return refused(pinned_image(image), without_ray(image))


# vLLM's own (Ray-free) multi-node mode: the head, node rank 0, serves; every other box runs a
# headless rank joining the head's torch.distributed group at --master-addr:--master-port
# (vLLM docs, serving/parallelism_scaling.md, "Running vLLM with MultiProcessing"; vllm PR
# #23691).
@dataclass(frozen=True)
class MpRank:
    """A box's place in a cluster lane run by vLLM's own multi-node mode (executor mp)."""

    node_rank: int  # 0: the head, which serves; above 0: a headless rank
    master_addr: str  # the head's first fabric twin
    master_port: int = MASTER_PORT

    @property
    def headless(self) -> bool:
        return self.node_rank > 0


class Lane(BaseModel):
    """One model server: a container of `image` serving `model` on `port`, with vLLM or, for a
    GGUF file, llama.cpp."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # The registry's names (spark/engines/__init__.py), whatever engines it holds.
    engine: Literal[tuple(ENGINES)] = Field(  # type: ignore[valid-type]
        DEFAULT,
        description="vllm (the default) or llama.cpp (a GGUF file: gguf_file; seed 002)",
    )

    name: Annotated[
        str, matching(SLUG, "{!r} is not a slug; use 1..32 of a-z 0-9 - (e.g. coder)")
    ] = Field(description="a slug of a-z 0-9 -, at most 32, unique on the host")
    image: str = Field(
        description="registry/repository:tag with a pinned tag, e.g. nvcr.io/nvidia/vllm:26.04-py3"
    )
    vllm_version: str | None = Field(
        None,
        description="the vLLM release the image carries, for an image the table of"
        " spark/vllm_release.py does not list (e.g. 0.20.1); None: the table's",
    )
    model: str = Field(
        description='a Hugging Face id "org/name" or an absolute path (llama.cpp: the GGUF'
        " file's Hugging Face repository)"
    )
    gguf_file: str | None = Field(
        None,
        description="llama.cpp: the GGUF file's path in the repository, e.g."
        " Qwen3-Coder-Next-UD-Q4_K_XL.gguf (a split one's first part, NAME-00001-of-0000N.gguf)",
    )
    llama_cpp_commit: str | None = Field(
        None,
        description="llama.cpp: the commit the image was built from, whose option list is"
        f" checked (None: {DEFAULT_COMMIT}, the list the deploy holds)",
    )
    slots: int | None = Field(
        None,
        ge=1,
        le=64,
        description="llama.cpp: server slots, each with max_model_len / slots of context"
        f" (None: {llamacpp.DEFAULT_SLOTS}: agent prompts pass 32K, seed 002)",
    )
    served_name: Annotated[
        str,
        matching(
            SERVED_NAME,
            "{!r} is not a model name clients can send; use 1..128 of A-Z a-z 0-9 . _ : / -",
        ),
    ] = Field(description="the model name clients ask for, e.g. coder")
    port: int = Field(
        ge=1024,
        le=65535,
        description="an integer 1024..65535, unique on the host: clients reach the lane there,"
        " through the box's authenticating front",
    )
    loopback_port: int | None = Field(
        None,
        ge=1024,
        le=65535,
        description="the port vLLM itself listens on at 127.0.0.1, behind the front (an"
        " integer 1024..65535; None: port + 1000)",
    )
    memory_fraction: float = Field(
        gt=0, le=FRACTION_LIMIT, description="the lane's share of unified memory, 0 < f <= 0.90"
    )
    max_model_len: int = Field(
        ge=1024,
        le=10 * 2**20,
        description="the longest request in tokens (1024..10M); clients need >= 65536",
    )
    kv_cache_dtype: str | None = Field(
        None,
        description="one of vLLM's --kv-cache-dtype choices, or None for the model's; on"
        f" llama.cpp one of its cache types (None: {llamacpp.DEFAULT_KV_CACHE}, seed 003)",
    )
    tool_call_parser: str | None = Field(
        None, description="one of vLLM's --tool-call-parser choices, or None: no tool calls"
    )
    extra_args: tuple[str, ...] = Field(
        (), description='further `vllm serve` long options, e.g. ["--max-num-seqs", "8"]'
    )
    environment: dict[str, str] = Field(
        default_factory=dict, description="variables for vLLM (names its release reads)"
    )
    model_spec: ModelSpec | None = Field(
        None,
        description="for a model not in the catalog: {weights_gib, attention_layers, kv_heads,"
        " head_dim, quantization}",
    )
    priority: int | None = Field(
        None,
        ge=0,
        le=1000,
        description="the memory guard stops the lowest first; None: by order, later lanes lower",
    )
    api_key: bool = Field(
        True, description="True: clients need the lane's key, generated and kept on the box"
    )
    canary: bool = Field(
        True,
        description="True: the lane's start asks a fixed sum and checks the answer (issue 16);"
        " False for a model that cannot answer one (a base or embedding model): its start ends"
        " at /health and compliance reports its canary off",
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="1: the lane runs on its box; N > 1: a cluster lane, on the head, spread"
        " over all N boxes of the cluster by tensor parallelism (see executor)",
    )
    executor: Literal["ray", "mp"] | None = Field(
        None,
        description="how a cluster lane reaches the other boxes: ray (Ray's cluster, an image"
        " with Ray) or mp (vLLM's own multi-node mode, one unit per box, no Ray); None: ray on"
        " an image with Ray, mp on one without (NGC's from 26.05)",
    )
    on_demand_idle_s: int | None = Field(
        None,
        gt=0,
        description="None: resident (started by the deploy, always up); seconds above 0: on"
        " demand, started by the first request for its served_name and stopped after this many"
        " seconds without one, e.g. 900 (spark/fleet.py)",
    )

    @field_validator("extra_args", mode="before")
    @classmethod
    def _list_is_fine(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @field_validator("image")
    @classmethod
    def _image(cls, image: str) -> str:
        return pinned_image(image)

    @field_validator("model")
    @classmethod
    def _model(cls, model: str) -> str:
        parts = model.split("/")
        is_path = MODEL_PATH.fullmatch(model) and not {".", ".."} & set(parts)
        if not (HF_ID.fullmatch(model) or is_path):
            raise ValueError(
                f"{model!r} is neither a Hugging Face id nor an absolute path; write org/name"
                " (e.g. openai/gpt-oss-120b) or /a/path"
            )
        return model

    @model_validator(mode="after")
    def _release_rules_and_model(self) -> Lane:
        problems = self.engine_record.problems(self)
        spec = self.spec
        if spec is None:
            problems.append(
                f"{self.catalog_key} is not in the model catalog; give its model_spec ="
                " {weights_gib, attention_layers, kv_heads, head_dim, quantization}"
                " from its config.json and the size of its weights"
            )
        elif (
            spec.max_context
            and self.max_model_len > spec.max_context
            and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in self.environment
        ):
            problems.append(
                f"max_model_len {self.max_model_len} is beyond the model's {spec.max_context};"
                f" lower it to {spec.max_context} or less (vLLM refuses to start)"
            )
        return refused(self, problems)

    @property
    def engine_record(self) -> Engine:
        """What serves the lane: its checks, command line, paths and memory model."""
        return ENGINES[self.engine]

    @property
    def catalog_key(self) -> str:
        """The model's name in the catalog (a GGUF file's: its repository and path)."""
        return self.engine_record.catalog_key(self)

    @property
    def weight_files(self) -> tuple[str, ...]:
        """The files of its repository the lane loads, when not all of them: a GGUF's parts."""
        return tuple(llamacpp.split_parts(self.gguf_file)) if self.gguf_file else ()

    @property
    def release(self) -> Release:
        """The vLLM release of the lane's image (ValueError naming what to set if unknown)."""
        return image_release(self.image, self.vllm_version)

    @property
    def spec(self) -> ModelSpec | None:
        """The lane's model_spec, else the catalog's entry for its model."""
        return self.model_spec or CATALOG.get(self.catalog_key)

    def option(self, name: str) -> str | bool | None:
        """The value extra_args give an option (True for a flag), the last one winning."""
        return self.engine_record.option(self, name)

    @property
    def cluster_executor(self) -> Literal["ray", "mp"] | None:
        """How a cluster lane's ranks meet: executor, else ray where the image has Ray and mp
        where it has none or the table does not know it; None for a lane of one box."""
        if not self.is_cluster:
            return None
        return self.executor or ("ray" if image_has_ray(self.image) else "mp")

    @property
    def backend_port(self) -> int:
        """Where the server listens, on 127.0.0.1; the front forwards `port` there."""
        return self.loopback_port or self.port + 1000

    @property
    def server_port(self) -> int:
        """Where the server itself listens, on 127.0.0.1: backend_port, or for a lane on demand,
        whose backend_port systemd's socket holds, the port spark/ports.py gives it."""
        if self.on_demand_idle_s is None:
            return self.backend_port
        return on_demand_server_port(self.backend_port)

    @property
    def is_cluster(self) -> bool:
        """A cluster lane: served from the head, one tensor-parallel rank on every box."""
        return self.tensor_parallel_size > 1

    def argv(self, rank: MpRank | None = None) -> list[str]:
        """The server's command line (this box's ``rank`` of a cluster lane on executor mp)."""
        return self.engine_record.argv(self, rank)

    def container_env(self) -> dict[str, str]:
        """The lane's environment plus what its engine needs on the GB10."""
        return self.engine_record.container_env(self)


# How a clash names an on-demand lane's server port (spark/ports.py on_demand_server_port).
ON_DEMAND_SERVER = "server port on demand (loopback_port + 1000)"


def listeners(lane: Lane) -> list[tuple[str, int]]:
    """The lane's ports on its box, each named as a clash names it: the front's, the loopback
    port it forwards to, and an on-demand lane's server port behind its socket."""
    ports = [("port", lane.port), ("loopback_port", lane.backend_port)]
    if lane.server_port != lane.backend_port:
        ports.append((ON_DEMAND_SERVER, lane.server_port))
    return ports


def _same_port(lanes: list[Lane], users: list[tuple[str, str]]) -> bool:
    names = {name for name, _ in users}
    return len({lane.port for lane in lanes if lane.name in names}) == 1


def clash_problems(lanes: Iterable[Lane], owners: list[tuple[int, int, str]]) -> list[str]:
    """What one host's lanes clash in: names, ports, and ports of others (``owners``: ranges no
    lane may take, as spark.ports.port_owners gives them). Their memory is spark.memory's."""
    lanes = list(lanes)
    problems = []
    names: dict[str, list[str]] = {}
    for lane in lanes:
        names.setdefault(lane.name, []).append(lane.name)
    problems += [
        f"{' and '.join(same)} share the name {name}; give each lane its own"
        for name, same in names.items()
        if len(same) > 1
    ]
    # Clients' ports (the front's) and vLLM's own on loopback: one listener each on the box.
    ports: dict[int, list[tuple[str, str]]] = {}
    for lane in lanes:
        for key, port in listeners(lane):
            ports.setdefault(port, []).append((lane.name, key))
    for port, users in ports.items():
        keys = {key for _, key in users}
        if len(users) < 2 or (keys == {"loopback_port"} and _same_port(lanes, users)):
            continue  # the second: lanes that share their port, said once already
        if keys == {"port"}:
            problems.append(
                f"{' and '.join(name for name, _ in users)} share the port {port};"
                " give each lane its own"
            )
        else:
            problems.append(
                " and ".join(f"{name}'s {key}" for name, key in users)
                + f" are all {port}; give each its own (loopback_port defaults to port + 1000)"
            )
    for lane in lanes:
        for key, port in listeners(lane):
            owner = next((o for low, high, o in owners if low <= port <= high), None)
            if owner:
                problems.append(f"{lane.name}: {key} {port} is {owner}; pick another port")
    return problems


def context_warnings(lanes: Iterable[Lane]) -> list[str]:
    """Lanes whose context is too short for agent clients (AGENT_CONTEXT): allowed, since
    other clients do with less, but said before the deploy and in the client configuration."""
    return [
        f"{lane.name}: max_model_len {lane.max_model_len} is below {AGENT_CONTEXT}: agent"
        " clients refuse it (Hermes Agent needs 64K, seed 003); raise it to serve them"
        for lane in lanes
        if lane.max_model_len < AGENT_CONTEXT
    ]

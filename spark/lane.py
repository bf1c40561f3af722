"""A lane: one model server on a box, its settings, and what it may run.

A lane is one model server in a container (`vllm serve`, or llama.cpp's `llama-server` for a
GGUF: spark/llamacpp.py), on its own port, with its own share of the box's unified memory.
Everything here is checked before any host is contacted: the options against the own option list
of the release the lane's image carries (vLLM's: spark/vllm_release.py; llama.cpp's:
spark/llamacpp_release.py), the settings known to break the GB10 (SM121) against the rules of
spark/sm121.py, each in that release's terms; the model's figures come from spark/catalog.py,
and the memory each lane needs is spark/memory.py's.
"""

from __future__ import annotations

import difflib
import json
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
from spark.llamacpp_release import DEFAULT_COMMIT
from spark.memory import FRACTION_LIMIT
from spark.ports import MASTER_PORT, on_demand_server_port
from spark.sm121 import SM121_ADDITIONS, SM121_RULES
from spark.vllm_release import (
    DEFAULT_IMAGE,
    Release,
    image_has_ray,
    image_release,
    images_with_ray,
    known_versions,
    newer,
    release,
)

SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a shell's and systemd's variable name
# registry/repository:tag (a digest may follow the tag); the registry may carry a port.
IMAGE = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::\d+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+"
    r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})(?:@sha256:[0-9a-f]{64})?"
)
MODEL_PATH = re.compile(r"(/[A-Za-z0-9_.-]+)+")
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
LINE_BREAK = re.compile(r"[\n\r\0]")  # would split the unit or env file that carries it
NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?|-\.\d+")  # a value, not an option, to argparse
IMAGE_PROBLEM = "{!r} is not registry/repository:tag; pin a tag, e.g. nvcr.io/nvidia/vllm:26.04-py3"
# The values argparse's int and float (and vLLM's human_readable_int) turn into numbers, less
# the oddities they also take (spaces, "1_000", "nan", "inf").
INTEGER = re.compile(r"[+-]?\d+")
FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
HUMAN_INTEGER = re.compile(r"\d+|\d+(\.\d+)?[kmgt]|\d+[KMGT]")

# Agent clients refuse a shorter context: Hermes Agent says "below the minimum 64,000 required"
# (seed 003); 65536 is the 64K the field gives its lanes (seed 003's lane B).
AGENT_CONTEXT = 65536
# Variables beside vLLM's own that a lane may set: libraries vLLM runs on.
ENV_PREFIXES = ("CUDA_", "NCCL_", "HF_", "TORCH_", "PYTORCH_", "TRITON_", "TRANSFORMERS_", "OMP_")
# Kernel variables vLLM 0.31.0 dropped for options (vllm-option-changes.md, its watch list).
REPLACED_BY = {
    "VLLM_NVFP4_GEMM_BACKEND": "--linear-backend",
    "VLLM_TEST_FORCE_FP8_MARLIN": "--linear-backend",
    "VLLM_USE_NVFP4_CT_EMULATIONS": "--linear-backend",
    "VLLM_FLASHINFER_MOE_BACKEND": "--moe-backend",
    "VLLM_USE_FLASHINFER_MOE_FP4": "--moe-backend",
    "VLLM_USE_FLASHINFER_MOE_FP8": "--moe-backend",
    "VLLM_USE_FLASHINFER_MOE_FP16": "--moe-backend",
    "VLLM_MXFP4_USE_MARLIN": "--moe-backend",
}
SECRET_ENV = frozenset(
    {"VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "S3_SECRET_ACCESS_KEY"}
)


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
    return refused(pinned_image(image), _without_ray(image))


def _without_ray(image: str) -> list[str]:
    if image_has_ray(image) is not False:
        return []
    return [
        f"{image} carries no Ray (NVIDIA/dgx-spark-playbooks#109); a cluster on Ray needs"
        f" {' or '.join(images_with_ray())}, or a cluster lane with executor mp"
    ]


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

    engine: Literal["vllm", "llama.cpp"] = Field(
        "vllm",
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
        llama_cpp = self.engine == "llama.cpp"
        problems = _llama_cpp_problems(self) if llama_cpp else _vllm_problems(self)
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
    def catalog_key(self) -> str:
        """The model's name in the catalog: a GGUF file's repository and path."""
        gguf = self.engine == "llama.cpp" and self.gguf_file
        return f"{self.model}/{self.gguf_file}" if gguf else self.model

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
        options = parse_options(self.extra_args, self.release)[0]
        found = [value for option, value in options if option == name]
        return found[-1] if found else None

    @property
    def cluster_executor(self) -> Literal["ray", "mp"] | None:
        """How a cluster lane's ranks meet: executor, else ray where the image has Ray and mp
        where it has none or the table does not know it; None for a lane of one box."""
        if not self.is_cluster:
            return None
        return self.executor or ("ray" if image_has_ray(self.image) else "mp")

    def vllm_args(self, rank: MpRank | None = None) -> list[str]:
        """Everything after `vllm serve`: the model, the lane's settings, the additions SM121
        needs, then extra_args; for a cluster lane on executor mp, this box's `rank`. Never a
        key: the API key reaches vLLM as VLLM_API_KEY from a root-only file on the box. vLLM
        listens on loopback only: its --api-key guards /v1 and leaves /invocations, /tokenize,
        /metrics and more open to anyone (vLLM's security guide; vllm-project/vllm#18892), so
        the box's front (operations/front.py) owns `port` and asks the key on every path."""
        args = [
            self.model,
            "--served-model-name", self.served_name,
            "--host", "127.0.0.1",
            "--port", str(self.server_port),
            "--gpu-memory-utilization", f"{self.memory_fraction:g}",
            "--max-model-len", str(self.max_model_len),
        ]  # fmt: skip
        if self.kv_cache_dtype:
            args += ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.tool_call_parser:
            args += ["--tool-call-parser", self.tool_call_parser, "--enable-auto-tool-choice"]
        if self.is_cluster:  # one rank per box
            args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
            args += ["--distributed-executor-backend", self.cluster_executor or "ray"]
        if self.cluster_executor == "mp":
            if rank is None:
                raise ValueError(f"lane {self.name}: a cluster lane on executor mp needs its rank")
            args += ["--nnodes", str(self.tensor_parallel_size), "--node-rank", str(rank.node_rank)]
            args += ["--master-addr", rank.master_addr, "--master-port", str(rank.master_port)]
            if rank.headless:  # no API server on this box: the head serves
                args.append("--headless")
        for addition in SM121_ADDITIONS:
            args += addition.args(self)
        return [*args, *self.extra_args]

    def llama_args(self) -> list[str]:
        """Everything after llama-server (spark/llamacpp.py), on 127.0.0.1 behind the
        box's front as a vLLM lane."""
        return llamacpp.server_args(
            served_name=self.served_name,
            port=self.server_port,
            context=self.max_model_len,
            slots=self.slots or llamacpp.DEFAULT_SLOTS,
            kv_cache=self.kv_cache_dtype,
            extra_args=self.extra_args,
            commit=self.llama_cpp_commit or DEFAULT_COMMIT,
        )

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

    def container_env(self) -> dict[str, str]:
        """The lane's environment plus what SM121 needs of vLLM."""
        environment = dict(self.environment)
        if self.engine == "llama.cpp":
            return environment
        for addition in SM121_ADDITIONS:
            environment |= addition.env(self)
        return environment


def _vllm_problems(lane: Lane) -> list[str]:
    """A vLLM lane against its image's release, the SM121 rules and its executor."""
    try:
        vllm = lane.release
    except ValueError as error:
        return [str(error)]
    problems = _release_problems(lane, vllm)
    problems += [rule.problem(vllm) for rule in SM121_RULES if rule.breaks(lane)]
    if lane.gguf_file or lane.llama_cpp_commit or lane.slots:
        problems.append(
            "gguf_file, llama_cpp_commit and slots are for engine llama.cpp; leave them out"
            " or set engine: llama.cpp"
        )
    if lane.executor and not lane.is_cluster:
        problems.append(
            f"executor: {lane.executor} is for a cluster lane; set tensor_parallel_size to"
            " the number of boxes, or leave executor out"
        )
    elif lane.cluster_executor == "ray":
        problems += [f"executor: ray: {problem}" for problem in _without_ray(lane.image)]
    if lane.is_cluster and lane.on_demand_idle_s is not None:
        problems.append(
            "on_demand_idle_s: a cluster lane holds a rank on every box of the cluster, which"
            " start together; keep it resident (leave on_demand_idle_s out)"
        )
    return problems


def _llama_cpp_problems(lane: Lane) -> list[str]:
    """A llama.cpp lane: one GGUF of a Hugging Face repository on one box, its settings against
    the option list of the llama.cpp its image was built from."""
    problems = []
    if lane.gguf_file is None:
        problems.append(
            "gguf_file: a llama.cpp lane serves one GGUF file of its repository; name it"
            " (e.g. Qwen3-Coder-Next-UD-Q4_K_XL.gguf)"
        )
    elif not llamacpp.GGUF_FILE.fullmatch(lane.gguf_file) or ".." in lane.gguf_file.split("/"):
        problems.append(
            f"gguf_file: {lane.gguf_file!r} is no path of a .gguf file in the repository; use"
            " a-z A-Z 0-9 . _ - and /, ending in .gguf"
        )
    if not HF_ID.fullmatch(lane.model):
        problems.append(
            f"model: {lane.model!r} is no Hugging Face id; a llama.cpp lane's model is the"
            " repository holding gguf_file (org/name), fetched into the box's cache"
        )
    vllm_only = {
        "vllm_version": lane.vllm_version,
        "tool_call_parser": lane.tool_call_parser,
        "executor": lane.executor,
    }
    problems += [
        f"{key}: is vLLM's; a llama.cpp lane leaves it out"
        + (" (--jinja gives it tool calls)" if key == "tool_call_parser" else "")
        for key, value in vllm_only.items()
        if value is not None
    ]
    if lane.is_cluster:
        problems.append(
            "tensor_parallel_size: a llama.cpp lane runs on its own box; a lane over several"
            " boxes is a vLLM one"
        )
    commit = lane.llama_cpp_commit or DEFAULT_COMMIT
    layers = lane.spec.layers if lane.spec else None
    return problems + llamacpp.problems(
        lane.extra_args, lane.environment, lane.kv_cache_dtype, commit, layers
    )


def _guess(value: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(value, list(known), 1)
    return f" (did you mean {close[0]}?)" if close else ""


# Options a lane sets from its own keys: extra_args may not set them again.
LANE_KEYS = {
    "--model": "model",
    "--served-model-name": "served_name",
    "--port": "port (clients') and loopback_port (vLLM's own, behind the front)",
    "--gpu-memory-utilization": "memory_fraction",
    "--max-model-len": "max_model_len",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--tool-call-parser": "tool_call_parser",
    "--enable-auto-tool-choice": "tool_call_parser",
    "--no-enable-auto-tool-choice": "tool_call_parser",
    "--tensor-parallel-size": "tensor_parallel_size",
    "--distributed-executor-backend": "tensor_parallel_size and executor (a cluster lane)",
    **{
        option: "tensor_parallel_size and executor mp (the deploy gives each box its rank)"
        for option in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless")
    },
}
# Options extra_args may not carry at all, and why.
NOT_IN_EXTRA_ARGS = {
    "--api-key": "a secret in argv shows in `ps` and `docker inspect`; the key is generated"
    " on the box (api_key = True)",
    "--host": "vLLM listens on 127.0.0.1 behind the box's front, which asks the key on every"
    " path (vLLM's own key leaves /invocations, /tokenize and /metrics open); narrow the LAN"
    " side with front_allow_networks",
    "--uds": "vLLM listens on 127.0.0.1:loopback_port behind the box's front",
    "--config": "a config file would hide its options from these checks; list them here",
    "--kv-cache-memory-bytes": "it sizes the KV cache past memory_fraction; set"
    " memory_fraction and max_model_len",
    "--pipeline-parallel-size": "a lane spans boxes by tensor parallelism only; leave it out"
    " and set tensor_parallel_size (a cluster lane)",
    "--data-parallel-size": "a lane spans boxes by tensor parallelism only; leave it out"
    " and set tensor_parallel_size (a cluster lane)",
    "--hf-token": "a token in argv shows in `ps` and `docker inspect`; set hf_token_file (the"
    " token goes to a root-only file on the box)",
}


def parse_options(
    tokens: Iterable[str], vllm: Release | None = None
) -> tuple[list[tuple[str, str | bool]], list[str]]:
    """extra_args read as ``vllm``'s parser reads them (the default image's release if None):
    ([(--name, value or True)], problems).

    `--name value` and `--name=value`; an option of several values (nargs "+") takes every
    value up to the next option, given back joined by spaces; underscores count as dashes
    (vLLM's FlexibleArgumentParser). Each value is checked against the option's choices and
    type (the release's option values). Every problem names what to do instead.
    """
    vllm = vllm or image_release(DEFAULT_IMAGE, None)
    tokens = list(tokens)
    broken = [n for n, token in enumerate(tokens, 1) if LINE_BREAK.search(token)]
    if broken:
        return [], [f"item {n} has a line break or NUL; remove it" for n in broken]
    options: list[tuple[str, str | bool]] = []
    problems = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--"):
            problems.append(
                f"{token!r} is no long option; write --name value or --name=value"
                " (short options and a second model are not accepted)"
            )
            continue
        name, has_value, value = token.partition("=")
        name = name.replace("_", "-")
        spec = vllm.options.get(name)
        values = [value] if has_value else []
        # The value of an unknown option is taken too, so it is neither reported nor echoed.
        wants_value = spec is None or spec["takes_value"]
        several = vllm.values.get(name, {}).get("nargs") == "+"
        while wants_value and (several or not values) and not has_value:
            if i == len(tokens) or not _is_value(tokens[i]):
                break
            values.append(tokens[i])
            i += 1
        problem = _option_problem(vllm, name, bool(has_value), values)
        if problem:
            problems.append(problem)
        else:
            assert spec is not None  # an unknown option is a problem
            options.append((name, " ".join(values) if spec["takes_value"] else True))
    return options, problems


def _is_value(token: str) -> bool:
    return not token.startswith("-") or bool(NEGATIVE_NUMBER.fullmatch(token))


def _option_problem(vllm: Release, name: str, has_value: bool, values: list[str]) -> str:
    spec = vllm.options.get(name)
    if spec is None:
        return (
            f"{name} is no option of {vllm.label}'s `vllm serve`{_guess(name, vllm.options)};"
            " see `vllm serve --help`"
        )
    if name in LANE_KEYS:
        return f"{name} comes from the lane; set {LANE_KEYS[name]}"
    if name in NOT_IN_EXTRA_ARGS:
        return f"{name} is refused: {NOT_IN_EXTRA_ARGS[name]}"
    if not spec["takes_value"]:
        return f"{name} takes no value; drop ={values[0]}" if has_value else ""
    if not values:
        return f"{name} needs a value; put it after {name}"
    choices = spec.get("choices")
    if choices and values[0] not in choices:
        return (
            f"{name} {values[0]!r} is no choice of {vllm.label}{_guess(values[0], choices)};"
            f" one of: {', '.join(choices)}"
        )
    return "; ".join(_value_problems(vllm, name, values))


def _value_problems(vllm: Release, name: str, values: list[str]) -> list[str]:
    """What the release's parser would refuse in an option's values: caught here, the lane
    never crash-loops on it, and nothing of the value reaches the box."""
    kind = vllm.values.get(name, {"type": "str"})
    if kind.get("none") and values in (["None"], [""]):
        return []
    wanted, check = {
        "int": ("an integer", INTEGER.fullmatch),
        "float": ("a number", FLOAT.fullmatch),
        "human_int": (
            "an integer (or 8k, 2M: vLLM's human-readable form)",
            HUMAN_INTEGER.fullmatch,
        ),
        "human_int_or_auto": (
            "an integer (or 8k, 2M) or auto",
            lambda value: value == "auto" or HUMAN_INTEGER.fullmatch(value),
        ),
        "json": ("a JSON object, e.g. '{\"key\": 1}'", _is_json_object),
        "json_or_str": (
            "a JSON object where it starts with '{'",
            lambda value: not value.lstrip().startswith("{") or _is_json_object(value),
        ),
        "str": ("a string", lambda value: True),
    }[kind["type"]]
    return [f"{name} {value!r} is not {wanted}; give one" for value in values if not check(value)]


def _is_json_object(value: str) -> bool:
    try:
        return isinstance(json.loads(value), dict)
    except ValueError:
        return False


def _release_problems(lane: Lane, vllm: Release) -> list[str]:
    """The lane's choices, extra_args and environment against its image's release."""
    problems = []
    for key in ("kv_cache_dtype", "tool_call_parser"):
        value = getattr(lane, key)
        choices = vllm.options["--" + key.replace("_", "-")]["choices"]
        if value is not None and value not in choices:
            problems.append(
                f"{key}: {value!r} is not a {vllm.label} choice{_guess(value, choices)};"
                f" one of: {', '.join(choices)}"
            )
    problems += [f"extra_args: {problem}" for problem in parse_options(lane.extra_args, vllm)[1]]
    return problems + [
        f"environment: {problem}"
        for item in lane.environment.items()
        for problem in _env_problems(vllm, *item)
    ]


def _env_problems(vllm: Release, name: str, value: str) -> list[str]:
    if name in SECRET_ENV:
        return [
            f"{name} is a secret: here it would show in `docker inspect` and the"
            " unit; the API key is generated on the box (api_key = True), a token goes in a"
            " root-only file on the box"
        ]
    problems = []
    known = vllm.reads(name) or name.startswith(ENV_PREFIXES)
    if not ENV_NAME.fullmatch(name) or not known:
        problems.append(
            f"{name!r} is no variable {vllm.label} reads"
            f"{_retired(vllm, name) or _guess(name, vllm.env_vars)}; use one of vLLM's or a"
            f" {'/'.join(prefix + '*' for prefix in ENV_PREFIXES)} variable"
        )
    if LINE_BREAK.search(value):
        problems.append(f"{name}: its value has a line break or NUL; remove it")
    return problems


def _retired(vllm: Release, name: str) -> str:
    """Where an older release read the variable: the release now ignores it with a warning
    (vllm-option-changes.md), so a setting it carried would silently do nothing."""
    older = [
        version
        for version in known_versions()
        if newer(vllm.version, version) and release(version).reads(name)
    ]
    if not older:
        return ""
    option = REPLACED_BY.get(name)
    instead = f"; it chooses that with {option}" if option and vllm.has(option) else ""
    return f" (vLLM {older[-1]} did; {vllm.label} warns and ignores it{instead})"


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

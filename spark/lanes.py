"""What a lane may run on SM121: the lane model, the model catalog, the rules.

A lane is one model server in a container (`vllm serve`, or llama.cpp's `llama-server` for a
GGUF: operations/llamacpp.py), on its own port, with its own share of the box's unified memory.
Everything here is checked before any host is contacted: the options against the own option list
of the release the lane's image carries (vLLM's: operations/vllm_release.py; llama.cpp's:
operations/llamacpp_release.py), the settings known to break the GB10 (SM121) against the rules
table, each in that release's terms, and the memory each lane needs against its share.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from spark import llamacpp
from spark.llamacpp_release import DEFAULT_COMMIT
from spark.ports import MASTER_PORT, port_owners
from spark.vllm_release import (
    DATA,
    DEFAULT_IMAGE,
    Release,
    image_has_ray,
    image_release,
    images_with_ray,
    known_versions,
    newer,
    release,
)

T = TypeVar("T")


def refused(value: T, problems: list[str]) -> T:
    """``value``, unless there are ``problems``: pydantic reports them (one a line) under the
    field, or the model, that the validator checks."""
    if problems:
        raise ValueError("\n".join(problems))
    return value


def matching(pattern: re.Pattern[str], problem: str) -> AfterValidator:
    """A field's check that all of its value matches ``pattern``, else ``problem`` ("{!r}" is
    the value), which pydantic reports under the field."""

    def check(value: str) -> str:
        return refused(value, [] if pattern.fullmatch(value) else [problem.format(value)])

    return AfterValidator(check)


SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a shell's and systemd's variable name
# registry/repository:tag (a digest may follow the tag); the registry may carry a port.
IMAGE = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::\d+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+"
    r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})(?:@sha256:[0-9a-f]{64})?"
)
HF_ID = re.compile(r"(?P<org>[A-Za-z0-9][A-Za-z0-9._-]{0,95})/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
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

# The sum of the lanes' fractions: never above 0.90, 0.85-0.87 safe (seed 001). vLLM checks at
# each start that fraction x total is free, and a Spark shows only ~102 of 121.69 GiB free
# after boot (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47): above 0.87 a later lane may not
# start, and an overcommitted box freezes whole (seed 003).
FRACTION_LIMIT = 0.90
FRACTION_WARNING = 0.87
# What vLLM holds beside weights and KV cache: CUDA context and cuBLAS/Marlin workspaces, the
# CUDA graph pools, the activation peak of its profiling run. An estimate (no field figure
# splits it out), on the side of refusing a lane that might just have fitted.
OVERHEAD_GIB = 4.0
# NGC images whose vLLM fails to import fastsafetensors (field-facts, "vLLM on SM121").
IMAGES_WITHOUT_FASTSAFETENSORS = frozenset(
    {"nvcr.io/nvidia/vllm:26.03-py3", "nvcr.io/nvidia/vllm:26.04-py3"}
)
# Agent clients refuse a shorter context: Hermes Agent says "below the minimum 64,000 required"
# (seed 003); 65536 is the 64K the field gives its lanes (seed 003's lane B).
AGENT_CONTEXT = 65536
# Variables beside vLLM's own that a lane may set: libraries vLLM runs on.
ENV_PREFIXES = ("CUDA_", "NCCL_", "HF_", "TORCH_", "PYTORCH_", "TRITON_", "TRANSFORMERS_", "OMP_")
GEMM_VARIABLE = "VLLM_NVFP4_GEMM_BACKEND"  # NVFP4's GEMM kernel up to vLLM 0.20.1
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


# The concurrencies the throughput probe measures (templates/spark-lane-bench.j2), as seed 004
# reports its cluster: 1 (serial), 2 and 4 concurrent requests of 256 completion tokens.
CONCURRENCIES = (1, 2, 4)
# Where a figure comes from: a seed ("seed 004: ...") or a public address (https://..., or
# owner/repo#123).
FIGURE_SOURCE = re.compile(r"(?i).*(\bseed \d{3}\b|https?://\S+|\b[\w.-]+/[\w.-]+#\d+).*", re.S)


class Figure(BaseModel):
    """A decode rate the field gives for a model at one concurrency, and where it comes from."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    tok_s: float = Field(
        gt=0,
        le=5000,
        description="aggregate decode tokens per second of all the concurrent requests (0 < x"
        " <= 5000)",
    )
    kind: Literal["measured", "reported", "expected"] = Field(
        description="measured (a measurement whose source gives its setup), reported (a rate a"
        " source states from use, without its setup) or expected (a guide's expectation)"
    )
    source: Annotated[
        str,
        matching(
            FIGURE_SOURCE,
            "{!r} names no source; say where the figure comes from: a seed (seed 004: ...) or"
            " a public address (https://..., or owner/repo#123)",
        ),
    ] = Field(description="where the figure comes from, and its setup")


class Throughput(BaseModel):
    """The field's figures for a model, which the throughput probe compares a lane with."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    decode_tok_s: dict[int, Figure] = Field(
        min_length=1,
        description="by concurrency (1, 2 or 4 requests at once): {tok_s, kind, source}",
    )

    @field_validator("decode_tok_s", mode="before")
    @classmethod
    def _concurrencies(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # pydantic says what it wants
        figures, problems = {}, []
        for key, figure in value.items():
            concurrency = int(key) if isinstance(key, str) and key.isdigit() else key
            if concurrency not in CONCURRENCIES:
                problems.append(
                    f"concurrency {key!r}: the probe measures at"
                    f" {', '.join(map(str, CONCURRENCIES))} requests at once; give figures for"
                    " those only"
                )
            figures[concurrency] = figure
        return refused(figures, problems)

    def for_probe(self) -> str:
        """The figures as the probe's --figures takes them: JSON, by concurrency."""
        return json.dumps(
            {str(c): figure.model_dump() for c, figure in sorted(self.decode_tok_s.items())}
        )


class ModelSpec(BaseModel):
    """What the memory estimate and the rules need to know of a checkpoint (its config.json
    and the size of its weights), and the field's throughput figures for it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    weights_gib: float = Field(gt=0, le=1024, description="GiB the weights take once loaded")
    attention_layers: int = Field(
        ge=1,
        le=1024,
        description="layers whose KV cache grows with the context: every layer of a plain"
        " transformer, only the full-attention ones of a hybrid (Gated DeltaNet, sliding window)",
    )
    kv_heads: int = Field(ge=1, le=1024, description="num_key_value_heads of config.json")
    head_dim: int = Field(ge=1, le=4096, description="head_dim of config.json")
    quantization: Literal[
        "bf16", "fp8", "awq", "gptq", "mxfp4", "nvfp4", "nvfp4-modelopt", "gguf"
    ] = Field(
        description="the checkpoint's format: bf16, fp8, awq, gptq, mxfp4, nvfp4"
        " (compressed-tensors, from llm-compressor), nvfp4-modelopt (NVIDIA ModelOpt) or gguf"
        " (llama.cpp's file, any of its quantizations: weights_gib is the file's size)"
    )
    max_context: int | None = Field(
        None, ge=1, description="max_position_embeddings of config.json (None: not checked)"
    )
    throughput: Throughput | None = Field(
        None,
        description="the field's decode rates for the model, by concurrency, each with its kind"
        " and source: {decode_tok_s: {1: {tok_s, kind, source}, 2: ..., 4: ...}} (None: none"
        " known; the probe then only measures)",
    )

    def kv_bytes_per_token(self, kv_cache_dtype: str | None) -> float:
        """Keys and values of one token in every attention layer; "auto" keeps the model's
        bf16 activations (2 bytes), the fp8 kinds take 1, llama.cpp's cache types their own
        (llamacpp.KV_CACHE_BYTES: q8_0 34 bytes per 32 values)."""
        dtype = kv_cache_dtype or "auto"
        size = llamacpp.KV_CACHE_BYTES.get(dtype) or (1 if dtype.startswith("fp8") else 2)
        return 2 * self.attention_layers * self.kv_heads * self.head_dim * size


def catalog(models: dict[str, Any]) -> dict[str, ModelSpec]:
    """The catalog's entries validated, or ValueError naming each entry and field at fault."""
    specs, problems = {}, []
    for name, entry in models.items():
        try:
            specs[name] = ModelSpec.model_validate(
                {key: value for key, value in entry.items() if key != "source"}
            )
        except ValidationError as error:
            for item in error.errors():
                where = ".".join(str(part) for part in item["loc"])
                what = item["ctx"]["error"] if item["type"] == "value_error" else item["msg"]
                problems += [
                    f"model-catalog.json: {name}: {where}: {line}"
                    for line in str(what).splitlines()
                ]
    return refused(specs, problems)


# Known checkpoints: the field's figures and the models' config.json, each entry with its source.
CATALOG: dict[str, ModelSpec] = catalog(
    json.loads((DATA / "model-catalog.json").read_text())["models"]
)


class MemoryEstimate(BaseModel):
    """What a lane needs against what its memory fraction gives it, in GiB."""

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
        " operations/vllm_release.py does not list (e.g. 0.20.1); None: the table's",
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
            "--port", str(self.backend_port),
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
        """Everything after llama-server (operations/llamacpp.py), on 127.0.0.1 behind the
        box's front as a vLLM lane."""
        return llamacpp.server_args(
            served_name=self.served_name,
            port=self.backend_port,
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

    def estimate(self, unified_memory_gib: float) -> MemoryEstimate:
        """Weights, the KV cache of one max_model_len sequence and the overhead, against
        memory_fraction of the box's unified memory (the total CUDA reports). A cluster lane's
        figures are one box's: its share of the weights (seed 004: 57.64 GiB per node at TP=2)
        and of the KV heads (each rank holds its own heads, all of them where there are fewer
        heads than ranks)."""
        spec = self.spec
        assert spec is not None  # a validated lane has one
        default = llamacpp.DEFAULT_KV_CACHE if self.engine == "llama.cpp" else None
        per_token = spec.kv_bytes_per_token(self.kv_cache_dtype or default)
        ranks = self.tensor_parallel_size
        return MemoryEstimate(
            weights_gib=spec.weights_gib / ranks,
            kv_cache_gib=per_token * self.max_model_len / min(ranks, spec.kv_heads) / 2**30,
            overhead_gib=OVERHEAD_GIB,
            share_gib=self.memory_fraction * unified_memory_gib,
        )


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
    return problems + llamacpp.problems(
        lane.extra_args, lane.environment, lane.kv_cache_dtype, commit
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


def _is_gpt_oss(lane: Lane) -> bool:
    return "gpt-oss" in lane.model.lower()


def _is_qwen3(lane: Lane) -> bool:
    """Qwen3 and its successors (3.5, 3.6, Next, Coder-Next)."""
    return "qwen3" in lane.model.rsplit("/", 1)[-1].lower()


def _quantization(lane: Lane) -> str | None:
    spec = lane.spec
    return spec.quantization if spec else None


def _is_modelopt_nvfp4(lane: Lane) -> bool:
    """NVIDIA's own FP4 checkpoints are ModelOpt exports (nvidia/Llama-3.3-70B-Instruct-NVFP4,
    seed 003; nvidia/Qwen3.6-35B-A3B-NVFP4, its model card)."""
    match = HF_ID.fullmatch(lane.model)
    by_name = bool(match) and match["org"] == "nvidia" and "FP4" in lane.model.upper()
    return (
        by_name
        or _quantization(lane) == "nvfp4-modelopt"
        or lane.option("--quantization") == "modelopt_fp4"
    )


def _uses_cutlass_fp4(lane: Lane) -> bool:
    gemm = lane.environment.get("VLLM_NVFP4_GEMM_BACKEND")
    linear = lane.option("--linear-backend")
    moe = lane.option("--moe-backend")
    nvfp4 = _quantization(lane) in ("nvfp4", "nvfp4-modelopt")
    return (gemm is not None and gemm != "marlin") or (
        nvfp4 and (linear not in (None, "marlin") or moe in ("cutlass", "flashinfer_cutlass"))
    )


def _uses_flashinfer_moe(lane: Lane) -> bool:
    """VLLM_USE_FLASHINFER_MOE_FP4 has its own rule: there =0 breaks too (seed 003)."""
    switches = [
        value
        for name, value in lane.environment.items()
        if name.startswith("VLLM_USE_FLASHINFER_MOE_") and name != "VLLM_USE_FLASHINFER_MOE_FP4"
    ]
    moe_backend = str(lane.option("--moe-backend") or "")
    return moe_backend.startswith("flashinfer_") or any(value != "0" for value in switches)


def _offloads(lane: Lane) -> bool:
    return any(
        lane.option(name) is not None
        for name in ("--cpu-offload-gb", "--kv-offloading-size", "--enable-sleep-mode")
    )


def marlin_setting(vllm: Release) -> str:
    """How ``vllm`` is told to run NVFP4's GEMMs on Marlin: the variable up to 0.20.1, the
    option that replaced it in 0.31.0 (vllm-option-changes.md)."""
    return f"{GEMM_VARIABLE}=marlin" if vllm.reads(GEMM_VARIABLE) else "--linear-backend marlin"


def _marlin_args(lane: Lane) -> list[str]:
    wanted = _quantization(lane) == "nvfp4" and not lane.release.reads(GEMM_VARIABLE)
    return ["--linear-backend", "marlin"] if wanted and not lane.option("--linear-backend") else []


def _marlin_env(lane: Lane) -> dict[str, str]:
    wanted = _quantization(lane) == "nvfp4" and lane.release.reads(GEMM_VARIABLE)
    return {GEMM_VARIABLE: "marlin"} if wanted else {}


def _turns_cuda_graphs_off(lane: Lane) -> bool:
    """--enforce-eager, or what comes to the same: optimization level 0, a compilation config
    with cudagraph_mode NONE, no capture sizes, or a compilation mode other than VLLM_COMPILE
    (3) without full graphs, which vLLM overrides to no graphs (vLLM 0.19.0,
    vllm/config/vllm.py VllmConfig.__post_init__: "Overriding to NONE")."""
    if lane.option("--enforce-eager") is True or lane.option("--max-cudagraph-capture-size") == "0":
        return True
    if str(lane.option("--optimization-level") or "").upper() in ("0", "O0"):
        return True
    config = lane.option("--compilation-config")
    settings = json.loads(config) if isinstance(config, str) and config.strip() else {}
    graphs = str(settings.get("cudagraph_mode", "")).upper()
    mode = settings.get("mode", settings.get("level"))
    compiles = mode is None or str(mode).upper() in ("3", "VLLM_COMPILE")
    return (
        graphs in ("NONE", "0")
        or (not compiles and graphs not in ("FULL", "FULL_DECODE_ONLY", "2"))
        or settings.get("max_cudagraph_capture_size") == 0
        or settings.get("cudagraph_capture_sizes") == []
    )


@dataclass(frozen=True)
class Rule:
    """A setting refused on the GB10: what, what to do instead, where we know it from, and the
    vLLM release that source ran. ``refused`` and ``instead`` may name {marlin}: how the lane's
    release keeps NVFP4 on Marlin (marlin_setting)."""

    name: str
    refused: str
    instead: str
    source: str
    seen_on: str
    breaks: Callable[[Lane], bool]

    def problem(self, vllm: Release) -> str:
        """The refusal in ``vllm``'s terms; on a later release than its source saw, it says so
        (a rule holds until a source says the release fixed it)."""
        text = f"{self.refused}; {self.instead} ({self.source}".format(marlin=marlin_setting(vllm))
        if newer(vllm.version, self.seen_on):
            text += f", seen on vLLM {self.seen_on}; no source says {vllm.label} fixed it"
        return text + ")"


# Each rule's seen_on is the vLLM its source ran: seed 004 vLLM 0.19.0 (NGC 26.04-py3); seed 001
# NGC 26.03/26.04 (0.19.0 the later); seed 003 NGC 26.05.post1-py3, the 26.05 line (vLLM 0.20.1,
# NGC's release notes). Where two seeds saw it, the later release.
# Field rules weighed and not made rules here (each option exists in vLLM 0.19.0's list):
# - `--moe-backend marlin` "required for MoE models" (seed 001, a GPTQ-Int4 cluster): not added.
#   vLLM already runs these builds' experts on Marlin (gptq_marlin, awq_marlin, and NVFP4 with
#   VLLM_NVFP4_GEMM_BACKEND=marlin: seeds 003, 004), and seed 003 served both default lanes
#   without it; forcing it would also force it on builds Marlin has no MoE kernel for (bf16).
#   A lane may still set it; what is refused is the FlashInfer MoE backends (rule below).
# - `--max-cudagraph-capture-size 2048` "required for full throughput" (seed 001): not added.
#   vLLM 0.19.0 captures up to min(2 x max_num_seqs, 512) by default: "prevents capture of many
#   large graphs (>512) that would greatly increase startup time with limited performance
#   benefit" (CompilationConfig's own docstring). Seed 001's 2048 serves a batch of that size; a
#   lane serving a few agents (seed 003: 3 at once) batches far below 512, and every graph costs
#   memory in the lane's share and minutes at each start (~5 min capture on seed 001's cluster).
#   A lane wanting it sets it in extra_args (its value is checked as an integer).
# - FP8 KV cache: seeds 001, 002 and 004 call `--kv-cache-dtype fp8` safe and recommended; the
#   model card of ig1/Qwen3.5-35B-A3B-NVFP4 reports gibberish with FP8 KV on Qwen3.5's hybrid
#   attention, which the Qwen3.5/3.6/Next models of the default lanes share. The project
#   follows the model card: the default lanes keep the model's bf16 cache (group_data); fp8 stays
#   open to a lane that asks (seed 004's 235B cluster lane, a plain transformer, runs it).
SM121_RULES = (
    Rule(
        "flashinfer-attention",
        "--attention-backend FLASHINFER* is refused: FlashInfer has no sm_121 kernels",
        "leave --attention-backend out: the lane adds TRITON_ATTN",
        "seed 003; seed 004",
        "0.20.1",
        lambda lane: str(lane.option("--attention-backend") or "").startswith("FLASHINFER"),
    ),
    Rule(
        "cutlass-fp4",
        "CUTLASS FP4 (an NVFP4 GEMM backend other than {marlin}; --moe-backend cutlass or"
        " flashinfer_cutlass on an NVFP4 checkpoint) is refused: silent garbage on SM121, which"
        " lacks the TMEM it needs",
        "leave both out: the lane sets {marlin} for NVFP4",
        "seed 003; seed 004",
        "0.20.1",
        _uses_cutlass_fp4,
    ),
    Rule(
        "enforce-eager",
        "CUDA graphs off (--enforce-eager, --optimization-level 0, a --compilation-config with"
        " cudagraph_mode NONE, no capture sizes, or a mode other than 3) is refused: without"
        " CUDA graphs SM121 loses ~55% of its throughput",
        "leave them on; size them with --max-cudagraph-capture-size",
        "seed 001",
        "0.19.0",
        _turns_cuda_graphs_off,
    ),
    Rule(
        "fastsafetensors",
        "--load-format fastsafetensors is refused on NGC vLLM 26.03/26.04: ImportError",
        "leave --load-format out (safetensors), or use an image that ships fastsafetensors",
        "seed 004",
        "0.19.0",
        lambda lane: (
            lane.option("--load-format") == "fastsafetensors"
            and lane.image in IMAGES_WITHOUT_FASTSAFETENSORS
        ),
    ),
    Rule(
        "mxfp4-beyond-gpt-oss",
        "mxfp4 on a checkpoint other than gpt-oss is refused: it breaks on BF16 checkpoints",
        "keep mxfp4 for openai/gpt-oss-*; use an AWQ, GPTQ or compressed-tensors NVFP4 build",
        "seed 004",
        "0.19.0",
        lambda lane: (
            "mxfp4" in (lane.option("--quantization"), _quantization(lane))
            and not _is_gpt_oss(lane)
        ),
    ),
    Rule(
        "flashinfer-moe-fp4",
        "VLLM_USE_FLASHINFER_MOE_FP4 is refused: =0 raises a ValueError on Qwen models, =1 picks"
        " FlashInfer's CUTLASS FP4 MoE",
        "leave it unset: {marlin} is the one setting NVFP4 needs",
        "seed 003; seed 004",
        "0.20.1",
        lambda lane: "VLLM_USE_FLASHINFER_MOE_FP4" in lane.environment,
    ),
    Rule(
        "flashinfer-moe",
        "the FlashInfer MoE backends (--moe-backend flashinfer_*; VLLM_USE_FLASHINFER_MOE_FP8,"
        " _FP16, _INT4 or _MXFP4_* other than 0) are refused: FlashInfer's MoE kernels are absent"
        " on SM121",
        "leave them out: vLLM picks Marlin's MoE kernels for the GPTQ, AWQ and NVFP4 builds, or"
        " set --moe-backend marlin",
        "seed 001",
        "0.19.0",
        _uses_flashinfer_moe,
    ),
    Rule(
        "force-fp8-marlin",
        "VLLM_TEST_FORCE_FP8_MARLIN=1 is refused: it crashes on merged linear layers",
        "leave it unset",
        "seed 003",
        "0.20.1",
        lambda lane: lane.environment.get("VLLM_TEST_FORCE_FP8_MARLIN", "0") != "0",
    ),
    Rule(
        "modelopt-nvfp4",
        "a ModelOpt NVFP4 checkpoint is refused: it loads and answers gibberish on SM121",
        "use a compressed-tensors NVFP4 build (llm-compressor, e.g. RedHatAI's) or AWQ/GPTQ",
        "seed 003",
        "0.20.1",
        _is_modelopt_nvfp4,
    ),
    Rule(
        "qwen3-generation-config",
        "--generation-config other than vllm on a Qwen3 model is refused: thinking mode hides"
        " its tool calls",
        "leave --generation-config out: the lane adds --generation-config vllm",
        "seed 003",
        "0.20.1",
        lambda lane: _is_qwen3(lane) and lane.option("--generation-config") not in (None, "vllm"),
    ),
    Rule(
        "offload-on-unified-memory",
        "--cpu-offload-gb, --kv-offloading-size and --enable-sleep-mode are refused: CPU and"
        " GPU share one memory, offloading frees nothing",
        "leave them out; size the lane with memory_fraction and max_model_len",
        "seed 003",
        "0.20.1",
        _offloads,
    ),
)


@dataclass(frozen=True)
class Addition:
    """A setting the lane adds on the GB10, and where we know it from."""

    name: str
    source: str
    args: Callable[[Lane], list[str]]
    env: Callable[[Lane], dict[str, str]]


def _no_args(lane: Lane) -> list[str]:
    return []


def _no_env(lane: Lane) -> dict[str, str]:
    return {}


SM121_ADDITIONS = (
    Addition(
        # --attention-backend TRITON_ATTN, unless extra_args choose another (e.g. TRITON_MLA)
        "triton-attention",
        "seed 003; seed 004",
        lambda lane: (
            [] if lane.option("--attention-backend") else ["--attention-backend", "TRITON_ATTN"]
        ),
        _no_env,
    ),
    Addition(
        # NVFP4 GEMMs on Marlin (marlin_setting): the variable, or --linear-backend from 0.31.0
        "marlin-nvfp4",
        "seed 003; vllm-option-changes.md",
        _marlin_args,
        _marlin_env,
    ),
    Addition(
        # --generation-config vllm for Qwen3 models
        "qwen3-generation-config",
        "seed 003",
        lambda lane: (
            ["--generation-config", "vllm"]
            if _is_qwen3(lane) and lane.option("--generation-config") is None
            else []
        ),
        _no_env,
    ),
)


def _same_port(lanes: list[Lane], users: list[tuple[str, str]]) -> bool:
    names = {name for name, _ in users}
    return len({lane.port for lane in lanes if lane.name in names}) == 1


def budget_problems(
    lanes: Iterable[Lane],
    unified_memory_gib: float,
    owners: list[tuple[int, int, str]] | None = None,
) -> list[str]:
    """What one host's lanes break together: names, ports (``owners``: ranges no lane may
    take, as port_owners gives them), the memory they add up to, and each lane's fit in its
    share."""
    owners = port_owners(6379) if owners is None else owners
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
        ports.setdefault(lane.port, []).append((lane.name, "port"))
        ports.setdefault(lane.backend_port, []).append((lane.name, "loopback_port"))
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
        for key, port in (("port", lane.port), ("loopback_port", lane.backend_port)):
            owner = next((o for low, high, o in owners if low <= port <= high), None)
            if owner:
                problems.append(f"{lane.name}: {key} {port} is {owner}; pick another port")
    total = round(sum(lane.memory_fraction for lane in lanes), 6)
    if total > FRACTION_LIMIT:
        problems.append(
            f"the memory fractions add up to {total:g} ({_fractions(lanes)}), above"
            f" {FRACTION_LIMIT}: an out-of-memory on unified memory freezes the whole box;"
            f" lower them to a total of {FRACTION_WARNING} or less"
        )
    problems += [_fit_problem(lane, unified_memory_gib) for lane in lanes]
    return [problem for problem in problems if problem]


def budget_warnings(lanes: Iterable[Lane]) -> list[str]:
    """What is allowed but risky: a total above the 0.85-0.87 the field runs safely."""
    lanes = list(lanes)
    total = round(sum(lane.memory_fraction for lane in lanes), 6)
    if FRACTION_WARNING < total <= FRACTION_LIMIT:
        return [
            f"the memory fractions add up to {total:g} ({_fractions(lanes)}), above"
            f" {FRACTION_WARNING}: a Spark has ~102 GiB free after boot, a later lane may not"
            f" start; a total of {FRACTION_WARNING} or less is safe"
        ]
    return []


def context_warnings(lanes: Iterable[Lane]) -> list[str]:
    """Lanes whose context is too short for agent clients (AGENT_CONTEXT): allowed, since
    other clients do with less, but said before the deploy and in the client configuration."""
    return [
        f"{lane.name}: max_model_len {lane.max_model_len} is below {AGENT_CONTEXT}: agent"
        " clients refuse it (Hermes Agent needs 64K, seed 003); raise it to serve them"
        for lane in lanes
        if lane.max_model_len < AGENT_CONTEXT
    ]


def _fractions(lanes: list[Lane]) -> str:
    return ", ".join(f"{lane.name} {lane.memory_fraction:g}" for lane in lanes)


def _fit_problem(lane: Lane, unified_memory_gib: float) -> str:
    estimate = lane.estimate(unified_memory_gib)
    if estimate.fits:
        return ""
    spec = lane.spec
    assert spec is not None
    per_token_gib = spec.kv_bytes_per_token(lane.kv_cache_dtype) / 2**30
    room = estimate.share_gib - estimate.weights_gib - estimate.overhead_gib
    longest = int(room / per_token_gib) // 1024 * 1024 if room > 0 else 0
    needed = math.ceil(estimate.total_gib / unified_memory_gib * 100) / 100
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
        f"{lane.name}: needs ~{estimate.total_gib:.1f} GiB (weights {estimate.weights_gib:g}"
        f" + KV cache {estimate.kv_cache_gib:.1f} for {lane.max_model_len} tokens +"
        f" {estimate.overhead_gib:g} overhead) but memory_fraction {lane.memory_fraction:g} of"
        f" {unified_memory_gib:g} GiB gives {estimate.share_gib:.1f}; {', or '.join(remedies)}"
    )

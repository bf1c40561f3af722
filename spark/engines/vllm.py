"""vLLM as a lane engine: `vllm serve` in NGC's vLLM image.

Its release data is spark/vllm_release.py's (each release's options, their value types and the
environment variables it reads, read from the release's own parser: spark/data/vllm-*.json); the
settings known to break the GB10 (SM121) and the additions it needs are spark/sm121.py's. Here:
the lane's options read as the release's parser reads them, its command line, its container's
environment and the causes the answer canary names.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from spark.checks import ENV_NAME, LINE_BREAK
from spark.sm121 import (
    SM121_ADDITIONS,
    SM121_RULES,
    is_modelopt_nvfp4,
    is_qwen3,
    quantization,
    uses_cutlass_fp4,
)
from spark.vllm_release import (
    DEFAULT_IMAGE,
    Release,
    image_release,
    known_versions,
    newer,
    release,
    without_ray,
)

if TYPE_CHECKING:
    from spark.lane import Lane, MpRank

NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?|-\.\d+")  # a value, not an option, to argparse
# The values argparse's int and float (and vLLM's human_readable_int) turn into numbers, less
# the oddities they also take (spaces, "1_000", "nan", "inf").
INTEGER = re.compile(r"[+-]?\d+")
FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
HUMAN_INTEGER = re.compile(r"\d+|\d+(\.\d+)?[kmgt]|\d+[KMGT]")

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


class Vllm:
    """The engine record of vLLM (spark/engines/record.py: Engine)."""

    name = "vllm"
    # vLLM's api_server listens once the model is loaded; /health answers 200 while it lives.
    health_path = "/health"
    # vLLM's own variable for the key, read where --api-key is not given (vllm/envs.py, in each
    # release's spark/data/vllm-*-env-vars.json; vLLM's build_app: --api-key wins over it).
    key_variable = "VLLM_API_KEY"
    replaces_entrypoint = False  # NGC's entrypoint runs the command it is given
    holds_hf_cli = True  # huggingface_hub, a dependency of vLLM, brings its `hf` command
    default_kv_cache = None  # the model's own dtype (vLLM's --kv-cache-dtype auto)

    def problems(self, lane: Lane) -> list[str]:
        return _vllm_problems(lane)

    def catalog_key(self, lane: Lane) -> str:
        return lane.model

    def option(self, lane: Lane, name: str) -> str | bool | None:
        options = parse_options(lane.extra_args, lane.release)[0]
        found = [value for option, value in options if option == name]
        return found[-1] if found else None

    def argv(self, lane: Lane, rank: MpRank | None = None) -> list[str]:
        return ["vllm", "serve", *serve_args(lane, rank)]

    def container_env(self, lane: Lane) -> dict[str, str]:
        """The lane's environment plus what SM121 needs of vLLM."""
        environment = dict(lane.environment)
        for addition in SM121_ADDITIONS:
            environment |= addition.env(lane)
        return environment

    def model_at_start(self, lane: Lane) -> None:
        return None  # the model is an argument of `vllm serve`

    def canary_causes(self, lane: Lane) -> list[str]:
        return canary_causes(lane)


ENGINE = Vllm()


def serve_args(lane: Lane, rank: MpRank | None = None) -> list[str]:
    """Everything after `vllm serve`: the model, the lane's settings, the additions SM121
    needs, then extra_args; for a cluster lane on executor mp, this box's `rank`. Never a
    key: the API key reaches vLLM as VLLM_API_KEY from a root-only file on the box. vLLM
    listens on loopback only: its --api-key guards /v1 and leaves /invocations, /tokenize,
    /metrics and more open to anyone (vLLM's security guide; vllm-project/vllm#18892), so
    the box's front (operations/front.py) owns `port` and asks the key on every path."""
    args = [
        lane.model,
        "--served-model-name", lane.served_name,
        "--host", "127.0.0.1",
        "--port", str(lane.server_port),
        "--gpu-memory-utilization", f"{lane.memory_fraction:g}",
        "--max-model-len", str(lane.max_model_len),
    ]  # fmt: skip
    if lane.kv_cache_dtype:
        args += ["--kv-cache-dtype", lane.kv_cache_dtype]
    if lane.tool_call_parser:
        args += ["--tool-call-parser", lane.tool_call_parser, "--enable-auto-tool-choice"]
    if lane.is_cluster:  # one rank per box
        args += ["--tensor-parallel-size", str(lane.tensor_parallel_size)]
        args += ["--distributed-executor-backend", lane.cluster_executor or "ray"]
    if lane.cluster_executor == "mp":
        if rank is None:
            raise ValueError(f"lane {lane.name}: a cluster lane on executor mp needs its rank")
        args += ["--nnodes", str(lane.tensor_parallel_size), "--node-rank", str(rank.node_rank)]
        args += ["--master-addr", rank.master_addr, "--master-port", str(rank.master_port)]
        if rank.headless:  # no API server on this box: the head serves
            args.append("--headless")
    for addition in SM121_ADDITIONS:
        args += addition.args(lane)
    return [*args, *lane.extra_args]


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
        problems += [f"executor: ray: {problem}" for problem in without_ray(lane.image)]
    if lane.is_cluster and lane.on_demand_idle_s is not None:
        problems.append(
            "on_demand_idle_s: a cluster lane holds a rank on every box of the cluster, which"
            " start together; keep it resident (leave on_demand_idle_s out)"
        )
    return problems


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


def canary_causes(lane: Lane) -> list[str]:
    """The usual causes of a wrong answer for this lane's model and quantization, named by the
    canary when it fails (no secrets: they are in the unit)."""
    causes = []
    nvfp4 = quantization(lane) in ("nvfp4", "nvfp4-modelopt")
    if nvfp4 or is_modelopt_nvfp4(lane):  # known ones are refused (sm121.py); others are not
        causes.append(
            "a ModelOpt NVFP4 checkpoint (quant_method modelopt in its config.json): loads and"
            " answers confident nonsense on SM121; use a compressed-tensors NVFP4 one (seed 003)"
        )
    if nvfp4 or uses_cutlass_fp4(lane):
        causes.append(
            "NVFP4 on a CUTLASS FP4 path, not Marlin: silent garbage on SM121; Marlin is"
            " VLLM_NVFP4_GEMM_BACKEND=marlin to 0.20.1, --linear-backend marlin from 0.31.0"
            " (seed 003)"
        )
    if is_qwen3(lane):
        causes.append(
            "a thinking template hiding the answer: Qwen3 models need --generation-config vllm,"
            " or their answer stays in the reasoning (seed 003)"
        )
    causes.append(
        "a chat template that does not fit the model, or weights that do not match its config"
        " (read the answer quoted above)"
    )
    return causes

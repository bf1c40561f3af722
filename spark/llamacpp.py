"""What a llama.cpp lane runs: `llama-server` with the field's settings for the GB10, its options
checked against the own argument table of the llama.cpp the image was built from.

A llama.cpp lane serves one GGUF file from a Hugging Face repository in the box's cache, on
127.0.0.1 behind the box's front as every lane. Its settings come from the field (each with its
source below); the options a lane's own keys give, and the ones that break or slow the GB10,
are refused in extra_args. The option list is llama.cpp's (spark/llamacpp_release.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from spark.llamacpp_release import known_commits, options

# The server binary in the field's image and in llama.cpp's own server images (both Dockerfiles:
# `ENTRYPOINT ["/app/llama-server"]`; ardge-labs/llama-cpp-dgx-spark, ggml-org .devops/cuda).
SERVER = "/app/llama-server"
# llama.cpp's own variables for --model and --api-key (common/arg.cpp, set_env): read before
# the command line, so the shell that starts the server sets them.
MODEL_VARIABLE = "LLAMA_ARG_MODEL"
KEY_VARIABLE = "LLAMA_API_KEY"
# The image seed 002 serves its GGUF with: llama.cpp built for CUDA 13 and sm_121 (llama.cpp's
# own server-cuda image is amd64 only, seed 002).
FIELD_IMAGE = "ghcr.io/ardge-labs/llama-cpp-dgx-spark:server"

# The field's settings, given unless extra_args give the same option (llama.cpp warns on an
# option given twice: common/arg.cpp, "specified multiple times").
DEFAULTS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    # Every layer on the GPU: `--fit on` (llama.cpp's default) misjudges unified memory and
    # offloaded only 34 of 49 layers (seed 002).
    (("-ngl", "--gpu-layers", "--n-gpu-layers"), ("--n-gpu-layers", "99")),
    (("-fit", "--fit"), ("--fit", "off")),
    # Jinja chat templates, which tool calls need (seed 002).
    (("--jinja", "--no-jinja"), ("--jinja",)),
    # The Grace CPU's 10 performance cores: 20 threads ran slower (seed 003's llama-bench grid).
    (("-t", "--threads"), ("--threads", "10")),
    # Its Prometheus metrics at /metrics, which the box's metrics endpoint serves behind the
    # metrics key (operations/metrics.py); off by default (tools/server/README.md: "--metrics
    # enable prometheus compatible metrics endpoint (default: disabled)").
    (("--metrics",), ("--metrics",)),
)
# One slot: agent clients send prompts past 32K, and slots split the context (seed 002:
# "splitting context across slots causes 'context exceeded'"). A lane's `slots` changes it.
DEFAULT_SLOTS = 1
# The KV cache in q8_0: half of f16's memory for 58.02 against 58.91 tok/s (seed 003, "the q8_0
# KV cache is free"). V in q8_0 needs flash attention, which llama.cpp turns on itself on CUDA
# (common/common.h: flash_attn_type AUTO).
DEFAULT_KV_CACHE = "q8_0"
# common/arg.cpp's kv_cache_types, and the bytes each stores per element (ggml's block sizes: a
# q8_0 block holds 32 values in 34 bytes, q4_0 in 18, q4_1 in 20, iq4_nl in 18, q5_0 in 22,
# q5_1 in 24).
KV_CACHE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}

# The usual causes of a wrong answer from llama-server, named by the answer canary.
CANARY_CAUSES = [
    "an image built from a llama.cpp older than the model's architecture needs: Qwen3-Coder-Next"
    " (Gated DeltaNet) needs b7186 or later with the key_gdiff fix (llama.cpp PR #19324, seed 002)",
    "a thinking template hiding the answer: the answer stays in the reasoning; Qwen3 models"
    " answer without it with --reasoning-budget 0 in extra_args",
    "a chat template that does not fit the model (--jinja renders the GGUF's own; a newer one"
    " of the model's repository may be needed), or a GGUF quantized too low (Q2, Q3) to answer",
]
# Options a lane's own keys give: extra_args may not give them again.
LANE_KEYS = {
    "--model": "model and gguf_file",
    "--alias": "served_name",
    "--port": "port (clients') and loopback_port (llama-server's own, behind the front)",
    "--ctx-size": "max_model_len",
    "--parallel": "slots",
    "--cache-type-k": "kv_cache_dtype",
    "--cache-type-v": "kv_cache_dtype",
}
# Options extra_args may not carry at all, and why.
REFUSED = {
    "--api-key": "a secret in argv shows in `ps` and `docker inspect`; the key is generated"
    " on the box (api_key = True)",
    "--api-key-file": "the deploy gives llama-server the lane's key; set api_key = True",
    "--host": "llama-server listens on 127.0.0.1 behind the box's front, which asks the key on"
    " every path; narrow the LAN side with front_allow_networks",
    "--hf-repo": "the deploy fetches the lane's GGUF before it starts; set model and gguf_file",
    "--hf-file": "the deploy fetches the lane's GGUF before it starts; set model and gguf_file",
    "--model-url": "the deploy fetches the lane's GGUF before it starts; set model and gguf_file",
    "--hf-token": "a token in argv shows in `ps` and `docker inspect`; set hf_token_file",
    "--ssl-key-file": "the box's front terminates TLS (front_tls_cert_file, front_tls_key_file)",
    "--ssl-cert-file": "the box's front terminates TLS (front_tls_cert_file, front_tls_key_file)",
}
# Layers kept off the GPU (--n-gpu-layers below all of them, or llama.cpp's fitter choosing so:
# --fit on) are refused, as a draft model is (DRAFT, below): on unified memory they sit in the
# same LPDDR5X and run at the Grace CPU's speed, so a spill frees no memory and costs decode
# (83.7% of it for Qwen3.6-35B-A3B on a DGX Spark: unslothai/unsloth PR 9872; seed 002 forces
# every layer, where llama.cpp's own fit kept 34 of 49 on the GPU). llama.cpp counts the model's
# blocks and its output layer (49 for 48 blocks, seed 002; the output layer alone halved decode
# in ggml-org/llama.cpp#11752), and takes a number, 'auto' or 'all' (common/arg.cpp).
GPU_LAYERS = ("-ngl", "--gpu-layers", "--n-gpu-layers")
FIT = ("-fit", "--fit")
SPILL = (
    "on unified memory the layers left to the CPU sit in the same memory and run at the CPU's"
    " speed: no memory freed, decode lost (83.7% on a DGX Spark: unslothai/unsloth PR 9872)"
)
# A draft model shares the memory bus with the target on unified memory: every pairing seed 003
# tried was slower (gpt-oss 120B with 20B: 51.60 against 58.02 tok/s).
DRAFT = "speculative decoding with a draft model was slower in every pairing on unified memory"
GGUF_FILE = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*\.gguf")
# A split GGUF's first part (llama.cpp's gguf-split names: NAME-00001-of-00003.gguf); llama.cpp
# loads the others from beside it.
SPLIT = re.compile(r"(?P<stem>.+)-00001-of-(?P<count>\d{5})\.gguf")
# Variables a lane may set: CUDA's and ggml's own. llama.cpp's LLAMA_ARG_* ones set options
# past these checks (and LLAMA_API_KEY is the key): give those as extra_args.
ENV_PREFIXES = ("CUDA_", "GGML_")


def parse(tokens: Iterable[str], commit: str) -> tuple[list[tuple[str, str | None]], list[str]]:
    """extra_args read as llama.cpp's parser reads them: ([(option as written, its values joined
    by a space, or None for a flag)], problems). An option is followed by its values as the next
    items (llama.cpp takes no `--name=value`; common_params_parse_ex in common/arg.cpp)."""
    known = options(commit)
    tokens = list(tokens)
    found: list[tuple[str, str | None]] = []
    problems: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if any(c in token for c in "\n\r\0"):
            problems.append(f"item {i} has a line break or NUL; remove it")
            continue
        name = token.replace("_", "-") if token.startswith("--") else token
        option = known.get(name)
        if option is None:
            hint = " (llama.cpp takes no --name=value: give the value as the next item)"
            problems.append(
                f"{token} is no option of llama.cpp {commit}'s llama-server"
                f"{hint if '=' in token else ''}; see `llama-server --help`"
            )
            continue
        count = 0 if name in option.negatives else option.values
        if i + count > len(tokens):
            hint = " ".join(hint for hint in (option.value, option.value_2) if hint)
            problems.append(f"{token} needs {hint} after it; put it there")
            i = len(tokens)
            continue
        found.append((name, " ".join(tokens[i : i + count]) if count else None))
        i += count
    return found, problems


def problems(
    extra_args: Iterable[str],
    environment: dict[str, str],
    kv_cache: str | None,
    commit: str,
    layers: int | None = None,
) -> list[str]:
    """What llama.cpp `commit` would refuse, or the GB10 does badly, in a lane's settings
    (``layers``: the model's blocks, where the catalog knows them)."""
    if commit not in known_commits():
        return [
            f"llama_cpp_commit: no option list is held for llama.cpp {commit!r}; known:"
            f" {', '.join(known_commits())} (tools/llama_cpp_options.py writes one from the"
            " release's common/arg.cpp)"
        ]
    found, found_problems = parse(extra_args, commit)
    result = [f"extra_args: {problem}" for problem in found_problems]
    for name, _value in found:
        every = canonical_names(name, commit)
        key = next((n for n in every if n in LANE_KEYS), None)
        refused = next((n for n in every if n in REFUSED), None)
        if key:
            result.append(f"extra_args: {name} comes from the lane; set {LANE_KEYS[key]}")
        elif refused:
            result.append(f"extra_args: {name} is refused: {REFUSED[refused]}")
        elif any("draft" in n for n in every):
            result.append(f"extra_args: {name} is refused: {DRAFT} (seed 003); leave it out")
    result += [
        f"extra_args: {problem}"
        for name, value in found
        if name in GPU_LAYERS + FIT and value is not None
        if (problem := offload_problem(name, value, layers))
    ]
    if kv_cache is not None and kv_cache not in KV_CACHE_BYTES:
        result.append(
            f"kv_cache_dtype: {kv_cache!r} is no llama.cpp cache type; one of:"
            f" {', '.join(KV_CACHE_BYTES)}"
        )
    for name, value in environment.items():
        if not name.startswith(ENV_PREFIXES):
            allowed = "/".join(prefix + "*" for prefix in ENV_PREFIXES)
            result.append(
                f"environment: {name!r}: a llama.cpp lane takes {allowed} variables only;"
                " give llama-server's options as extra_args"
            )
        if any(c in value for c in "\n\r\0"):
            result.append(f"environment: {name}: its value has a line break or NUL; remove it")
    return result


def offload_problem(name: str, value: str, layers: int | None) -> str | None:
    """Why ``name value`` keeps layers of a model of ``layers`` blocks off the GPU: --fit on, or
    a number of GPU layers below every block and the output layer. None for 'all', 'auto' and
    llama.cpp's sentinels for them (-2, -1: common/arg.cpp), which the lane's --fit off leaves
    at every layer, and for any number where the block count is unknown (it cannot be told)."""
    if name in FIT:
        if value != "on":
            return None
        return (
            f"{name} on is refused: llama.cpp's fitter misjudges unified memory and kept 34 of"
            f" 49 layers on the GPU (seed 002), and {SPILL}; leave it out (the lane gives"
            " --fit off and every layer)"
        )
    number = re.match(r"\s*[-+]?\d+", value)  # std::stoi's reading
    if number is None or layers is None or int(number[0]) < 0 or int(number[0]) > layers:
        return None
    return (
        f"{name} {value} is refused: it keeps {layers + 1 - int(number[0])} of the model's"
        f" {layers + 1} layers ({layers} blocks and the output layer) off the GPU, and {SPILL};"
        f" give {name} all, or leave it out (the lane gives every layer)"
    )


def canonical_names(name: str, commit: str) -> tuple[str, ...]:
    """Every name of the option `name` is one of (its negatives included)."""
    option = options(commit)[name]
    return (*option.names, *option.negatives)


def server_args(
    *,
    served_name: str,
    port: int,
    context: int,
    slots: int,
    kv_cache: str | None,
    extra_args: tuple[str, ...],
    commit: str,
) -> list[str]:
    """Everything after llama-server: the lane's own settings, the field's defaults not given in
    extra_args, then extra_args. The GGUF's path is MODEL_VARIABLE, set where the container
    starts (the snapshot's revision is read there). Never a key: it reaches llama-server as
    LLAMA_API_KEY (its own variable, common/arg.cpp) from a root-only file on the box."""
    given = {n for name, _ in parse(extra_args, commit)[0] for n in canonical_names(name, commit)}
    cache = kv_cache or DEFAULT_KV_CACHE
    args = [
        "--alias", served_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ctx-size", str(context),
        "--parallel", str(slots),
        "--cache-type-k", cache,
        "--cache-type-v", cache,
    ]  # fmt: skip
    for names, default in DEFAULTS:
        if not given & set(names):
            args += default
    return [*args, *extra_args]


def split_parts(gguf_file: str) -> list[str]:
    """The files a GGUF consists of: itself, or every part of a split one named by its first."""
    match = SPLIT.fullmatch(gguf_file)
    if not match:
        return [gguf_file]
    count = int(match["count"])
    return [f"{match['stem']}-{n:05d}-of-{count:05d}.gguf" for n in range(1, count + 1)]

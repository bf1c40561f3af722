"""llama.cpp as a lane engine: `llama-server` serving one GGUF file of a Hugging Face repository.

Its release data is spark/llamacpp_release.py's (each commit's option table, read from its
common/arg.cpp: spark/data/llama.cpp-*-server-options.json); its settings for the GB10, the
options it refuses and its parser are spark/llamacpp.py's. Here: the lane's checks, its command
line, its model read at the container's start and the causes the answer canary names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark import llamacpp
from spark.box_paths import HF_CACHE_IN_CONTAINER, hf_cache_dir
from spark.checks import HF_ID
from spark.engines.record import ModelAtStart
from spark.llamacpp_release import DEFAULT_COMMIT

if TYPE_CHECKING:
    from spark.lane import Lane, MpRank


class LlamaCpp:
    """The engine record of llama.cpp (spark/engines/record.py: Engine)."""

    name = "llama.cpp"
    # 200 once the model is loaded, 503 while it loads (tools/server/README.md: GET /health).
    health_path = "/health"
    key_variable = llamacpp.KEY_VARIABLE
    replaces_entrypoint = True  # ENTRYPOINT ["/app/llama-server"] (spark/llamacpp.py: SERVER)
    holds_hf_cli = False  # a llama.cpp image has no Python, no `hf`
    default_kv_cache = llamacpp.DEFAULT_KV_CACHE

    def problems(self, lane: Lane) -> list[str]:
        return _llama_cpp_problems(lane)

    def catalog_key(self, lane: Lane) -> str:
        """A GGUF file's repository and path."""
        return f"{lane.model}/{lane.gguf_file}" if lane.gguf_file else lane.model

    def option(self, lane: Lane, name: str) -> str | bool | None:
        commit = lane.llama_cpp_commit or DEFAULT_COMMIT
        found = [
            True if value is None else value
            for option, value in llamacpp.parse(lane.extra_args, commit)[0]
            if name in llamacpp.canonical_names(option, commit)
        ]
        return found[-1] if found else None

    def argv(self, lane: Lane, rank: MpRank | None = None) -> list[str]:
        return [llamacpp.SERVER, *server_args(lane)]

    def container_env(self, lane: Lane) -> dict[str, str]:
        return dict(lane.environment)  # no SM121 addition: those are vLLM's

    def model_at_start(self, lane: Lane) -> ModelAtStart:
        """The GGUF of the snapshot refs/main names as the container starts (llama.cpp reads
        LLAMA_ARG_MODEL where --model is not given: common/arg.cpp, set_env)."""
        repo = hf_cache_dir(HF_CACHE_IN_CONTAINER, lane.model)
        return ModelAtStart(llamacpp.MODEL_VARIABLE, repo, lane.gguf_file or "")

    def canary_causes(self, lane: Lane) -> list[str]:
        return llamacpp.CANARY_CAUSES


ENGINE = LlamaCpp()


def server_args(lane: Lane) -> list[str]:
    """Everything after llama-server (spark/llamacpp.py), on 127.0.0.1 behind the box's front
    as a vLLM lane."""
    return llamacpp.server_args(
        served_name=lane.served_name,
        port=lane.server_port,
        context=lane.max_model_len,
        slots=lane.slots or llamacpp.DEFAULT_SLOTS,
        kv_cache=lane.kv_cache_dtype,
        extra_args=lane.extra_args,
        commit=lane.llama_cpp_commit or DEFAULT_COMMIT,
    )


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

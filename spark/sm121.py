"""The GB10 (SM121) rules: the settings a vLLM lane may not carry, each with its source and the
vLLM release that source ran, and the settings a lane adds; and the predicates they read, which
the lanes' operations use too (a canary names the causes that fit the lane)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark.checks import HF_ID
from spark.vllm_release import Release, newer

if TYPE_CHECKING:
    from spark.lane import Lane

# NGC images whose vLLM fails to import fastsafetensors (field-facts, "vLLM on SM121").
IMAGES_WITHOUT_FASTSAFETENSORS = frozenset(
    {"nvcr.io/nvidia/vllm:26.03-py3", "nvcr.io/nvidia/vllm:26.04-py3"}
)
GEMM_VARIABLE = "VLLM_NVFP4_GEMM_BACKEND"  # NVFP4's GEMM kernel up to vLLM 0.20.1


def is_gpt_oss(lane: Lane) -> bool:
    """OpenAI's gpt-oss models, the checkpoints mxfp4 is kept for."""
    return "gpt-oss" in lane.model.lower()


def is_qwen3(lane: Lane) -> bool:
    """Qwen3 and its successors (3.5, 3.6, Next, Coder-Next)."""
    return "qwen3" in lane.model.rsplit("/", 1)[-1].lower()


def quantization(lane: Lane) -> str | None:
    """The checkpoint's format, as its model_spec or catalog entry gives it (None: neither)."""
    spec = lane.spec
    return spec.quantization if spec else None


def is_modelopt_nvfp4(lane: Lane) -> bool:
    """NVIDIA's own FP4 checkpoints are ModelOpt exports (nvidia/Llama-3.3-70B-Instruct-NVFP4,
    seed 003; nvidia/Qwen3.6-35B-A3B-NVFP4, its model card)."""
    match = HF_ID.fullmatch(lane.model)
    by_name = bool(match) and match["org"] == "nvidia" and "FP4" in lane.model.upper()
    return (
        by_name
        or quantization(lane) == "nvfp4-modelopt"
        or lane.option("--quantization") == "modelopt_fp4"
    )


def uses_cutlass_fp4(lane: Lane) -> bool:
    gemm = lane.environment.get("VLLM_NVFP4_GEMM_BACKEND")
    linear = lane.option("--linear-backend")
    moe = lane.option("--moe-backend")
    nvfp4 = quantization(lane) in ("nvfp4", "nvfp4-modelopt")
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
    wanted = quantization(lane) == "nvfp4" and not lane.release.reads(GEMM_VARIABLE)
    return ["--linear-backend", "marlin"] if wanted and not lane.option("--linear-backend") else []


def _marlin_env(lane: Lane) -> dict[str, str]:
    wanted = quantization(lane) == "nvfp4" and lane.release.reads(GEMM_VARIABLE)
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
        uses_cutlass_fp4,
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
            "mxfp4" in (lane.option("--quantization"), quantization(lane)) and not is_gpt_oss(lane)
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
        is_modelopt_nvfp4,
    ),
    Rule(
        "qwen3-generation-config",
        "--generation-config other than vllm on a Qwen3 model is refused: thinking mode hides"
        " its tool calls",
        "leave --generation-config out: the lane adds --generation-config vllm",
        "seed 003",
        "0.20.1",
        lambda lane: is_qwen3(lane) and lane.option("--generation-config") not in (None, "vllm"),
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
            if is_qwen3(lane) and lane.option("--generation-config") is None
            else []
        ),
        _no_env,
    ),
)

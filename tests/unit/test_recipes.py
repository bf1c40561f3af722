"""spark/lane.py, spark/sm121.py, spark/catalog.py: the lane model, its vllm serve arguments,
the SM121 rules, the catalog, a lane's memory estimate; and how spark/inventory/ reports them
before any host is contacted (a box's memory budget: test_memory.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ValidationError

from spark.catalog import CATALOG
from spark.checks import matching, refused
from spark.engines.vllm import parse_options, serve_args
from spark.inventory import ConfigError, load_from_dicts
from spark.lane import Lane, MpRank
from spark.memory import estimate
from spark.sm121 import SM121_ADDITIONS, SM121_RULES
from spark.vllm_release import DATA

from .test_config import PROBLEM_LINE, group_defaults, merged, run_pyinfra

DEFAULTS = group_defaults()
SPARK_GIB = DEFAULTS["unified_memory_gib"]
PROBE = {
    "name": "probe",
    "image": "nvcr.io/nvidia/vllm:26.04-py3",
    "model": "bullpoint/Qwen3-Coder-Next-AWQ-4bit",
    "served_name": "probe",
    "port": 10101,
    "memory_fraction": 0.45,
    "max_model_len": 65536,
}
NVFP4 = "inference-optimization/Qwen3.6-35B-A3B-NVFP4"
LLAMA_NVFP4_SPEC = {
    "weights_gib": 40,
    "attention_layers": 80,
    "kv_heads": 8,
    "head_dim": 128,
    "quantization": "nvfp4",
}


def lane(**changes: Any) -> dict[str, Any]:
    return PROBE | changes


def problems(*lanes: dict[str, Any], **data: Any) -> list[str]:
    """The problems a lone Spark with these lanes (and other data) is refused with; [] if none."""
    try:
        load_from_dicts(merged({"spark-1": {"lanes": list(lanes), **data}}))
    except ConfigError as error:
        assert all(PROBLEM_LINE.fullmatch(line) for line in error.problems), error.problems
        return error.problems
    return []


def accepted(*lanes: dict[str, Any], **data: Any) -> tuple[Lane, ...]:
    return load_from_dicts(merged({"spark-1": {"lanes": list(lanes), **data}})).head.lanes


# The default lanes: the field's two-lane appliance (seed 003).


def test_the_default_lanes_are_the_field_appliance_and_validate() -> None:
    coder, fast = load_from_dicts(merged({"spark-1": {}})).head.lanes

    assert [(x.name, x.port, x.memory_fraction) for x in (coder, fast)] == [
        ("coder", 10101, 0.45),
        ("fast", 10102, 0.35),
    ]
    assert coder.model == "bullpoint/Qwen3-Coder-Next-AWQ-4bit"
    assert "Qwen3.6-35B-A3B-NVFP4" in fast.model
    assert (coder.priority, fast.priority) == (2, 1)  # the guard stops lane B first
    assert coder.api_key and fast.api_key


def test_the_default_lanes_render_their_full_command_lines() -> None:
    coder, fast = accepted(*DEFAULTS["lanes"])

    assert serve_args(coder) == [
        "bullpoint/Qwen3-Coder-Next-AWQ-4bit",
        "--served-model-name", "qwen3-coder-next",
        # vLLM on loopback, 1000 above the lane's port: nginx owns 10101 (operations/front.py).
        "--host", "127.0.0.1",
        "--port", "11101",
        "--gpu-memory-utilization", "0.45",
        "--max-model-len", "131072",
        "--tool-call-parser", "qwen3_coder", "--enable-auto-tool-choice",
        "--attention-backend", "TRITON_ATTN",
        "--generation-config", "vllm",
    ]  # fmt: skip
    assert serve_args(fast)[:2] == [NVFP4, "--served-model-name"]
    assert coder.container_env() == {}
    assert fast.container_env() == {"VLLM_NVFP4_GEMM_BACKEND": "marlin"}


def test_lanes_without_overrides_carry_no_warning() -> None:
    assert load_from_dicts(merged({"spark-1": {}})).warnings == ()


# Rendering.


def test_optional_settings_and_extra_args_come_last_and_no_key_is_ever_rendered() -> None:
    (probe,) = accepted(
        lane(
            kv_cache_dtype="fp8",
            extra_args=["--max-num-seqs", "8", "--max_cudagraph_capture_size=2048"],
            environment={"HF_HUB_OFFLINE": "1"},
        )
    )

    args = serve_args(probe)
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert args[-3:] == ["--max-num-seqs", "8", "--max_cudagraph_capture_size=2048"]
    assert "--tool-call-parser" not in args and "--enable-auto-tool-choice" not in args
    assert not any("key" in arg.lower() for arg in args)
    assert probe.container_env() == {"HF_HUB_OFFLINE": "1"}


def test_a_chosen_attention_backend_replaces_the_default() -> None:
    (probe,) = accepted(lane(extra_args=["--attention-backend", "TRITON_MLA"]))

    assert serve_args(probe).count("--attention-backend") == 1
    assert probe.option("--attention-backend") == "TRITON_MLA"


@pytest.mark.parametrize("addition", SM121_ADDITIONS, ids=lambda addition: addition.name)
def test_each_addition_is_made_where_needed_and_only_there(addition: Any) -> None:
    needs, spared = {
        "triton-attention": (lane(), lane(extra_args=["--attention-backend", "TRITON_MLA"])),
        "marlin-nvfp4": (lane(model=NVFP4), lane()),
        "qwen3-generation-config": (
            lane(),
            lane(model="openai/gpt-oss-120b", memory_fraction=0.6),
        ),
    }[addition.name]
    (needing,) = accepted(needs)
    (sparing,) = accepted(spared)

    assert addition.args(needing) or addition.env(needing)
    assert not addition.args(sparing) and not addition.env(sparing)
    assert addition.source


# The SM121 rules: every rule refuses its example, naming what to do and the source.

FAILING_EXAMPLES = {
    "flashinfer-moe": lane(extra_args=["--moe-backend", "flashinfer_cutlass"]),
    "flashinfer-attention": lane(extra_args=["--attention-backend", "FLASHINFER"]),
    "cutlass-fp4": lane(environment={"VLLM_NVFP4_GEMM_BACKEND": "cutlass"}),
    "enforce-eager": lane(extra_args=["--enforce-eager"]),
    "fastsafetensors": lane(extra_args=["--load-format", "fastsafetensors"]),
    "mxfp4-beyond-gpt-oss": lane(extra_args=["--quantization", "mxfp4"]),
    "flashinfer-moe-fp4": lane(environment={"VLLM_USE_FLASHINFER_MOE_FP4": "0"}),
    "force-fp8-marlin": lane(environment={"VLLM_TEST_FORCE_FP8_MARLIN": "1"}),
    "modelopt-nvfp4": lane(
        model="nvidia/Llama-3.3-70B-Instruct-NVFP4", model_spec=LLAMA_NVFP4_SPEC
    ),
    "qwen3-generation-config": lane(extra_args=["--generation-config", "auto"]),
    "offload-on-unified-memory": lane(extra_args=["--enable-sleep-mode"]),
}


# Each rule's refusal of its example, written out as the user reads it (the rule's own fields
# must not rebuild it here).
EXPECTED_REFUSALS = {
    "flashinfer-attention": (
        "--attention-backend FLASHINFER* is refused: FlashInfer has no sm_121 kernels; "
        "leave --attention-backend out: the lane adds TRITON_ATTN (seed 003; seed 004)"
    ),
    "cutlass-fp4": (
        "CUTLASS FP4 (an NVFP4 GEMM backend other than VLLM_NVFP4_GEMM_BACKEND=marlin; "
        "--moe-backend cutlass or flashinfer_cutlass on an NVFP4 checkpoint) is refused: "
        "silent garbage on SM121, which lacks the TMEM it needs; leave both out: the lane"
        " sets VLLM_NVFP4_GEMM_BACKEND=marlin for NVFP4 (seed 003; seed 004)"
    ),
    "enforce-eager": (
        "CUDA graphs off (--enforce-eager, --optimization-level 0, a --compilation-config"
        " with cudagraph_mode NONE, no capture sizes, or a mode other than 3) is refused:"
        " without CUDA graphs SM121 loses ~55% of its throughput; leave them on; size "
        "them with --max-cudagraph-capture-size (seed 001)"
    ),
    "fastsafetensors": (
        "--load-format fastsafetensors is refused on NGC vLLM 26.03/26.04: ImportError; "
        "leave --load-format out (safetensors), or use an image that ships "
        "fastsafetensors (seed 004)"
    ),
    "mxfp4-beyond-gpt-oss": (
        "mxfp4 on a checkpoint other than gpt-oss is refused: it breaks on BF16 "
        "checkpoints; keep mxfp4 for openai/gpt-oss-*; use an AWQ, GPTQ or "
        "compressed-tensors NVFP4 build (seed 004)"
    ),
    "flashinfer-moe-fp4": (
        "VLLM_USE_FLASHINFER_MOE_FP4 is refused: =0 raises a ValueError on Qwen models, "
        "=1 picks FlashInfer's CUTLASS FP4 MoE; leave it unset: "
        "VLLM_NVFP4_GEMM_BACKEND=marlin is the one setting NVFP4 needs (seed 003; seed "
        "004)"
    ),
    "flashinfer-moe": (
        "the FlashInfer MoE backends (--moe-backend flashinfer_*; "
        "VLLM_USE_FLASHINFER_MOE_FP8, _FP16, _INT4 or _MXFP4_* other than 0) are refused:"
        " FlashInfer's MoE kernels are absent on SM121; leave them out: vLLM picks "
        "Marlin's MoE kernels for the GPTQ, AWQ and NVFP4 builds, or set --moe-backend "
        "marlin (seed 001)"
    ),
    "force-fp8-marlin": (
        "VLLM_TEST_FORCE_FP8_MARLIN=1 is refused: it crashes on merged linear layers; "
        "leave it unset (seed 003)"
    ),
    "modelopt-nvfp4": (
        "a ModelOpt NVFP4 checkpoint is refused: it loads and answers gibberish on SM121;"
        " use a compressed-tensors NVFP4 build (llm-compressor, e.g. RedHatAI's) or "
        "AWQ/GPTQ (seed 003)"
    ),
    "qwen3-generation-config": (
        "--generation-config other than vllm on a Qwen3 model is refused: thinking mode "
        "hides its tool calls; leave --generation-config out: the lane adds "
        "--generation-config vllm (seed 003)"
    ),
    "offload-on-unified-memory": (
        "--cpu-offload-gb, --kv-offloading-size and --enable-sleep-mode are refused: CPU "
        "and GPU share one memory, offloading frees nothing; leave them out; size the "
        "lane with memory_fraction and max_model_len (seed 003)"
    ),
}


def test_every_rule_has_a_failing_example() -> None:
    assert set(FAILING_EXAMPLES) == {rule.name for rule in SM121_RULES}
    assert set(EXPECTED_REFUSALS) == {rule.name for rule in SM121_RULES}
    assert len({rule.name for rule in SM121_RULES}) == len(SM121_RULES)


@pytest.mark.parametrize("rule", SM121_RULES, ids=lambda rule: rule.name)
def test_each_rule_refuses_its_example_and_only_with_that_rule(rule: Any) -> None:
    found = problems(FAILING_EXAMPLES[rule.name])

    assert found == ["spark-1: lanes: probe: " + EXPECTED_REFUSALS[rule.name]]


@pytest.mark.parametrize("rule", SM121_RULES, ids=lambda rule: rule.name)
def test_no_rule_refuses_the_default_lanes(rule: Any) -> None:
    assert not any(rule.breaks(default) for default in accepted(*DEFAULTS["lanes"]))


@pytest.mark.parametrize(
    "example",
    [
        lane(model=NVFP4, extra_args=["--moe-backend", "cutlass"]),
        lane(model=NVFP4, extra_args=["--moe-backend", "flashinfer_cutlass"]),
        lane(environment={"VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass"}),
    ],
)
def test_cutlass_fp4_is_refused_by_any_road(example: dict[str, Any]) -> None:
    assert any("CUTLASS FP4" in line for line in problems(example))


def test_the_cutlass_moe_backend_stays_open_to_non_fp4_checkpoints() -> None:
    assert accepted(lane(extra_args=["--moe-backend", "cutlass"]))


@pytest.mark.parametrize(
    "example",
    [
        lane(model="x/Llama-FP4", model_spec=LLAMA_NVFP4_SPEC | {"quantization": "nvfp4-modelopt"}),
        lane(extra_args=["--quantization", "modelopt_fp4"]),
    ],
)  # fmt: skip
def test_modelopt_nvfp4_is_refused_by_spec_and_by_option(example: dict[str, Any]) -> None:
    assert any("ModelOpt NVFP4" in line for line in problems(example))


def test_fastsafetensors_is_left_to_images_that_may_have_it() -> None:
    other = lane(
        image="nvcr.io/nvidia/vllm:26.05-py3",
        extra_args=["--load-format", "fastsafetensors"],
    )
    assert accepted(other)


def test_mxfp4_stays_open_to_gpt_oss() -> None:
    gpt_oss = lane(
        model="openai/gpt-oss-120b",
        memory_fraction=0.6,
        extra_args=["--quantization", "mxfp4"],
    )
    assert accepted(gpt_oss)


def test_the_harmless_value_of_force_fp8_marlin_passes() -> None:
    assert accepted(lane(environment={"VLLM_TEST_FORCE_FP8_MARLIN": "0"}))


# The memory estimate, against the field's figures (field-facts.md).


def test_the_fractions_are_of_what_cuda_reports_on_a_spark() -> None:
    # vLLM wanted 105.87 GiB at 0.87 on a Spark (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47).
    (probe,) = accepted(lane(memory_fraction=0.87))
    assert round(estimate(probe, SPARK_GIB).share_gib, 2) == 105.87


def test_coder_next_kv_cache_grows_only_in_its_full_attention_layers() -> None:
    # 12 of 48 layers, 2 KV heads of 256: 24 KiB a token in bf16, 12 KiB in fp8.
    (bf16,) = accepted(lane(max_model_len=262144))
    (fp8,) = accepted(lane(max_model_len=262144, kv_cache_dtype="fp8"))

    assert estimate(bf16, SPARK_GIB).kv_cache_gib == 6.0
    assert estimate(fp8, SPARK_GIB).kv_cache_gib == 3.0


def test_lane_a_fits_its_045_share_as_in_the_field() -> None:
    coder = estimate(accepted(*DEFAULTS["lanes"])[0], SPARK_GIB)

    assert coder.weights_gib == 40  # ~40 GB (seed 003)
    # 40 GB of weights (seed 003) + 3 GiB of bf16 KV cache for 128K tokens (24 KiB a token)
    # + 4 GiB of overhead (the project's own estimate: no field figure splits it out)
    assert coder.total_gib == 47
    assert coder.fits and coder.share_gib == pytest.approx(54.76, abs=0.01)


def test_lane_b_fits_its_035_share_as_in_the_field() -> None:
    fast = estimate(accepted(*DEFAULTS["lanes"])[1], SPARK_GIB)

    assert fast.weights_gib == 20  # NVFP4 ~20 GB (seed 003)
    assert fast.fits and fast.share_gib == pytest.approx(42.59, abs=0.01)


def test_gpt_oss_120b_needs_about_61_gb_plus_its_cache() -> None:
    at_060 = lane(model="openai/gpt-oss-120b", memory_fraction=0.6, max_model_len=131072)
    (fitting,) = accepted(at_060)
    need = estimate(fitting, SPARK_GIB)

    assert need.weights_gib == 61  # seed 004
    assert need.kv_cache_gib == 4.5  # 18 full-attention layers x 8 x 64, bf16, 128K
    assert problems(at_060 | {"memory_fraction": 0.55}) == [
        "spark-1: lanes: probe: needs ~69.5 GiB (weights 61 + KV cache 4.5 for 131072 tokens +"
        " 4 overhead) but memory_fraction 0.55 of 121.69 GiB gives 66.9; lower max_model_len to"
        " 55296 or less, or raise memory_fraction to 0.58"
    ]


def test_qwen35_122b_nvfp4_loaded_at_73_gib_fits_a_box_not_a_small_share() -> None:
    big = lane(model="RedHatAI/Qwen3.5-122B-A10B-NVFP4", memory_fraction=0.85, max_model_len=32768)

    assert estimate(accepted(big)[0], SPARK_GIB).weights_gib == 73  # seed 003
    (refusal,) = problems(big | {"memory_fraction": 0.6})
    assert "weights 73 " in refusal and refusal.endswith("raise memory_fraction to 0.64")


def test_qwen3_235b_gptq_is_two_nodes_of_57_64_gib_and_refused_on_one_box() -> None:
    spec = CATALOG["Qwen/Qwen3-235B-A22B-GPTQ-Int4"]
    assert spec.weights_gib / 2 == 57.64  # per node at TP=2 (seed 004)

    (refusal,) = problems(
        lane(model="Qwen/Qwen3-235B-A22B-GPTQ-Int4", memory_fraction=0.9, max_model_len=8192)
    )
    assert refusal.endswith(
        "pick a smaller build, or spread it over the boxes of a cluster with"
        " tensor_parallel_size (a cluster lane)"
    )


def test_coder_next_fp8_does_not_fit_lane_a_share() -> None:
    (refusal,) = problems(lane(model="Qwen/Qwen3-Coder-Next-FP8"))

    assert "weights 85 " in refusal  # FP8 ~75-85 GB (seeds 003/004)
    assert refusal.endswith("raise memory_fraction to 0.75")


def test_an_unknown_model_gives_its_own_sizes() -> None:
    spec = {"weights_gib": 10, "attention_layers": 32, "kv_heads": 8, "head_dim": 128}
    unknown = lane(model="/models/my-finetune", served_name="mine")

    assert problems(unknown) == [
        "spark-1: lanes: probe: /models/my-finetune is not in the model catalog; give its"
        " model_spec = {weights_gib, attention_layers, kv_heads, head_dim, quantization} from its"
        " config.json and the size of its weights"
    ]
    (mine,) = accepted(unknown | {"model_spec": spec | {"quantization": "bf16"}})
    # 2 x 32 layers x 8 heads x 128 x 2 bytes = 128 KiB a token: 8 GiB for 65536 tokens.
    # 10 GiB of weights + 8 GiB of KV cache + 4 GiB of overhead (the project's estimate).
    assert estimate(mine, SPARK_GIB).total_gib == 22


def test_max_model_len_beyond_the_model_is_refused_unless_allowed() -> None:
    long = lane(max_model_len=300000)

    assert problems(long) == [
        "spark-1: lanes: probe: max_model_len 300000 is beyond the model's 262144; lower it to"
        " 262144 or less (vLLM refuses to start)"
    ]
    assert accepted(long | {"environment": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}})


# The budget of a box: fractions, ports, names.


def test_a_total_above_090_is_refused() -> None:
    refusal, guard = problems(
        lane(memory_fraction=0.5), lane(name="b", port=10102, memory_fraction=0.45)
    )

    # 5% of 121.69 GiB left free is also under the memory guard's 8.5 GiB floor
    assert guard.startswith("spark-1: memory_guard_min_available_gib: 8.5 GiB is not below the 6.1")
    assert refusal.startswith(
        "spark-1: lanes: the memory fractions add up to 0.95 (probe 0.5, b 0.45), above 0.9"
    )


def warnings(*lanes: dict[str, Any]) -> tuple[str, ...]:
    return load_from_dicts(merged({"spark-1": {"lanes": list(lanes)}})).warnings


def test_a_total_above_087_is_accepted_with_a_warning() -> None:
    assert warnings(
        lane(memory_fraction=0.45), lane(name="b", port=10102, memory_fraction=0.43)
    ) == (
        # the lone box runs the fleet's router too (group_data: router_memory_gib 1.0):
        # 0.45 + 0.43 + 1 / 121.69 = 0.888218
        "spark-1: lanes: the memory fractions add up to 0.888218 (probe 0.45, b 0.43, the router"
        " 1 GiB), above 0.87: a Spark has ~102 GiB free after boot, a later lane may not start;"
        " a total of 0.87 or less is safe",
    )


def test_the_warning_shows_in_pyinfra_output_before_any_operation(tmp_path: Path) -> None:
    two = [lane(memory_fraction=0.45), lane(name="b", port=10102, memory_fraction=0.43)]

    run = run_pyinfra(tmp_path, {"spark-1": {"lanes": two}})
    output = run.stdout + run.stderr

    assert "spark-1: lanes: the memory fractions add up to 0.88" in output
    assert output.index("add up to 0.88") < output.index("--> Starting operation")


def test_a_lane_fraction_above_090_is_refused() -> None:
    (refusal,) = problems(lane(memory_fraction=0.95))
    assert refusal.startswith("spark-1: lanes: probe: memory_fraction: Input should be less")


def test_ports_and_names_are_unique_and_free_of_other_services() -> None:
    assert problems(lane(), lane(served_name="other")) == [
        "spark-1: lanes: probe and probe share the name probe; give each lane its own",
        "spark-1: lanes: probe and probe share the port 10101; give each lane its own",
    ]
    assert problems(lane(port=6379)) == [
        "spark-1: lanes: probe: port 6379 is Ray's (6379-6385, 8265, 10001, 20000-20999);"
        " pick another port"
    ]
    assert problems(lane(port=80))[0].startswith("spark-1: lanes: probe: port: Input should be")


def test_a_box_may_have_no_lanes() -> None:
    assert accepted() == ()


def test_explicit_priorities_are_kept() -> None:
    low, high = accepted(
        lane(priority=1), lane(name="b", port=10102, memory_fraction=0.4, priority=9)
    )
    assert (low.priority, high.priority) == (1, 9)


# The lane's own keys.


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"image": "nvcr.io/nvidia/vllm:latest"}, "image: 'nvcr.io/nvidia/vllm:latest' moves"),
        ({"image": "nvcr.io/nvidia/vllm"}, "image: 'nvcr.io/nvidia/vllm' is not registry/"),
        ({"model": "./models/local"}, "model: './models/local' is neither"),
        ({"model": "/models/../etc"}, "model: '/models/../etc' is neither"),
        ({"served_name": "two words"}, "served_name: 'two words' is not a model name"),
        ({"kv_cache_dtype": "fp9"}, "'fp9' is not a vLLM 0.19.0 choice (did you mean fp8?)"),
        ({"tool_call_parser": "qwen3"}, "'qwen3' is not a vLLM 0.19.0 choice (did you mean"),
        ({"max_model_len": 512}, "max_model_len: Input should be greater than or equal to 1024"),
        ({"api_key": "yes"}, "api_key: Input should be a valid boolean"),
        ({"memory_fractoin": 0.4}, "memory_fractoin: unknown key; did you mean memory_fraction?"),
    ],
)
def test_bad_lane_keys_are_refused_naming_the_key(changes: dict[str, Any], expected: str) -> None:
    found = problems(lane(**changes))
    assert any(expected in line for line in found), found


def test_image_digests_and_registry_ports_are_fine() -> None:
    digest = "@sha256:" + 64 * "a"
    mirror = "registry.local:5000/team/vllm:26.04-py3" + digest
    assert accepted(lane(image=mirror, vllm_version="0.19.0"))
    assert accepted(lane(image="nvcr.io/nvidia/vllm:26.04-py3" + digest))


def test_a_lane_without_a_usable_name_is_named_by_its_place() -> None:
    found = problems(lane(name="Coder"))
    assert found == [
        "spark-1: lanes: #1: name: 'Coder' is not a slug; use 1..32 of a-z 0-9 - (e.g. coder)"
    ]


def test_a_missing_lane_key_says_where_to_set_it() -> None:
    without = {key: value for key, value in PROBE.items() if key != "max_model_len"}
    assert problems(without) == [
        "spark-1: lanes: probe: max_model_len: missing; set it in the lane (the longest request"
        " in tokens (1024..10M); clients need >= 65536)"
    ]


def test_a_model_spec_is_checked_key_by_key() -> None:
    found = problems(
        lane(model="/models/mine", model_spec=LLAMA_NVFP4_SPEC | {"weights_gb": 4, "kv_heads": 0})
    )
    assert found == [
        "spark-1: lanes: probe: model_spec: kv_heads: Input should be greater than or equal to 1"
        " (got 0); allowed: num_key_value_heads of config.json",
        "spark-1: lanes: probe: model_spec: weights_gb: unknown key; did you mean weights_gib?",
    ]


# extra_args, against vLLM 0.19.0's option list.


def test_extra_args_are_read_as_vllm_reads_them() -> None:
    options, found = parse_options(
        ["--max_num_seqs", "4", "--swap-space=-1", "--no-enable-prefix-caching", "--seed", "-7"]
    )
    assert found == [
        "--swap-space is no option of vLLM 0.19.0's `vllm serve`; see `vllm serve --help`"
    ]
    assert options == [
        ("--max-num-seqs", "4"),
        ("--no-enable-prefix-caching", True),
        ("--seed", "-7"),
    ]


@pytest.mark.parametrize(
    ("extra_args", "expected"),
    [
        (["--max-num-seq", "4"], "--max-num-seq is no option of vLLM 0.19.0's `vllm serve` (did"
                                 " you mean --max-num-seqs?)"),
        (["-O3"], "'-O3' is no long option"),
        (["--port", "9000"], "--port comes from the lane; set port"),
        (["--no-enable-auto-tool-choice"], "--no-enable-auto-tool-choice comes from the lane;"
                                            " set tool_call_parser"),
        (["--host", "0.0.0.0"], "--host is refused: vLLM listens on 127.0.0.1 behind the box's"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size comes from the lane; set"),
        (["--nnodes", "2"], "--nnodes comes from the lane; set tensor_parallel_size and executor"),
        (["--distributed-executor-backend", "ray"], "--distributed-executor-backend comes from"),
        (["--config", "serve.yaml"], "--config is refused: a config file would hide"),
        (["--enforce-eager=true"], "--enforce-eager takes no value; drop =true"),
        (["--max-num-seqs"], "--max-num-seqs needs a value"),
        (["--moe-backend", "cutlas"], "--moe-backend 'cutlas' is no choice of vLLM 0.19.0 (did"
                                      " you mean cutlass?)"),
    ],
)  # fmt: skip
def test_bad_extra_args_are_refused(extra_args: list[str], expected: str) -> None:
    found = problems(lane(extra_args=extra_args))
    assert any(f"spark-1: lanes: probe: extra_args: {expected}" in line for line in found), found


def test_line_breaks_in_extra_args_are_refused_without_reading_further() -> None:
    # An argv item with a line break would split the unit file that carries it.
    assert parse_options(["--chat-template", "{{ x }}\nExecStartPre=/bin/true"]) == (
        [],
        ["item 2 has a line break or NUL; remove it"],
    )


def test_an_api_key_in_extra_args_is_refused_and_never_shown() -> None:
    found = problems(lane(extra_args=["--api-key", "sk-sentinel-4711"]))

    assert len(found) == 1 and "--api-key is refused: a secret in argv" in found[0]
    assert "sk-sentinel-4711" not in "".join(found)


# environment, against vLLM 0.19.0's variables.


def test_library_variables_pass() -> None:
    ours = {"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": "1", "PYTORCH_CUDA_ALLOC_CONF": "x:1"}
    (probe,) = accepted(lane(environment=ours))
    assert probe.container_env() == ours


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"VLLM_NVFP4_GEMM_BACKEN": "marlin"}, "'VLLM_NVFP4_GEMM_BACKEN' is no variable vLLM 0.19.0"
                                               " reads (did you mean VLLM_NVFP4_GEMM_BACKEND?)"),
        ({"MY_SETTING": "1"}, "'MY_SETTING' is no variable vLLM 0.19.0 reads"),
        ({"HF_HUB_OFFLINE": "1\nHF_TOKEN=x"}, "HF_HUB_OFFLINE: its value has a line break or NUL"),
        ({"VLLM_LOGGING_LEVEL": 10}, "VLLM_LOGGING_LEVEL: Input should be a valid string"),
    ],
)  # fmt: skip
def test_bad_environment_is_refused(environment: dict[str, Any], expected: str) -> None:
    found = problems(lane(environment=environment))
    assert any(expected in line for line in found), found


@pytest.mark.parametrize("name", ["HF_TOKEN", "VLLM_API_KEY", "HUGGING_FACE_HUB_TOKEN"])
def test_secrets_in_the_environment_are_refused_and_never_shown(name: str) -> None:
    found = problems(lane(environment={name: "sentinel-4711"}))

    assert found == [
        f"spark-1: lanes: probe: environment: {name} is a secret: here it would show in `docker"
        " inspect` and the unit; the API key is generated on the box (api_key = True), a token"
        " goes in a root-only file on the box"
    ]


def test_a_cluster_lane_adds_tensor_parallelism_over_ray_and_counts_one_boxs_share() -> None:
    big = Lane.model_validate(
        {
            "name": "big",
            "image": "nvcr.io/nvidia/vllm:26.04-py3",
            "model": "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
            "served_name": "big",
            "port": 10103,
            "memory_fraction": 0.87,
            "max_model_len": 40960,
            "kv_cache_dtype": "fp8",
            "tensor_parallel_size": 2,
        }
    )
    args = serve_args(big)
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"
    need = estimate(big, 121.69)
    assert need.weights_gib == 57.64  # seed 004: per node at TP=2
    assert need.fits
    single = big.model_copy(update={"tensor_parallel_size": 1})
    assert "--tensor-parallel-size" not in serve_args(single)


def test_every_catalog_entry_names_its_source() -> None:
    entries = json.loads((DATA / "model-catalog.json").read_text())["models"]
    assert list(CATALOG) == list(entries)
    assert all(entry["source"].strip() for entry in entries.values())
    # The 235B model at TP=2: seed 004's 57.64 GiB per node, twice over.
    assert CATALOG["Qwen/Qwen3-235B-A22B-GPTQ-Int4"].weights_gib == pytest.approx(2 * 57.64)


def test_matching_and_refused_report_the_problem_under_the_field() -> None:
    class Named(BaseModel):
        name: Annotated[str, matching(re.compile("[a-z]+"), "{!r} is no name")]

    assert Named(name="ab").name == "ab"
    with pytest.raises(ValidationError) as error:
        Named(name="A b")
    assert error.value.errors()[0]["loc"] == ("name",)
    assert str(error.value.errors()[0]["ctx"]["error"]) == "'A b' is no name"
    assert refused(3, []) == 3
    with pytest.raises(ValueError, match=r"^one\ntwo$"):
        refused(3, ["one", "two"])


# Option values, read as vLLM 0.19.0's parser reads them (spark/data/*-option-values.json).


def test_a_typed_option_refuses_what_its_parser_would():
    assert problems(lane(extra_args=["--max-num-seqs", "8; touch x"])) == [
        "spark-1: lanes: probe: extra_args: --max-num-seqs '8; touch x' is not an integer; give one"
    ]
    assert accepted(lane(extra_args=["--max-num-seqs", "8"]))


def test_options_of_several_values_json_and_human_integers():
    several = ["--cudagraph-capture-sizes", "1", "2", "4", "--max-num-batched-tokens", "8k"]
    (probe,) = accepted(lane(extra_args=several))
    assert probe.option("--cudagraph-capture-sizes") == "1 2 4"
    assert accepted(lane(extra_args=['--compilation-config={"cudagraph_capture_sizes": [1]}']))
    refused = problems(lane(extra_args=["--compilation-config", "3"]))
    assert refused == [
        "spark-1: lanes: probe: extra_args: --compilation-config '3' is not a JSON object,"
        " e.g. '{\"key\": 1}'; give one"
    ]
    assert problems(lane(extra_args=["--cudagraph-capture-sizes", "1", "two"])) == [
        "spark-1: lanes: probe: extra_args: --cudagraph-capture-sizes 'two' is not an integer;"
        " give one"
    ]


def test_flashinfer_moe_is_refused_by_variable_too():
    (refusal,) = problems(lane(environment={"VLLM_USE_FLASHINFER_MOE_FP8": "1"}))
    assert "FlashInfer's MoE kernels are absent on SM121" in refusal
    assert "(seed 001)" in refusal
    assert accepted(lane(environment={"VLLM_USE_FLASHINFER_MOE_FP8": "0"}))


def test_a_context_agents_refuse_is_warned_not_refused() -> None:
    assert accepted(lane(max_model_len=32768))
    assert warnings(lane(max_model_len=32768)) == (
        "spark-1: lanes: probe: max_model_len 32768 is below 65536: agent clients refuse it"
        " (Hermes Agent needs 64K, seed 003); raise it to serve them",
    )


def test_a_plaintext_key_given_as_api_key_is_never_shown():
    (refusal,) = problems(lane(api_key="sk-SENTINEL-0123456789"))
    assert refusal.startswith("spark-1: lanes: probe: api_key: Input should be a valid boolean")
    assert "not shown: it may be a secret" in refusal
    assert "SENTINEL" not in refusal


# Lanes follow their image's vLLM release (spark/vllm_release.py).

ON_2610 = {"image": "nvcr.io/nvidia/vllm:26.10-py3"}


def nvfp4_lane(**changes: Any) -> dict[str, Any]:
    return lane(model=NVFP4, memory_fraction=0.35, **changes)


def rule(name: str) -> Any:
    return next(rule for rule in SM121_RULES if rule.name == name)


def test_an_option_new_in_0310_is_refused_on_2604_and_accepted_on_2610() -> None:
    new = ["--enable-nccl-comm-suspend"]
    found = problems(lane(extra_args=new))
    assert found[0].startswith(
        "spark-1: lanes: probe: extra_args: --enable-nccl-comm-suspend is no option of"
        " vLLM 0.19.0's `vllm serve`"
    ), found
    (probe,) = accepted(lane(extra_args=new, **ON_2610))
    assert serve_args(probe)[-1] == "--enable-nccl-comm-suspend"


def test_nvfp4_is_kept_on_marlin_in_each_releases_own_terms() -> None:
    (on_2604,) = accepted(nvfp4_lane())
    assert on_2604.container_env() == {"VLLM_NVFP4_GEMM_BACKEND": "marlin"}
    assert "--linear-backend" not in serve_args(on_2604)

    (on_2610,) = accepted(nvfp4_lane(**ON_2610))
    assert on_2610.container_env() == {}
    args = serve_args(on_2610)
    assert args[args.index("--linear-backend") + 1] == "marlin"


def test_the_retired_gemm_variable_is_refused_on_2610_naming_the_option_instead() -> None:
    found = problems(nvfp4_lane(environment={"VLLM_NVFP4_GEMM_BACKEND": "marlin"}, **ON_2610))
    assert (
        "spark-1: lanes: probe: environment: 'VLLM_NVFP4_GEMM_BACKEND' is no variable vLLM"
        " 0.31.0 reads (vLLM 0.20.1 did; vLLM 0.31.0 warns and ignores it; it chooses that with"
        " --linear-backend); use one of vLLM's or a"
    ) in " ".join(found), found


def test_cutlass_fp4_is_refused_in_0310s_terms() -> None:
    found = problems(nvfp4_lane(extra_args=["--linear-backend", "flashinfer_cutlass"], **ON_2610))
    assert found == [
        "spark-1: lanes: probe: CUTLASS FP4 (an NVFP4 GEMM backend other than --linear-backend"
        " marlin; --moe-backend cutlass or flashinfer_cutlass on an NVFP4 checkpoint) is"
        " refused: silent garbage on SM121, which lacks the TMEM it needs; leave both out: the"
        " lane sets --linear-backend marlin for NVFP4 (seed 003; seed 004, seen on vLLM 0.20.1;"
        " no source says vLLM 0.31.0 fixed it)"
    ]
    assert accepted(nvfp4_lane(extra_args=["--linear-backend", "marlin"], **ON_2610))


def test_a_rule_says_which_release_its_source_saw_on_a_later_one() -> None:
    eager = lane(extra_args=["--enforce-eager"])
    (on_2604,) = problems(eager)
    assert on_2604.endswith("(seed 001)"), on_2604
    (on_2610,) = problems(eager | ON_2610)
    assert on_2610.endswith(
        "(seed 001, seen on vLLM 0.19.0; no source says vLLM 0.31.0 fixed it)"
    ), on_2610


@pytest.mark.parametrize(
    ("extra_args", "graphs_off"),
    [
        (["--compilation-config", '{"cudagraph_mode": "NONE"}'], True),
        (["--compilation-config", '{"cudagraph_mode": "none"}'], True),
        (["--compilation-config", '{"mode": 0}'], True),
        (["--compilation-config", '{"level": 0}'], True),
        (["--compilation-config", '{"mode": 2}'], True),  # not VLLM_COMPILE: graphs overridden
        (["--compilation-config", '{"mode": "NONE", "cudagraph_mode": "FULL"}'], False),
        (["--compilation-config", '{"mode": 3}'], False),
        (["--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'], False),
        (["--compilation-config", '{"max_cudagraph_capture_size": 0}'], True),
        (["--compilation-config", '{"cudagraph_capture_sizes": []}'], True),
        (["--optimization-level", "0"], True),
        (["--optimization-level", "O0"], True),
        (["--optimization-level", "3"], False),
        (["--max-cudagraph-capture-size", "0"], True),
        (["--max-cudagraph-capture-size", "2048"], False),
    ],
)
def test_cuda_graphs_turned_off_any_way_are_refused_like_enforce_eager(
    extra_args: list[str], graphs_off: bool
) -> None:
    expected = ["spark-1: lanes: probe: " + EXPECTED_REFUSALS["enforce-eager"]]
    assert problems(lane(extra_args=extra_args)) == (expected if graphs_off else [])


# Seed 004's cluster lane, over two boxes.
CLUSTER_PROBE = lane(
    model="Qwen/Qwen3-235B-A22B-GPTQ-Int4",
    memory_fraction=0.87,
    max_model_len=40960,
    kv_cache_dtype="fp8",
    tensor_parallel_size=2,
)


def test_a_cluster_lane_on_ray_and_ray_need_an_image_with_ray() -> None:
    without = "nvcr.io/nvidia/vllm:26.05-py3"
    big = CLUSTER_PROBE | {"image": without}
    refusal = (
        f"{without} carries no Ray (NVIDIA/dgx-spark-playbooks#109); a cluster on Ray needs"
        " nvcr.io/nvidia/vllm:26.04-py3, or a cluster lane with executor mp"
    )
    assert f"spark-1: lanes: probe: executor: ray: {refusal}" in problems(big | {"executor": "ray"})
    # Left out, the executor follows the image: mp where it has no Ray.
    assert not [p for p in problems(big) if "executor" in p or "Ray" in p], problems(big)
    assert problems(ray_image=without) == [f"spark-1: ray_image: {refusal}"]


def test_the_executor_follows_the_image_unless_given() -> None:
    big = CLUSTER_PROBE
    with_ray, without = "nvcr.io/nvidia/vllm:26.04-py3", "nvcr.io/nvidia/vllm:26.10-py3"
    executors = {
        (image, given): Lane.model_validate(big | {"image": image, "executor": given})
        for image in (with_ray, without)
        for given in (None, "mp")
    }
    assert {key: value.cluster_executor for key, value in executors.items()} == {
        (with_ray, None): "ray",
        (with_ray, "mp"): "mp",
        (without, None): "mp",
        (without, "mp"): "mp",
    }
    assert Lane.model_validate(PROBE).cluster_executor is None  # a lane of one box
    assert problems(lane(executor="mp")) == [
        "spark-1: lanes: probe: executor: mp is for a cluster lane; set tensor_parallel_size to"
        " the number of boxes, or leave executor out"
    ]


def test_an_mp_rank_gets_vllms_multinode_options_and_the_others_headless() -> None:
    big = Lane.model_validate(CLUSTER_PROBE | {"image": "nvcr.io/nvidia/vllm:26.10-py3"})
    common = [
        "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp", "--nnodes", "2",
    ]  # fmt: skip
    head = serve_args(big, MpRank(0, "192.168.100.10"))
    worker = serve_args(big, MpRank(1, "192.168.100.10"))
    place = ["--master-addr", "192.168.100.10", "--master-port", "29501"]
    for args, rank in ((head, "0"), (worker, "1")):
        start = args.index("--tensor-parallel-size")
        assert args[start : start + 12] == [*common, "--node-rank", rank, *place]
    assert "--headless" in worker and "--headless" not in head
    with pytest.raises(ValueError, match="a cluster lane on executor mp needs its rank"):
        serve_args(big)

"""spark/engines/: each engine a record the lane, the planner and the operations ask, and the plan
holding every line a lane's unit renders (its command line, container environment, timeouts and
the canary's causes).

The command lines are written here from the engines' own option tables (spark/data: vLLM
0.19.0's `vllm serve` options, the release NGC's 26.04 image carries, seed 004; llama.cpp
0c1e57098's llama-server options, read from its common/arg.cpp) and the field's settings each
names, never read back from the planner.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from spark.engines import ENGINES
from spark.inventory import load_from_dicts
from spark.lane import Lane
from spark.plan import BoxPlan, plan
from spark.vllm_release import DATA
from stages.show_plan import box_text
from tests.unit.test_config import TWO_SPARKS, merged
from tests.unit.test_llamacpp import SEED_002

# group_data's lane A (seed 003) on the head of two boxes, its defaults: lane_start_timeout_min 20.
CODER_ARGV = [
    "vllm", "serve", "bullpoint/Qwen3-Coder-Next-AWQ-4bit",
    "--served-model-name", "qwen3-coder-next",
    "--host", "127.0.0.1",  # behind the box's front (vLLM's security guide)
    "--port", "11101",  # loopback_port: port 10101 + 1000
    "--gpu-memory-utilization", "0.45",  # memory_fraction (seed 003)
    "--max-model-len", "131072",
    "--tool-call-parser", "qwen3_coder", "--enable-auto-tool-choice",
    "--attention-backend", "TRITON_ATTN",  # SM121's addition (seed 003, seed 004)
    "--generation-config", "vllm",  # a Qwen3 model's (seed 003)
]  # fmt: skip
# Seed 002's lane: llama-server with the field's settings for the GB10, its model read from
# the snapshot as the container starts (LLAMA_ARG_MODEL), its key from LLAMA_API_KEY.
GGUF_ARGV = [
    "/app/llama-server",  # the image's ENTRYPOINT (ardge-labs/llama-cpp-dgx-spark's Dockerfile)
    "--alias", "qwen3-coder-next-gguf",
    "--host", "127.0.0.1",
    "--port", "11103",
    "--ctx-size", "131072",
    "--parallel", "1",  # one slot (seed 002)
    "--cache-type-k", "q8_0", "--cache-type-v", "q8_0",  # seed 003
    "--n-gpu-layers", "99", "--fit", "off",  # every layer on the GPU (seed 002)
    "--jinja",  # seed 002
    "--threads", "10",  # the Grace CPU's performance cores (seed 003)
    "--metrics",  # llama.cpp's server README: off by default
]  # fmt: skip


def box(hosts: dict[str, dict[str, Any]], name: str = "spark-1") -> BoxPlan:
    return plan(load_from_dicts(merged(hosts))).box(name)


def test_the_plan_holds_a_vllm_lanes_command_line_environment_and_timeouts() -> None:
    coder = box(TWO_SPARKS).lanes[0].served
    assert list(coder.argv) == CODER_ARGV
    assert coder.key_variable == "VLLM_API_KEY"  # vLLM's own variable for its key, never argv
    assert coder.model_at_start is None and not coder.replaces_entrypoint
    # The cluster's environment (group_data's pair), offline (weights land before the start).
    assert coder.variables["HF_HUB_OFFLINE"] == "1"
    assert coder.variables["VLLM_HOST_IP"] == "192.168.100.10"
    # 20 minutes; /health 30 s before it; Ray's nodes in half of it.
    assert (coder.timeouts.start_s, coder.timeouts.health_s, coder.timeouts.nodes_wait_s) == (
        1200,
        1170,
        600,
    )
    assert coder.health_path == "/health"
    assert coder.canary_causes is not None
    assert "Qwen3 models need --generation-config vllm" in coder.canary_causes[0]


def test_the_plan_holds_a_llama_cpp_lanes_command_line() -> None:
    gguf = box({"spark-1": {"lanes": [SEED_002]}}).lanes[0].served
    assert list(gguf.argv) == GGUF_ARGV
    assert gguf.key_variable == "LLAMA_API_KEY"  # common/arg.cpp: --api-key's variable
    assert gguf.replaces_entrypoint
    assert gguf.model_at_start is not None
    assert (gguf.model_at_start.variable, gguf.model_at_start.file) == (
        "LLAMA_ARG_MODEL",  # common/arg.cpp: --model's variable
        "Qwen3-Coder-Next-UD-Q4_K_XL.gguf",
    )
    assert gguf.model_at_start.repo == (
        "/root/.cache/huggingface/hub/models--unsloth--Qwen3-Coder-Next-GGUF"
    )
    assert "LLAMA_API_KEY" not in gguf.variables and "VLLM_API_KEY" not in gguf.variables


def test_every_option_of_the_command_lines_is_one_of_the_engines_own() -> None:
    vllm = json.loads((DATA / "vllm-0.19.0-serve-options.json").read_text())["options"]
    llama = json.loads((DATA / "llama.cpp-0c1e57098-server-options.json").read_text())
    llama_names = {name for row in llama["options"] for name in row["names"]}
    assert [arg for arg in CODER_ARGV[3:] if arg.startswith("--") and arg not in vllm] == []
    assert [arg for arg in GGUF_ARGV[1:] if arg.startswith("--") and arg not in llama_names] == []


def test_a_lane_without_key_or_canary_has_neither_in_its_plan() -> None:
    lanes = [{"api_key": False, "canary": False} | SEED_002]
    gguf = box({"spark-1": {"lanes": lanes}}).lanes[0].served
    assert gguf.key_variable is None and gguf.canary_causes is None


def test_the_registry_names_each_engine_once_and_a_lane_refuses_another() -> None:
    assert {name: engine.name for name, engine in ENGINES.items()} == {
        "vllm": "vllm",
        "llama.cpp": "llama.cpp",
    }
    with pytest.raises(ValidationError, match=re.escape("Input should be 'vllm' or 'llama.cpp'")):
        Lane.model_validate(SEED_002 | {"engine": "sglang"})


def test_make_plan_shows_the_command_line_each_lane_runs() -> None:
    shown = box_text(box({"spark-1": {"lanes": [SEED_002]}}))
    assert (
        "runs  /app/llama-server --alias qwen3-coder-next-gguf --host 127.0.0.1 --port 11103"
        " --ctx-size 131072 --parallel 1 --cache-type-k q8_0 --cache-type-v q8_0"
        " --n-gpu-layers 99 --fit off --jinja --threads 10 --metrics\n"
    ) in shown
    assert "LLAMA_ARG_MODEL: Qwen3-Coder-Next-UD-Q4_K_XL.gguf of the snapshot under" in shown
    assert "key in LLAMA_API_KEY, read from its file at the start" in shown
    assert "start within 1200 s, /health within 1170 s; canary on" in shown

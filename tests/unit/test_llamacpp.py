"""spark/llamacpp.py and a llama.cpp lane (issue 16): its settings read as llama.cpp's own
parser reads them (the option list of the commit the data file holds, read from that commit's
common/arg.cpp), the field's defaults, the refusals, the memory estimate, and how spark/inventory/
reports them before any host is contacted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from operations import lanes
from spark import llamacpp
from spark.catalog import CATALOG
from spark.engines.llamacpp import server_args
from spark.engines.record import ModelAtStart
from spark.lane import Lane
from spark.llamacpp_release import DEFAULT_COMMIT
from spark.memory import estimate
from spark.plan import served_lane

from .test_recipes import SPARK_GIB, accepted, lane, problems

COMMIT = DEFAULT_COMMIT
# Seed 002's lane: Unsloth's UD-Q4_K_XL GGUF of Qwen3-Coder-Next in the ardge-labs image, 131K
# context in one slot; its share of the box here is this test's choice.
SEED_002 = {
    "name": "gguf",
    "engine": "llama.cpp",
    "image": llamacpp.FIELD_IMAGE,
    "model": "unsloth/Qwen3-Coder-Next-GGUF",
    "gguf_file": "Qwen3-Coder-Next-UD-Q4_K_XL.gguf",
    "served_name": "qwen3-coder-next-gguf",
    "port": 10103,
    "memory_fraction": 0.45,
    "max_model_len": 131072,
}


def gguf(**changes: Any) -> dict[str, Any]:
    return SEED_002 | changes


def test_seed_002s_lane_runs_llama_server_with_the_fields_settings() -> None:
    # 0.44 + 0.45 and the router's 1 GiB of the lone box (group_data): 0.898218, under 0.9
    (coder, served) = accepted(lane(memory_fraction=0.44), gguf())
    assert served.engine == "llama.cpp"
    assert server_args(served) == [
        "--alias", "qwen3-coder-next-gguf",
        "--host", "127.0.0.1",
        "--port", "11103",  # behind the front, as a vLLM lane
        "--ctx-size", "131072",
        "--parallel", "1",  # seed 002
        "--cache-type-k", "q8_0", "--cache-type-v", "q8_0",  # seed 003
        "--n-gpu-layers", "99", "--fit", "off",  # seed 002
        "--jinja",  # seed 002
        "--threads", "10",  # seed 003
        "--metrics",  # served behind the metrics key (llama.cpp's server README: off by default)
    ]  # fmt: skip
    assert served.container_env() == {}  # no SM121 addition of vLLM's
    assert served.weight_files == ("Qwen3-Coder-Next-UD-Q4_K_XL.gguf",)
    assert coder.weight_files == ()


def test_extra_args_replace_a_default_and_keep_llama_cpps_names() -> None:
    (served,) = accepted(gguf(extra_args=["-ngl", "80", "--no-jinja", "--temp", "1.0"], slots=2))
    args = server_args(served)
    assert "--n-gpu-layers" not in args and "--jinja" not in args
    assert args[args.index("--parallel") + 1] == "2"
    assert args[-5:] == ["-ngl", "80", "--no-jinja", "--temp", "1.0"]
    assert args[args.index("--threads") + 1] == "10"


def test_the_memory_estimate_is_the_files_size_and_a_q8_0_cache_of_the_context() -> None:
    (served,) = accepted(gguf())
    need = estimate(served, SPARK_GIB)
    assert need.weights_gib == CATALOG[served.catalog_key].weights_gib == 46.2
    # 12 full-attention layers x 2 KV heads x 256 x (K and V) x 34/32 bytes x 131072 tokens
    assert need.kv_cache_gib == pytest.approx(2 * 12 * 2 * 256 * 34 / 32 * 131072 / 2**30)
    assert need.fits
    (f16,) = accepted(gguf(kv_cache_dtype="f16"))
    f16_gib = estimate(f16, SPARK_GIB).kv_cache_gib
    assert f16_gib == pytest.approx(2 * need.kv_cache_gib * 16 / 17)
    too_small = problems(gguf(memory_fraction=0.35))
    assert len(too_small) == 1 and "gguf" in too_small[0] and "GiB" in too_small[0], too_small


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"extra_args": ["--api-key", "x"]}, "--api-key is refused: a secret in argv"),
        ({"extra_args": ["--host", "0.0.0.0"]}, "--host is refused"),
        ({"extra_args": ["-c", "4096"]}, "-c comes from the lane; set max_model_len"),
        ({"extra_args": ["-np", "4"]}, "-np comes from the lane; set slots"),
        ({"extra_args": ["-ctk", "f16"]}, "-ctk comes from the lane; set kv_cache_dtype"),
        ({"extra_args": ["-md", "/m/draft.gguf"]}, "-md is refused: speculative decoding"),
        # Qwen3-Coder-Next: 48 blocks and the output layer, 49 (seed 002: "34/49 layers");
        # 40 on the GPU leaves 9 to the CPU, which on unified memory frees nothing (unsloth
        # PR 9872: a spill cost 83.7% of decode on a DGX Spark).
        ({"extra_args": ["-ngl", "40"]}, "-ngl 40 is refused: it keeps 9 of the model's 49"),
        ({"extra_args": ["--n-gpu-layers", "48"]}, "it keeps 1 of the model's 49 layers"),
        ({"extra_args": ["--fit", "on"]}, "--fit on is refused: llama.cpp's fitter misjudges"),
        ({"extra_args": ["-hf", "org/x"]}, "-hf is refused: the deploy fetches"),
        ({"extra_args": ["--ctx-size=4096"]}, "llama.cpp takes no --name=value"),
        ({"extra_args": ["--no-such-thing"]}, "--no-such-thing is no option of llama.cpp"),
        ({"extra_args": ["--threads"]}, "--threads needs N after it"),
        ({"extra_args": ["--prompt", "hi"]}, "--prompt is no option"),  # llama-cli's only
        ({"environment": {"LLAMA_ARG_HOST": "0.0.0.0"}}, "LLAMA_ARG_HOST"),
        ({"environment": {"LLAMA_API_KEY": "x"}}, "LLAMA_API_KEY"),
        ({"kv_cache_dtype": "fp8"}, "'fp8' is no llama.cpp cache type"),
        ({"gguf_file": None}, "gguf_file: a llama.cpp lane serves one GGUF file"),
        ({"gguf_file": "../x.gguf"}, "is no path of a .gguf file"),
        ({"gguf_file": "model.bin"}, "is no path of a .gguf file"),
        ({"model": "/srv/models/coder"}, "is no Hugging Face id; a llama.cpp lane"),
        ({"tool_call_parser": "qwen3_coder"}, "tool_call_parser: is vLLM's"),
        ({"vllm_version": "0.19.0"}, "vllm_version: is vLLM's"),
        ({"tensor_parallel_size": 2}, "a llama.cpp lane runs on its own box"),
        ({"llama_cpp_commit": "b9999"}, "no option list is held for llama.cpp 'b9999'"),
        ({"gguf_file": "other.gguf"}, "is not in the model catalog"),
    ],
)
def test_refused_before_contact_naming_host_lane_and_field(changes: dict, says: str) -> None:
    found = problems(gguf(**changes))
    assert any(says in line for line in found), found
    assert all(line.startswith("spark-1: lanes: gguf: ") for line in found), found


@pytest.mark.parametrize(
    "extra_args",
    [
        ["--n-gpu-layers", "all"],
        ["-ngl", "49"],  # every block and the output layer
        ["-ngl", "99"],  # seed 002's
        ["-ngl", "auto"],  # with the lane's --fit off: llama.cpp places every layer
        ["--fit", "off"],
    ],
)
def test_every_layer_on_the_gpu_is_accepted(extra_args: list[str]) -> None:
    assert problems(gguf(extra_args=extra_args)) == []


def test_a_model_of_unknown_blocks_is_not_checked_for_its_gpu_layers() -> None:
    assert llamacpp.problems(["-ngl", "40"], {}, None, COMMIT, None) == []
    assert (
        CATALOG["unsloth/Qwen3-Coder-Next-GGUF/Qwen3-Coder-Next-UD-Q4_K_XL.gguf"].layers == 48
    )  # Qwen3-Next's 48 layers (the catalog entry's source)


def test_a_vllm_lane_takes_no_gguf_settings() -> None:
    found = problems(lane(gguf_file="x.gguf"))
    assert any("are for engine llama.cpp" in line for line in found), found


def test_parse_reads_flags_negatives_and_values_as_llama_cpp_does() -> None:
    tokens = ["--no-jinja", "--temp", "0.7", "--top_k", "40", "-fa", "on"]
    found, trouble = llamacpp.parse(tokens, COMMIT)
    assert trouble == []
    assert found == [("--no-jinja", None), ("--temp", "0.7"), ("--top-k", "40"), ("-fa", "on")]


def test_split_ggufs_name_every_part() -> None:
    assert llamacpp.split_parts("Q8_0/m-00001-of-00003.gguf") == [
        "Q8_0/m-00001-of-00003.gguf",
        "Q8_0/m-00002-of-00003.gguf",
        "Q8_0/m-00003-of-00003.gguf",
    ]
    assert llamacpp.split_parts("m.gguf") == ["m.gguf"]


def test_the_unit_runs_the_images_server_from_a_shell_with_the_snapshots_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (served,) = accepted(gguf())
    unit = served_lane(served, environment={}, start_timeout_s=1200)
    run = lanes.docker_run(unit, rdma=False, unlimited_memlock=False)
    image = run.index(llamacpp.FIELD_IMAGE)
    # The image's ENTRYPOINT is /app/llama-server itself: the shell replaces it.
    assert run[image - 2 : image] == ["--entrypoint", "/bin/sh"] and run[image + 1] == "-c"
    # The script, run: the key into LLAMA_API_KEY, the GGUF of the snapshot refs/main names.
    key = tmp_path / "api-key"
    key.write_text("s3cret")
    monkeypatch.setattr(lanes, "KEY_IN_CONTAINER", str(key))
    repo = tmp_path / "models--unsloth--Qwen3-Coder-Next-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs/main").write_text("abc123")
    server = tmp_path / "llama-server"
    server.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "print(json.dumps([sys.argv[1:], os.environ.get('LLAMA_API_KEY'),"
        " os.environ.get('LLAMA_ARG_MODEL')]))\n"
    )
    server.chmod(0o755)
    monkeypatch.setattr(llamacpp, "SERVER", str(server))
    snapshot = ModelAtStart(llamacpp.MODEL_VARIABLE, str(repo), "Qwen3-Coder-Next.gguf")
    script = lanes.serve_script(served.argv(), llamacpp.KEY_VARIABLE, snapshot)
    assert "s3cret" not in script
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    args, api_key, model = json.loads(result.stdout)
    assert (args, api_key) == (server_args(served), "s3cret")
    assert model == f"{repo}/snapshots/abc123/Qwen3-Coder-Next.gguf"
    (repo / "refs/main").unlink()  # no revision: the container stops instead of guessing
    failed = subprocess.run(["sh", "-c", script], capture_output=True)
    assert failed.returncode == 1


def test_the_canary_names_llama_cpps_usual_causes() -> None:
    (served,) = accepted(gguf())
    causes = served.engine_record.canary_causes(served)
    assert causes == llamacpp.CANARY_CAUSES
    assert any("#19324" in cause for cause in causes)


def test_a_lane_model_validates_on_its_own() -> None:
    served = Lane.model_validate(SEED_002)
    assert served.catalog_key == "unsloth/Qwen3-Coder-Next-GGUF/Qwen3-Coder-Next-UD-Q4_K_XL.gguf"
    assert served.spec is not None and served.spec.quantization == "gguf"

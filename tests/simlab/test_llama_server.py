"""The llama.cpp image's `llama-server` stand-in, on this machine (loopback only, no lab).

It runs with this machine's python on 127.0.0.1 and a free port, against the option list of
operations/data/ and a GGUF-looking file written here; every server is stopped within the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark.llamacpp_release import DATA
from tests.simlab.loopback import Server, Servers, free_port, request
from tests.simlab.serving import llama_server_standin as standin
from tests.simlab.serving.standin_model import ANSWER_FILE
from tests.simlab.test_rootfs import unpacked_layers

STANDIN = Path(standin.__file__)
COMMIT, TABLE = standin.read_options(DATA)
CANARY_QUESTION = "What is 2 + 40? Answer with the number and then the word harbor."


def standin_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
    return {**env, "SIMLAB_LLAMA_SHARE": str(DATA), "SIMLAB_LLAMA_LOAD_SECONDS": "0.2", **extra}


def run_server(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(STANDIN), *args],
        capture_output=True, text=True, timeout=30, env=standin_env(**env), check=False,
    )  # fmt: skip


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A file llama.cpp's GGUF reader would open: GGUF's magic, then 1 MiB of nothing."""
    path = tmp_path / "snapshot" / "model-Q4_K_M.gguf"
    path.parent.mkdir()
    with path.open("wb") as out:
        out.write(b"GGUF")
        out.truncate(2**20)
    return path


@pytest.fixture
def start(tmp_path: Path, model: Path) -> Iterator[Callable[..., Server]]:
    """Start `llama-server -m MODEL --host 127.0.0.1 --port P ARGS`; stopped afterwards."""
    servers = Servers(tmp_path, "llama-server")

    def _start(*args: str, wait: bool = True, **env: str) -> Server:
        def command(port: int) -> list[str]:
            return [sys.executable, str(STANDIN), "-m", str(model), "--host", "127.0.0.1",
                    "--port", str(port), *args]  # fmt: skip

        return servers.start(command, standin_env(**env), wait)

    yield _start
    servers.stop()


# --- the command line -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--foo"], "error: invalid argument: --foo"),
        (["my-model.gguf"], "error: invalid argument: my-model.gguf"),  # no positional model
        (["--ctx-size=4096"], "error: invalid argument: --ctx-size=4096"),  # no --x=v
        (["-p", "hello"], "error: invalid argument: -p"),  # llama-cli's, excluded from the server
        (["-c"], "expected value for argument"),
        (["--port", "eighty"], 'error while handling argument "--port": stoi'),
        (["-np", "0"], "error: invalid value for n_parallel"),
        (["--api-key-file", "/nonexistent/keys"], "failed to open file '/nonexistent/keys'"),
    ],
)
def test_command_lines_llama_server_refuses(args: list[str], said: str) -> None:
    result = run_server(*args)
    assert result.returncode == 1
    assert said in result.stderr


def test_options_of_the_list_and_underscores_are_read() -> None:
    # --version exits as its handler does, once the words before it were read.
    args = [
        "--ctx_size",
        "4096",
        "-ngl",
        "99",
        "--jinja",
        "--no-jinja",
        "-ctk",
        "q8_0",
        "--version",
    ]
    result = run_server(*args)
    assert (result.returncode, result.stderr.splitlines()[0]) == (0, f"version: 0 ({COMMIT})")


def test_environment_first_then_the_command_line() -> None:
    env = {"LLAMA_ARG_PORT": "9000", "LLAMA_API_KEY": "from-env", "LLAMA_ARG_ALIAS": "env-name"}
    params = standin.parse(["--port", "9001", "--api-key", "a,b", "-a", "cli-name"], env, TABLE)
    assert params.port == 9001  # a scalar: the command line's
    # --api-key and --alias add to the environment's, as their handlers do.
    assert params.api_keys == ["from-env", "a", "b"]
    assert params.aliases == {"env-name", "cli-name"}
    assert standin.parse([], {"LLAMA_ARG_HOST": "0.0.0.0"}, TABLE).hosts == ["0.0.0.0"]
    assert standin.parse([], {}, TABLE).hosts == ["127.0.0.1"]
    assert standin.parse([], {}, TABLE).port == 8080
    with pytest.raises(standin.UsageError, match='environment variable "LLAMA_ARG_CTX_SIZE": stoi'):
        standin.parse([], {"LLAMA_ARG_CTX_SIZE": "big"}, TABLE)
    # LLAMA_ARG_NO_* sets a pair's negative; LLAMA_ARG_KV_UNIFIED=maybe is no boolean.
    assert standin.parse([], {"LLAMA_ARG_NO_KV_UNIFIED": "1"}, TABLE).kv_unified is False
    with pytest.raises(standin.UsageError, match="invalid boolean value"):
        standin.parse([], {"LLAMA_ARG_KV_UNIFIED": "maybe"}, TABLE)


def test_the_command_line_warns_over_the_environment() -> None:
    result = run_server("--port", "9", "--version", LLAMA_ARG_PORT="8")
    assert result.returncode == 0
    assert (
        "warn: LLAMA_ARG_PORT environment variable is set, but will be overwritten by command"
        " line argument --port" in result.stderr
    )


def test_a_model_that_is_no_gguf_file_stops_the_start(tmp_path: Path) -> None:
    missing = tmp_path / "absent.gguf"
    result = run_server("-m", str(missing), "--port", str(free_port()))
    assert result.returncode == 1
    assert f"failed to open GGUF file '{missing}' (No such file or directory)" in result.stderr
    assert f"load_model: failed to load model, '{missing}'" in result.stderr
    assert "exiting due to model loading error" in result.stderr
    html = tmp_path / "page.gguf"
    html.write_text("<html>")
    result = run_server("-m", str(html), "--port", str(free_port()))
    assert result.returncode == 1
    assert "invalid magic characters: '<htm', expected 'GGUF'" in result.stderr


def test_no_model_is_router_mode_which_the_standin_does_not_run() -> None:
    result = run_server("--port", str(free_port()))
    assert result.returncode == 1
    assert "router mode" in result.stderr


# --- the server -----------------------------------------------------------------------------------


def test_health_answers_503_while_loading_then_ok(start: Callable[..., Server]) -> None:
    server = start(wait=False, SIMLAB_LLAMA_LOAD_SECONDS="1.5")
    server.wait_for_log("listening on")
    status, body, _ = request(f"{server.url}/health")
    assert status == 503
    assert json.loads(body) == {
        "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
    }
    assert request(f"{server.url}/v1/models")[0] == 503
    server.wait_healthy()
    status, body, headers = request(f"{server.url}/v1/health")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    assert headers["Server"] == "llama.cpp"


def test_a_key_guards_every_path_but_the_public_ones(
    start: Callable[..., Server], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# the lane's key\nfrom-file\n")
    server = start("--api-key", "s3cret", "--api-key-file", str(keys))
    invalid = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
    for path in ("/v1/models", "/models", "/props", "/metrics", "/slots", "/nowhere"):
        for headers in ({}, bearer("wrong")):
            status, body, _ = request(f"{server.url}{path}", headers=headers)
            assert (status, json.loads(body)) == (401, invalid), path
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert request(f"{server.url}/v1/chat/completions", chat)[0] == 401
    for path in ("/health", "/v1/health", "/"):
        assert request(f"{server.url}{path}")[0] == 200, path
    # Authorization with or without "Bearer ", or X-Api-Key (server-http.cpp), any of the keys.
    for headers in (bearer("s3cret"), {"Authorization": "s3cret"}, {"X-Api-Key": "from-file"}):
        assert request(f"{server.url}/v1/models", headers=headers)[0] == 200
    assert request(f"{server.url}/v1/chat/completions", chat, key="s3cret")[0] == 200
    status, body, _ = request(f"{server.url}/nowhere", headers=bearer("s3cret"))
    assert (status, json.loads(body)["error"]["type"]) == (404, "not_found_error")


def test_the_key_from_the_environment(start: Callable[..., Server]) -> None:
    server = start(LLAMA_API_KEY="env-key")
    assert request(f"{server.url}/v1/models")[0] == 401
    assert request(f"{server.url}/v1/models", headers=bearer("env-key"))[0] == 200


def test_models_and_props_name_the_alias_else_the_path(
    start: Callable[..., Server], model: Path
) -> None:
    unnamed = start("-c", "8192", "-np", "2")
    listing = json.loads(request(f"{unnamed.url}/v1/models")[1])
    assert listing["object"] == "list"
    assert [(m["id"], m["owned_by"]) for m in listing["data"]] == [(str(model), "llamacpp")]
    assert listing["data"][0]["meta"]["n_ctx"] == 4096
    named = start("--alias", "lane-b")
    assert json.loads(request(f"{named.url}/v1/models")[1])["data"][0]["id"] == "lane-b"
    props = json.loads(request(f"{named.url}/props")[1])
    assert (props["model_alias"], props["model_path"]) == ("lane-b", str(model))
    # Auto slots: 4 over one unified cache, each seeing the whole context.
    assert props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == standin.MODEL_TRAIN_CONTEXT


def test_metrics_only_with_the_option(start: Callable[..., Server]) -> None:
    plain = start()
    status, body, _ = request(f"{plain.url}/metrics")
    assert status == 501
    assert json.loads(body)["error"] == {
        "code": 501,
        "message": "This server does not support metrics endpoint. Start it with `--metrics`",
        "type": "not_supported_error",
    }
    with_metrics = start("--metrics")
    status, body, _ = request(f"{with_metrics.url}/metrics")
    assert status == 200
    assert "llamacpp:prompt_tokens_total 0" in body


def chat(server: Server, content: str, **more: Any) -> tuple[int, Any]:
    body = {"messages": [{"role": "user", "content": content}], **more}
    status, text, _ = request(f"{server.url}/v1/chat/completions", body)
    return status, text if more.get("stream") else json.loads(text)


def test_the_canary_question_is_answered(start: Callable[..., Server]) -> None:
    server = start("--alias", "lane-b")
    status, completion = chat(server, CANARY_QUESTION)
    assert status == 200
    assert completion["object"] == "chat.completion"
    assert completion["model"] == "lane-b"
    (choice,) = completion["choices"]
    assert choice["message"] == {"role": "assistant", "content": "42 harbor"}
    assert choice["finish_reason"] == "stop"
    usage = completion["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] == 16


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("gibberish", {"role": "assistant", "content": "Theorem quantum banana ledger"}),
        ("empty-reasoning", {"role": "assistant", "content": "",
                             "reasoning_content": "Thinking it over: 42 harbor"}),
    ],
)  # fmt: skip
def test_a_file_beside_the_model_makes_it_answer_badly(
    start: Callable[..., Server], model: Path, answer: str, message: dict[str, str]
) -> None:
    (model.parent / ANSWER_FILE).write_text(f"{answer}\n")
    server = start()
    got = chat(server, CANARY_QUESTION)[1]["choices"][0]["message"]
    assert {k: v.strip()[: len(message[k])] for k, v in got.items()} == message


def test_streaming_ends_with_done_and_usage_when_asked(start: Callable[..., Server]) -> None:
    server = start()
    status, text = chat(server, CANARY_QUESTION, stream=True,
                        stream_options={"include_usage": True})  # fmt: skip
    assert status == 200
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[1]["choices"][0]["delta"] == {"content": "42 harbor"}
    assert chunks[2]["choices"][0] == {"finish_reason": "stop", "index": 0, "delta": {}}
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["completion_tokens"] == 2
    plain = chat(server, "hi", stream=True)[1]
    assert '"usage"' not in plain and plain.endswith("data: [DONE]\n\n")


def test_a_prompt_over_a_slots_context_is_refused(start: Callable[..., Server]) -> None:
    # -c 1024 over 4 slots: 256 tokens each (seed 002's reason for --parallel 1).
    long_prompt = "word " * 300
    four = start("-c", "1024", "-np", "4")
    status, body = chat(four, long_prompt)
    assert status == 400
    assert body == {
        "error": {
            "code": 400,
            "message": "request (300 tokens) exceeds the available context size (256 tokens),"
            " try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 300,
            "n_ctx": 256,
        }
    }
    one = start("-c", "1024", "-np", "1")
    assert chat(one, long_prompt)[0] == 200
    assert chat(four, CANARY_QUESTION, stream=True)[0] == 200


def test_completions_answer_too(start: Callable[..., Server]) -> None:
    server = start()
    status, text, _ = request(f"{server.url}/v1/completions", {"prompt": CANARY_QUESTION})
    assert status == 200
    assert json.loads(text)["choices"][0]["text"] == "42 harbor"
    status, text, _ = request(f"{server.url}/completion", {"prompt": CANARY_QUESTION})
    assert (status, json.loads(text)["content"]) == (200, "42 harbor")


# --- the image ------------------------------------------------------------------------------------


def test_the_llama_image_is_the_serving_tree_with_llama_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The llama.cpp image's layers over a serving image's tree written here: no Ray, vllm or
    hf, /app/llama-server runnable with the tree's own standin_model and option list."""
    from tests.simlab import rootfs, serving

    tree = tmp_path / "tree"
    # A file in each of NOT_IN_LLAMA_IMAGE's directories; its other paths are files.
    share = serving.SHARE.relative_to("/")
    directories = (serving.RAY_SITE / "ray", share / "release", serving.TORCH_PACKAGE)
    above = {parent for d in directories for parent in (d, *d.parents)}
    owned = [path for path in serving.NOT_IN_LLAMA_IMAGE if path not in above]
    owned += [d / "__init__.py" for d in directories]
    for path in owned:
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text("x\n")
    (tree / serving.MODEL_MODULE).write_text((STANDIN.parent / "standin_model.py").read_text())
    base = tmp_path / "serving-image-0123456789ab.tar"
    subprocess.run(["tar", "-C", str(tree), "-cf", str(base), "."], check=True)
    monkeypatch.setattr(rootfs, "CACHE", tmp_path)  # for the build lock
    monkeypatch.setattr(rootfs, "serving_image_tar", lambda: base)

    layers = rootfs.image_layers(serving.LLAMA_IMAGE_TAG)

    assert layers[0] == base and layers[1].name == "serving-image-0123456789ab-llama-layer.tar"
    unpacked = unpacked_layers(layers, tmp_path / "image")
    for gone in serving.NOT_IN_LLAMA_IMAGE:
        assert not (unpacked / gone).exists(), gone
    server = unpacked / "app/llama-server"
    assert os.access(server, os.X_OK)
    share = unpacked / serving.LLAMA_SHARE.relative_to("/")
    assert (share / serving.LLAMA_DATA.name).read_bytes() == serving.LLAMA_DATA.read_bytes()
    # Outside this checkout, with the tree's python path only: the image's own imports work.
    env = {"PATH": os.environ["PATH"], "SIMLAB_LLAMA_SHARE": str(share),
           "PYTHONPATH": str(unpacked / serving.MODEL_MODULE.parent)}  # fmt: skip
    result = subprocess.run([sys.executable, "-S", str(server), "--version"], cwd=tmp_path,
                            capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert (result.returncode, result.stderr.splitlines()[0]) == (0, f"version: 0 ({COMMIT})")
    assert serving.image_changes(serving.LLAMA_IMAGE_TAG) == (
        "ENV LLAMA_ARG_HOST=0.0.0.0",
        "WORKDIR /app",
        'ENTRYPOINT ["/app/llama-server"]',
    )
    assert serving.image_changes(serving.SERVING_IMAGE_TAG) == ()

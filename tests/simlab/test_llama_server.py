"""llama.cpp's own `llama-server`, as the lab builds it (llama_build.py), serving the lab's GGUF
model (lab_gguf.py) on this machine: 127.0.0.1 and a free port, every server stopped within the
test. Marked lab: it needs the lab's cache, where the server and the model are built once.

What the lanes rely on is asked of the real server here (each expectation read in its source,
tools/server/server-http.cpp and server-context.cpp at 0c1e57098, and seen on this build): its
parser takes every option of the project's table, /health answers 503 until the model is loaded,
the key guards every path but the public ones, /metrics with --metrics, /v1/models names the
served name, a streamed chat completion ends with `[DONE]`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark.llamacpp_release import options
from tests.simlab import llama_build, loopback
from tests.simlab.loopback import Server, Servers, request

pytestmark = pytest.mark.lab

INVALID = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}


@pytest.fixture(scope="module")
def binary() -> Path:
    return llama_build.llama_server()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's model where a lane finds it: a GGUF file in a snapshot folder."""
    path = tmp_path_factory.mktemp("snapshot") / "model-Q4_K_M.gguf"
    path.write_bytes(llama_build.lab_model().read_bytes())
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without llama.cpp's own variables, and `extra`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")} | extra


# A real server's start on a busy machine: seconds, more than a stand-in's.
START_TIMEOUT = 120.0


@pytest.fixture
def start(
    tmp_path: Path, binary: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Server]]:
    """Start `llama-server -m MODEL --host 127.0.0.1 --port P ARGS`; stopped afterwards."""
    monkeypatch.setattr(loopback, "START_TIMEOUT", START_TIMEOUT)
    servers = Servers(tmp_path, "llama-server")

    def _start(*args: str, wait: bool = True, **env: str) -> Server:
        def command(port: int) -> list[str]:
            return [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                    "--threads", "2", *args]  # fmt: skip

        return servers.start(command, clean_env(**env), wait)

    yield _start
    servers.stop()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- the build ------------------------------------------------------------------------------------


def test_the_build_names_its_commit(binary: Path) -> None:
    result = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                            check=False, env=clean_env())  # fmt: skip
    # common/build-info.cpp.in: "version: %s (build %d, commit %s)"; the number and commit are
    # llama_build.py's (the sdist holds no git history to read them from).
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == "version: 0.5.0-dev (build 1, commit 0c1e570)"


def help_options(text: str) -> set[str]:
    """The option names `llama-server --help` lists (common/arg.cpp common_arg::to_string: from
    the line's start, the names joined by ", ", the first padded to 7 characters, then the
    value hints, then the help after 2 or more spaces or on the next line)."""
    names = set()
    for line in text.splitlines():
        if re.match(r"--?[A-Za-z]", line):  # not a section's "----- name -----" heading
            column = re.split(r"\s{2,}", re.sub(r",\s+", ", ", line))[0]
            names |= {word.split(" ")[0] for word in column.split(", ")}
    return names


def test_help_lists_every_option_of_the_projects_table(binary: Path) -> None:
    """The table (spark/data/, read from arg.cpp by tools/llama_cpp_options.py) and the built
    parser's own list agree: every option the deploy renders is one this binary takes."""
    result = subprocess.run([str(binary), "--help"], capture_output=True, text=True,
                            check=False, env=clean_env())  # fmt: skip
    assert result.returncode == 0, result.stderr
    listed = help_options(result.stdout + result.stderr)
    assert listed == set(options()), (
        sorted(listed - set(options())),
        sorted(set(options()) - listed),
    )


# --- serving --------------------------------------------------------------------------------------


def test_health_answers_503_until_the_model_is_loaded(start: Callable[..., Server]) -> None:
    """server.cpp starts the HTTP server before load_model and sets is_ready after it; until
    then every path but the UI's answers 503 (server-http.cpp middleware_server_state). The
    tiny model loads in a blink: what is asked here is each answer seen while it starts (503
    "Loading model" or refused, never anything else) and the order of its log."""
    server = start(wait=False)
    loading = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        assert time.monotonic() < deadline, server.log.read_text()
        try:
            status, body, _ = request(f"{server.url}/health")
        except OSError:  # not listening yet
            assert server.process.poll() is None, server.log.read_text()
            time.sleep(0.01)
            continue
        if status == 200:
            break
        assert (status, json.loads(body)) == (503, loading)
    assert json.loads(body) == {"status": "ok"}
    assert request(f"{server.url}/v1/health")[0] == 200
    server.wait_for_log("listening on")
    log = server.log.read_text()
    # Unlike the stand-in's, "listening on" comes once the model is loaded; both from the
    # server's llama_server(), not main() (tools/server/server.cpp SRV_INF, seen on this build).
    loaded = log.index("llama_server: model loaded")
    assert loaded < log.index(f"llama_server: listening on {server.url}"), log


def test_a_key_guards_every_path_but_the_public_ones(
    start: Callable[..., Server], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("from-file\n")
    server = start("--api-key", "s3cret", "--api-key-file", str(keys), "--metrics")
    for path in ("/v1/models", "/models", "/props", "/metrics", "/slots", "/nowhere"):
        for headers in ({}, bearer("wrong")):
            status, body, _ = request(f"{server.url}{path}", headers=headers)
            assert (status, json.loads(body)) == (401, INVALID), path
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert request(f"{server.url}/v1/chat/completions", chat)[0] == 401
    for path in ("/health", "/v1/health"):
        assert request(f"{server.url}{path}")[0] == 200, path
    # Authorization with or without "Bearer ", or X-Api-Key (server-http.cpp), any of the keys.
    for headers in (bearer("s3cret"), {"Authorization": "s3cret"}, {"X-Api-Key": "from-file"}):
        assert request(f"{server.url}/v1/models", headers=headers)[0] == 200
    for path in ("/metrics", "/slots", "/props"):
        assert request(f"{server.url}{path}", headers=bearer("s3cret"))[0] == 200, path
    assert request(f"{server.url}/v1/chat/completions", chat, key="s3cret")[0] == 200


def test_without_a_key_every_path_answers(start: Callable[..., Server]) -> None:
    server = start("--metrics")
    for path in ("/v1/models", "/metrics", "/slots", "/props"):
        assert request(f"{server.url}{path}")[0] == 200, path


def test_the_key_from_the_environment(start: Callable[..., Server]) -> None:
    server = start(LLAMA_API_KEY="env-key")
    assert request(f"{server.url}/v1/models")[0] == 401
    assert request(f"{server.url}/v1/models", headers=bearer("env-key"))[0] == 200


def test_models_name_the_alias_else_the_path(start: Callable[..., Server], model: Path) -> None:
    unnamed = start()
    listing = json.loads(request(f"{unnamed.url}/v1/models")[1])
    assert [(m["id"], m["owned_by"]) for m in listing["data"]] == [(str(model), "llamacpp")]
    assert listing["data"][0]["meta"]["n_ctx_train"] == 131072  # the GGUF's context_length
    named = start("--alias", "lane-b")
    assert json.loads(request(f"{named.url}/v1/models")[1])["data"][0]["id"] == "lane-b"


def test_metrics_only_with_the_option(start: Callable[..., Server]) -> None:
    plain = start()
    status, body, _ = request(f"{plain.url}/metrics")
    assert status == 501
    assert json.loads(body)["error"]["message"] == (
        "This server does not support metrics endpoint. Start it with `--metrics`"
    )
    with_metrics = start("--metrics")
    status, body, _ = request(f"{with_metrics.url}/metrics")
    assert status == 200
    assert "llamacpp:prompt_tokens_total 0" in body


def chat(server: Server, content: str, **more: Any) -> tuple[int, Any]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, **more}
    status, text, _ = request(f"{server.url}/v1/chat/completions", body)
    return status, text if more.get("stream") else json.loads(text)


def test_a_chat_completion_through_the_chat_template(start: Callable[..., Server]) -> None:
    server = start("--alias", "lane-b", "--jinja")
    status, completion = chat(server, "What is 2 + 40?")
    assert status == 200
    assert completion["model"] == "lane-b"
    (choice,) = completion["choices"]
    assert choice["message"]["role"] == "assistant"
    # ChatML around one user turn, and the answer's opening: "<|im_start|>user\n" ... the
    # tokens the tiny vocabulary spells it with.
    assert completion["usage"]["completion_tokens"] <= 8


def test_streaming_ends_with_done(start: Callable[..., Server]) -> None:
    server = start("--jinja")
    status, text = chat(server, "hi", stream=True, stream_options={"include_usage": True})
    assert status == 200
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 8


def test_the_deploys_own_options_are_taken(start: Callable[..., Server]) -> None:
    """A lane's command line (spark/llamacpp.py DEFAULTS, and a lane's own keys) as the deploy
    renders it for seed 002's lane, on this machine's CPU."""
    server = start("--n-gpu-layers", "99", "--fit", "off", "--jinja", "--metrics",
                   "--ctx-size", "131072", "--parallel", "1", "--cache-type-k", "q8_0",
                   "--cache-type-v", "q8_0", "--alias", "qwen3-coder-next-gguf")  # fmt: skip
    listing = json.loads(request(f"{server.url}/v1/models")[1])
    assert listing["data"][0]["id"] == "qwen3-coder-next-gguf"
    assert listing["data"][0]["meta"]["n_ctx"] == 131072


# --- the image ------------------------------------------------------------------------------------


def test_the_llama_image_carries_the_build(binary: Path) -> None:
    from tests.simlab import rootfs, serving

    base, layer = rootfs.image_layers(serving.LLAMA_IMAGE_TAG)
    server = subprocess.run(["tar", "-xOf", str(layer), "./app/llama-server"],
                            capture_output=True, check=True).stdout  # fmt: skip
    assert server == binary.read_bytes()
    listed = subprocess.run(["tar", "-tvf", str(layer)], capture_output=True, text=True,
                            check=True).stdout  # fmt: skip
    assert re.search(r"^-rwxr-xr-x .* \./app/llama-server$", listed, re.M), listed
    # Every library it needs is in the base image's tree; glibc 2.36's ld.so is named too (the
    # binary's own NEEDED list, objdump -p, on this build: it takes __tls_get_addr from it).
    needed = subprocess.run(["objdump", "-p", str(binary)], capture_output=True, text=True,
                            check=True).stdout  # fmt: skip
    libraries = re.findall(r"NEEDED\s+(\S+)", needed)
    assert sorted(libraries) == [
        "ld-linux-x86-64.so.2", "libc.so.6", "libgcc_s.so.1", "libm.so.6", "libstdc++.so.6"
    ]  # fmt: skip
    tree = subprocess.run(["tar", "-tf", str(base)], capture_output=True, text=True,
                          check=True).stdout.splitlines()  # fmt: skip
    for library in libraries:
        assert any(path.endswith(f"/{library}") for path in tree), library
    assert serving.image_changes(serving.LLAMA_IMAGE_TAG) == (
        "ENV LLAMA_ARG_HOST=0.0.0.0",
        "WORKDIR /app",
        'ENTRYPOINT ["/app/llama-server"]',
    )

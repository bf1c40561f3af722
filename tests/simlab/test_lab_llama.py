"""The llama.cpp image on a lab host: pulled from the lab's registry, the lab's GGUF fetched by
the vLLM image's `hf download` stand-in, and a container of it run the way its Dockerfile says
(the arguments only: its entrypoint is /app/llama-server, llama.cpp's own)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_on
from tests.simlab import lab as simlab
from tests.simlab.serving import LLAMA_IMAGE_TAG
from tests.simlab.waits import until

pytestmark = pytest.mark.lab

CACHE = "/root/.cache/huggingface"
REPO, FILE = "unsloth/Qwen3-Coder-Next-GGUF", "Qwen3-Coder-Next-UD-Q4_K_XL.gguf"


def test_a_llama_server_container_answers_health(lab: simlab.Lab) -> None:
    host = lab.hosts[0]
    vllm_image = simlab.pull_image(host)
    assert simlab.pull_image(host, LLAMA_IMAGE_TAG) == LLAMA_IMAGE_TAG
    config = json.loads(run_on(host, f"sudo docker image inspect {LLAMA_IMAGE_TAG}"))[0]["Config"]
    assert config["Entrypoint"] == ["/app/llama-server"]
    assert (config["WorkingDir"], "LLAMA_ARG_HOST=0.0.0.0" in config["Env"]) == ("/app", True)
    mount = f"-v {CACHE}:{CACHE}"
    fetched = run_on(host, f"sudo docker run --rm {mount} {vllm_image} hf download {REPO} {FILE}")
    gguf = fetched.splitlines()[-1]
    assert gguf.startswith(f"{CACHE}/hub/models--unsloth--Qwen3-Coder-Next-GGUF/snapshots/")
    assert gguf.endswith(f"/{FILE}")
    run_on(host, "sudo docker rm -f llama", check=False)
    try:
        run_on(host, f"sudo docker run -d --name llama --network host {mount} {LLAMA_IMAGE_TAG}"
                     f" -m {gguf} --host 127.0.0.1 --port 18080")  # fmt: skip
        health = "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18080/health"
        seen: list[str] = []

        def served() -> bool:
            seen.append(run_on(host, health, check=False).strip())
            return seen[-1] == "200"

        until(served, 120, "llama-server's /health answering 200", every=0.2)
        # Before: refused (curl's 000) or 503 while loading; the tiny model loads in a blink.
        assert set(seen[:-1]) <= {"000", "503"}, seen
        models = json.loads(run_on(host, "curl -s http://127.0.0.1:18080/v1/models"))
        assert models["data"][0]["id"] == gguf
        logs = run_on(host, "sudo docker logs llama 2>&1")
        assert "listening on http://127.0.0.1:18080" in logs, logs
    finally:
        run_on(host, "sudo docker rm -f llama", check=False)

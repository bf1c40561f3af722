"""The answer canary (templates/spark-lane-canary.j2, issue 16) run with the real interpreter
against a vLLM-like server on loopback that gives canned answers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import jinja2
import pytest

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
KEY = "k3y-for-the-canary"
CAUSES = ["a ModelOpt NVFP4 checkpoint (seed 003)", "a thinking template hiding the answer"]


class Lab:
    """What the server answers next, and what it was asked."""

    message: ClassVar[dict] = {}
    requests: ClassVar[list[dict]] = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def reply(self, body: dict) -> None:
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self.send_response(401)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.reply({"data": [{"id": "coder"}]})

    def do_POST(self) -> None:
        Lab.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.reply({"choices": [{"message": {"role": "assistant"} | Lab.message}]})


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    (tmp_path / "coder.key").write_text(KEY + "\n")
    source = (TEMPLATES / "spark-lane-canary.j2").read_text()
    script = tmp_path / "spark-lane-canary"
    script.write_text(jinja2.Template(source).render(secrets_dir=str(tmp_path)))
    return script


def run(canary: Path, port: int, message: dict) -> subprocess.CompletedProcess[str]:
    Lab.message, Lab.requests = message, []
    return subprocess.run(
        [sys.executable, str(canary), "coder", str(port), *CAUSES],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_right_answer_passes_and_the_request_is_deterministic(canary: Path, server: int) -> None:
    result = run(canary, server, {"content": "42 harbor"})
    assert result.returncode == 0, result.stdout
    assert "canary passed" in result.stdout
    (request,) = Lab.requests
    assert request["temperature"] == 0 and 0 < request["max_tokens"] <= 256
    assert request["model"] == "coder"
    assert KEY not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("message", "said"),
    [
        # seed 003: a ModelOpt NVFP4 checkpoint "generates confident nonsense"
        ({"content": "Theorem quantum banana the of of ledger"}, "not the right number"),
        ({"content": "42 " + "the " * 30}, "repeated 8 times"),
        ({"content": "42 harbor \ufffd\ufffd"}, "U+FFFD"),
        ({"content": "", "reasoning_content": "17 + 25 is 42, the word is harbor"}, "thinking"),
        ({"content": None, "reasoning": "17 + 25 = 42"}, "thinking template"),
        ({"content": "41 harbor"}, "not the right number"),
        ({"content": "42"}, "the word 'harbor' missing"),
        ({"content": "   "}, "empty answer"),
        ({"content": "42 harbor " + "!" * 40}, "repeated characters"),
    ],
    ids=[
        "gibberish",
        "repeated-tokens",
        "replacement-chars",
        "empty-with-reasoning-content",
        "empty-with-reasoning",
        "wrong-number",
        "no-word",
        "empty",
        "repeated-chars",
    ],
)
def test_a_bad_answer_fails_quoting_it_and_naming_the_causes(
    canary: Path, server: int, message: dict, said: str
) -> None:
    result = run(canary, server, message)
    assert result.returncode == 1
    assert "canary failed" in result.stdout and said in result.stdout, result.stdout
    shown = message.get("content") or message.get("reasoning_content") or message["reasoning"]
    assert json.dumps(shown[:40], ensure_ascii=False)[:-1] in result.stdout
    for cause in CAUSES:
        assert cause in result.stdout
    assert KEY not in result.stdout + result.stderr


def test_a_long_answer_is_quoted_truncated(canary: Path, server: int) -> None:
    result = run(canary, server, {"content": " ".join(f"w{i}" for i in range(500))})
    assert result.returncode == 1
    assert "w10 " in result.stdout and "w400" not in result.stdout and "..." in result.stdout


def test_no_server_fails(canary: Path) -> None:
    result = run(canary, 1, {})
    assert result.returncode == 1 and "no answer from 127.0.0.1:1" in result.stdout


# Broken servers' real answers, quoted in public issues (each the part the issue quotes); none
# holds 42 and harbor, so each fails, and the judgement names what is wrong.
REAL_GARBAGE = {
    # sgl-project/sglang#24321: MiMo-V2.5 NVFP4 on SM120 with a CUTLASS FP4 MoE backend, for a
    # simple query: "Output is always ++++++++…"
    "nvfp4-cutlass-plus-signs": ("+" * 50, "a run of repeated characters"),
    # NVIDIA/dgx-spark-playbooks#76: Phi-4-reasoning-plus-NVFP4 on a GB10 (NGC 26.02): "long
    # runs of fragments like 's's's't's's's's..."
    "nvfp4-gb10-fragments": ("'s's's't's's's's", "not the right number"),
    # guoqingbao/xinfer#361: an 80B NVFP4 model on a Spark (SM121), asked "ello"
    "nvfp4-sm121-nonsense": (
        'Hello, 25. 0x Let SU\n\n**Question:    The:\n//S9 wellIm/APP: "RJ25955{324.jp/://ec//97PE0pq',
        "not the right number",
    ),
}


@pytest.mark.parametrize("case", sorted(REAL_GARBAGE))
def test_real_garbage_from_public_issues_fails(canary: Path, server: int, case: str) -> None:
    content, said = REAL_GARBAGE[case]
    result = run(canary, server, {"content": content})
    assert result.returncode == 1
    assert f"canary failed: {said}" in result.stdout, result.stdout

"""files/spark_pull.py, the box's pull, against a stand-in docker daemon on a Unix socket (no
lab): the request docker's client would send, root's `docker login` as X-Registry-Auth, the
progress read from the daemon's stream into the status file and the journal, and docker's
answer when it fails.

The daemon's answers are written by hand in the form of docker's Engine API (v1.41, ImageCreate:
a stream of CreateImageInfo objects, one a line: status, id, progressDetail {current, total};
an error as {"error", "errorDetail": {"message"}}; a request refused before the stream as a
status code and {"message"}), with the layer sizes of the lab's 26.04 stand-in (one layer of
163146892 bytes, tests/unit/captured/lab-registryimage-2604.txt).
"""

from __future__ import annotations

import base64
import http.server
import importlib.util
import json
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "spark_pull", Path(__file__).resolve().parents[2] / "files/spark_pull.py"
)
assert _SPEC and _SPEC.loader
spark_pull = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(spark_pull)

IMAGE = "nvcr.io/nvidia/vllm:26.04-py3"
PIN = "sha256:" + "b" * 64
EOF_ERROR = {"errorDetail": {"message": "unexpected EOF"}, "error": "unexpected EOF"}
LAYER, SIZE = "5a1b2c3d4e5f", 163146892
LAYER_DIGEST = f"sha256:{LAYER}{'0' * 52}"  # docker's stream names it by the first 12 digits
STREAM = [
    {"status": "Pulling from nvidia/vllm", "id": "26.04-py3"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": LAYER},
    {"status": "Downloading", "progressDetail": {"current": 1048576, "total": SIZE}, "id": LAYER},
    {"status": "Downloading", "progressDetail": {"current": 81573446, "total": SIZE}, "id": LAYER},
    {"status": "Verifying Checksum", "progressDetail": {}, "id": LAYER},
    {"status": "Download complete", "progressDetail": {}, "id": LAYER},
    {"status": "Extracting", "progressDetail": {"current": 32768, "total": SIZE}, "id": LAYER},
    {"status": "Pull complete", "progressDetail": {}, "id": LAYER},
    {"status": "Digest: sha256:" + "a" * 64},
    {"status": f"Status: Downloaded newer image for {IMAGE}"},
]
REFUSED = 'Get "https://nvcr.io/v2/": dial tcp 10.77.61.1:443: connect: connection refused'


class Daemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The stand-in daemon: answers POST /images/create with ``answer`` (status, lines)."""

    daemon_threads = True

    def __init__(self, path: str, status: int, lines: list[dict]):
        self.status, self.lines, self.asked = status, lines, []
        super().__init__(path, Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    server: Daemon

    def do_POST(self) -> None:
        self.server.asked.append((self.path, self.headers.get("X-Registry-Auth")))
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if self.server.status != 200:
            self.wfile.write(json.dumps({"message": REFUSED}).encode())
            return
        for line in self.server.lines:
            self.wfile.write(json.dumps(line).encode() + b"\r\n")

    def log_message(self, format: str, *args: object) -> None:  # a Unix peer has no address
        pass


@pytest.fixture
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemon]:
    status, lines = getattr(request, "param", (200, STREAM))
    server = Daemon(str(tmp_path / "docker.sock"), status, lines)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run(tmp_path: Path, *extra: str) -> int:
    return spark_pull.main(
        [IMAGE, "--layer", f"{LAYER_DIGEST}={SIZE}", "--status", str(tmp_path / "status.json"),
         "--socket", str(tmp_path / "docker.sock"), *extra]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("image", "asked"),
    [
        (IMAGE, {"fromImage": "nvcr.io/nvidia/vllm", "tag": "26.04-py3"}),
        # docker/cli's ImagePull: a pinned name's digest as the tag, its tag dropped.
        (f"{IMAGE}@{PIN}", {"fromImage": "nvcr.io/nvidia/vllm", "tag": PIN}),
        ("registry.lab:5000/vllm:1", {"fromImage": "registry.lab:5000/vllm", "tag": "1"}),
    ],
)  # fmt: skip
def test_the_request_names_the_image_as_dockers_client_does(image: str, asked: dict) -> None:
    assert spark_pull.query(image) == asked


def test_a_pull_reads_its_progress_and_ends_done(daemon: Daemon, tmp_path: Path, capsys) -> None:
    assert run(tmp_path, "--docker-config", str(tmp_path / "absent.json")) == 0
    path, auth = daemon.asked[0]
    assert path == "/v1.41/images/create?fromImage=nvcr.io%2Fnvidia%2Fvllm&tag=26.04-py3"
    assert auth is None  # no `docker login`: no header
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["state"], status["done"], status["total"], status["error"]) == (
        "done", SIZE, SIZE, ""
    )  # fmt: skip
    journal = capsys.readouterr().out.splitlines()
    assert journal[0].startswith(f"{IMAGE}: 0 of {SIZE} bytes (0%), ")
    assert journal[-1].startswith(f"{IMAGE}: {SIZE} of {SIZE} bytes (100%), ")
    assert journal[-1].endswith(", done")


def test_the_manifests_layers_by_the_id_dockers_stream_gives_them() -> None:
    assert spark_pull.short_ids([f"{LAYER_DIGEST}={SIZE}", f"sha256:{'c' * 64}=7"]) == {
        LAYER: SIZE, "c" * 12: 7
    }  # fmt: skip


def test_a_layer_already_on_the_box_counts_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # An upgrade sharing the base layer: docker says "Already exists" of it and downloads the
    # other (26.05's stand-in: the 26.04 base and a small layer over it). The pull's clock is
    # read twice: at its start, then two seconds in.
    clock = iter([1000.0, 1002.0])
    monkeypatch.setattr(spark_pull, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    progress = spark_pull.Progress(IMAGE, {LAYER: SIZE, "c" * 12: 1000}, "/nonexistent")
    progress.update({"status": "Already exists", "progressDetail": {}, "id": LAYER})
    progress.update({"status": "Downloading", "progressDetail": {"current": 400, "total": 1000},
                     "id": "c" * 12})  # fmt: skip
    assert (progress.done(), progress.total) == (SIZE + 400, SIZE + 1000)
    assert (
        progress.rate() == 200.0
    )  # 400 bytes downloaded in two seconds; the layer on the box none


def test_a_layers_bytes_count_as_docker_reports_them() -> None:
    progress = spark_pull.Progress(IMAGE, {LAYER: SIZE}, "/nonexistent")
    for message in STREAM[:4]:
        progress.update(message)
    assert progress.done() == 81573446  # the last `Downloading` current
    progress.update(STREAM[5])  # Download complete: the layer's whole size
    assert progress.done() == SIZE
    progress.update(STREAM[6])  # Extracting counts the unpacking, not the download
    assert progress.done() == SIZE


def test_root_docker_login_goes_as_x_registry_auth(daemon: Daemon, tmp_path: Path) -> None:
    # `docker login nvcr.io` (user $oauthtoken, the NGC key) writes auths.nvcr.io.auth:
    # base64 of user:password.
    config = tmp_path / "config.json"
    login = base64.b64encode(b"$oauthtoken:nvapi-secret").decode()
    config.write_text(json.dumps({"auths": {"nvcr.io": {"auth": login}}}))
    assert run(tmp_path, "--docker-config", str(config)) == 0
    header = daemon.asked[0][1]
    assert json.loads(base64.urlsafe_b64decode(header)) == {
        "username": "$oauthtoken", "password": "nvapi-secret", "serveraddress": "nvcr.io"
    }  # fmt: skip
    assert "nvapi-secret" not in (tmp_path / "status.json").read_text()


@pytest.mark.parametrize("daemon", [(500, [])], indirect=True)
def test_a_refused_pull_keeps_dockers_answer(daemon: Daemon, tmp_path: Path, capsys) -> None:
    assert run(tmp_path) == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["state"], status["error"]) == ("failed", REFUSED)
    assert capsys.readouterr().err == f"spark_pull: {IMAGE}: {REFUSED}\n"


@pytest.mark.parametrize(
    "daemon",
    [(200, [*STREAM[:3], EOF_ERROR])],
    indirect=True,
)  # fmt: skip
def test_an_error_in_the_stream_fails_the_pull(daemon: Daemon, tmp_path: Path) -> None:
    assert run(tmp_path) == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["state"], status["error"], status["done"]) == (
        "failed",
        "unexpected EOF",
        1048576,
    )


def test_no_daemon_says_so(tmp_path: Path) -> None:
    assert run(tmp_path) == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["error"].startswith(f"the docker daemon at {tmp_path}/docker.sock: ")

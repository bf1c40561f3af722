"""files/spark_fetch.py, the box's fetcher, against the lab's hub stand-in on loopback (no lab):
the cache layout huggingface_hub leaves, a cut fetch resumed, a corrupt file found by its hash,
a fleet copy from another box's blobs checked against the hub's hashes, the token sent to the
hub alone. Expected hashes are worked out here from the stand-in's content (256 MiB of zeros
for the weights, serving/hf_standin.py)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import io
import json
import os
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.simlab.hub import Hub

FETCH = Path(__file__).parents[2] / "files" / "spark_fetch.py"
REPO = "org/name"
COMMIT = hashlib.sha1(REPO.encode()).hexdigest()
WEIGHTS = 256 * 2**20
ZEROS_SHA256 = hashlib.sha256(bytes(WEIGHTS)).hexdigest()
FAST = 2**30  # bytes a second: no wait beyond the machine's own


def fetch(
    hub: Hub, cache: Path, *args: str, wait: bool = True
) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    command = [sys.executable, str(FETCH), REPO, *args, "--cache", str(cache),
               "--endpoint", hub.url, "--status", str(cache / "status.json")]  # fmt: skip
    if not wait:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def repo_dir(cache: Path) -> Path:
    return cache / "hub" / "models--org--name"


@pytest.fixture
def hub() -> Iterator[Hub]:
    with Hub(rate=FAST) as running:
        yield running


def test_a_model_lands_as_hf_download_leaves_it(hub: Hub, tmp_path: Path) -> None:
    result = fetch(hub, tmp_path)
    assert result.returncode == 0, result.stderr
    repo = repo_dir(tmp_path)
    assert (repo / "refs/main").read_text() == COMMIT
    weights = repo / "snapshots" / COMMIT / "model.safetensors"
    assert os.readlink(weights) == f"../../blobs/{ZEROS_SHA256}"
    assert weights.stat().st_size == WEIGHTS
    assert (repo / "snapshots" / COMMIT / "config.json").read_text().startswith("{")
    assert hub.downloads == {f"{REPO}/config.json": 1, f"{REPO}/model.safetensors": 1}
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "done"
    assert status["done"] == status["total"] > WEIGHTS
    assert f"{REPO}: {status['total']} of {status['total']} bytes (100%)" in result.stdout
    # Again: nothing fetched.
    assert fetch(hub, tmp_path).returncode == 0
    assert sum(hub.downloads.values()) == 2


def test_a_cut_fetch_resumes_where_it_stopped(tmp_path: Path) -> None:
    partial = repo_dir(tmp_path) / "blobs" / f"{ZEROS_SHA256}.incomplete"
    with Hub(rate=64 * 2**20) as hub:  # 4 s for the weights
        running = fetch(hub, tmp_path, wait=False)
        deadline = time.monotonic() + 30
        while not (partial.exists() and partial.stat().st_size > WEIGHTS // 4):
            assert time.monotonic() < deadline and running.poll() is None
            time.sleep(0.05)
        running.kill()
        running.wait()
        kept = partial.stat().st_size
        hub.rate = FAST
        result = fetch(hub, tmp_path)
        assert result.returncode == 0, result.stderr
        key = f"{REPO}/model.safetensors"
        assert hub.downloads[key] == 2
        assert hub.resumed[key] == [kept]
        # What came over the wire: the file once, and what the cut left in flight.
        assert sum(hub.sent.values()) < WEIGHTS * 1.25
    blob = repo_dir(tmp_path) / "blobs" / ZEROS_SHA256
    assert blob.stat().st_size == WEIGHTS and not partial.exists()


def test_a_corrupt_file_is_found_by_its_hash_and_fetched_again(hub: Hub, tmp_path: Path) -> None:
    blobs = repo_dir(tmp_path) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{ZEROS_SHA256}.incomplete").write_bytes(b"\xff" * 2**20)  # not zeros
    result = fetch(hub, tmp_path)
    assert result.returncode == 1
    assert f"the hub says {WEIGHTS} bytes and {ZEROS_SHA256}: deleted" in result.stderr
    assert not list(blobs.glob("*.incomplete"))
    assert json.loads((tmp_path / "status.json").read_text())["state"].startswith("failed: ")
    result = fetch(hub, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (blobs / ZEROS_SHA256).stat().st_size == WEIGHTS


def script(name: str) -> types.ModuleType:
    """One of files/'s scripts, loaded as a module (they are run by path on the boxes)."""
    spec = importlib.util.spec_from_file_location(name, FETCH.parent / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve_blobs(directory: Path, kind: type | None = None) -> http.server.ThreadingHTTPServer:
    """Another box's blobs over HTTP, as operations/weights.py's share serves them (its unit
    runs files/spark_serve.py; `kind`: a handler made from it)."""
    handler = functools.partial(kind or script("spark_serve").Blobs, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_fleet_copy_takes_the_files_from_a_box_and_the_hashes_from_the_hub(
    hub: Hub, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    assert fetch(hub, first).returncode == 0
    server = serve_blobs(repo_dir(first) / "blobs")
    source = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        result = fetch(hub, second, "--source", source)
        assert result.returncode == 0, result.stderr
        assert hub.downloads == {f"{REPO}/config.json": 1, f"{REPO}/model.safetensors": 1}
        assert (repo_dir(second) / "blobs" / ZEROS_SHA256).stat().st_size == WEIGHTS
        # A box whose copy differs from the hub's hash: refused, nothing kept.
        third = tmp_path / "third"
        (repo_dir(first) / "blobs" / ZEROS_SHA256).write_bytes(b"\x01" * 10)
        result = fetch(hub, third, "--source", source)
        assert result.returncode == 1
        assert not (repo_dir(third) / "blobs" / ZEROS_SHA256).exists()
    finally:
        server.shutdown()
        server.server_close()


def test_a_fleet_copy_waits_for_the_files_the_box_has_not_got_yet(hub: Hub, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    blobs = repo_dir(first) / "blobs"
    blobs.mkdir(parents=True)
    server = serve_blobs(blobs)  # nothing there yet: every ask answers 404
    try:
        copying = fetch(
            hub, second, "--source", f"http://127.0.0.1:{server.server_address[1]}", wait=False
        )
        time.sleep(2)
        assert copying.poll() is None  # waiting, not failed
        assert fetch(hub, first).returncode == 0  # the first box gets it from the hub
        out, err = copying.communicate(timeout=60)
        assert copying.returncode == 0, err
        assert "not there yet" in out
        assert hub.downloads[f"{REPO}/model.safetensors"] == 1
        assert (repo_dir(second) / "blobs" / ZEROS_SHA256).stat().st_size == WEIGHTS
    finally:
        server.shutdown()
        server.server_close()


def test_only_the_files_named(hub: Hub, tmp_path: Path) -> None:
    result = fetch(hub, tmp_path, "config.json")
    assert result.returncode == 0, result.stderr
    assert hub.downloads == {f"{REPO}/config.json": 1}
    result = fetch(hub, tmp_path, "missing.gguf")
    assert (result.returncode, "not in the repository: missing.gguf") == (
        1,
        result.stderr.strip().split(": ", 2)[-1],
    )


def test_the_token_goes_to_the_hub_only(hub: Hub, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("hf_secret\n")
    token.chmod(0o600)
    result = fetch(hub, tmp_path / "cache", "config.json", "--token-file", str(token))
    assert result.returncode == 0, result.stderr
    assert hub.tokens == {"hf_secret": 2}  # the listing and the file
    assert "hf_secret" not in result.stdout + result.stderr


def test_a_model_half_fetched_has_no_snapshot_yet(tmp_path: Path) -> None:
    """The deploy and the lanes look for the snapshot's config.json: none until all landed."""
    partial = repo_dir(tmp_path) / "blobs" / f"{ZEROS_SHA256}.incomplete"
    with Hub(rate=64 * 2**20) as hub:
        running = fetch(hub, tmp_path, wait=False)
        deadline = time.monotonic() + 30
        while not (partial.exists() and partial.stat().st_size > 0):
            assert time.monotonic() < deadline and running.poll() is None
            time.sleep(0.05)
        assert not list(repo_dir(tmp_path).glob("snapshots/*/config.json"))
        assert not (repo_dir(tmp_path) / "refs/main").exists()
        running.kill()
        running.wait()


@pytest.mark.parametrize("apart", [False, True])
def test_a_stream_is_written_and_hashed_whole_across_chunks(apart: bool) -> None:
    """Several reads and a part of one, in this thread (256 KiB reads) or with the hash in a
    second thread (two 1 MiB buffers, the second filled while the first is hashed, then the
    first again); what lands and its SHA-256 are the stream's either way."""
    fetcher = script("spark_fetch")
    data = os.urandom(2 * 2**20 + 12345)
    out, digest = io.BytesIO(), hashlib.sha256()
    progress = fetcher.Progress(REPO, len(data), 0, None)
    fetcher.stream(io.BytesIO(data), out, digest, progress, apart)
    assert out.getvalue() == data
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert progress.done == len(data)


def test_files_at_once_are_half_the_cores_and_at_least_four() -> None:
    """A Spark's 20 cores (10 X925 + 10 A725): ten files, each with a core to receive it and one
    to hash it; the lab's 2 cores and a 9-core box: four, as before (7 cores: too few to hash
    four apart)."""
    fetcher = script("spark_fetch")
    assert [fetcher.files_at_once(cores) for cores in (1, 2, 9, 10, 16, 20)] == [4, 4, 4, 5, 8, 10]
    assert fetcher.hash_apart(20, fetcher.files_at_once(20))
    assert not fetcher.hash_apart(7, fetcher.files_at_once(7))  # four files want eight


def test_the_hash_has_a_thread_of_its_own_only_with_a_core_to_spare() -> None:
    """Four files at once: their receiving threads and hashing threads need 8 cores."""
    fetcher = script("spark_fetch")
    assert [fetcher.hash_apart(cores, 4) for cores in (2, 7, 8, 16)] == [False, False, True, True]
    assert fetcher.hash_apart(2, 1)


def test_files_of_the_same_content_are_fetched_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two files the hub names by one blob (the same bytes): one ask of the box, one blob, both
    files linked to it (two fetches at once into one .incomplete file failed the hash)."""
    data = os.urandom(3 * 2**20)
    blob = hashlib.sha256(data).hexdigest()
    served = tmp_path / "served"
    (served / "blobs").mkdir(parents=True)
    (served / "blobs" / blob).write_bytes(data)
    lfs = {"sha256": blob, "size": len(data), "pointerSize": 134}  # as tests/simlab/hub.py lists
    siblings = [{"rfilename": name, "size": len(data), "lfs": lfs} for name in ("a.bin", "b.bin")]
    api = served / "api/models" / REPO / "revision/main"
    api.parent.mkdir(parents=True)
    api.write_text(json.dumps({"sha": COMMIT, "siblings": siblings}))
    server = serve_blobs(served)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        command = [sys.executable, str(FETCH), REPO, "--cache", str(tmp_path / "cache"),
                   "--endpoint", url, "--source", f"{url}/blobs"]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    snapshot = repo_dir(tmp_path / "cache") / "snapshots" / COMMIT
    assert (
        os.readlink(snapshot / "a.bin") == os.readlink(snapshot / "b.bin") == f"../../blobs/{blob}"
    )
    assert (snapshot / "a.bin").read_bytes() == data
    # The server's log lines (http.server's log_request): the blob asked once.
    assert capsys.readouterr().err.count(f"GET /blobs/{blob} ") == 1


def test_the_box_serves_a_blob_whole_or_from_a_byte_on(tmp_path: Path) -> None:
    """files/spark_serve.py: 200 whole, 206 from the Range's first byte with its Content-Range
    (RFC 9110 14.4), 416 past the end (15.5.17), 404 for a blob not there (yet)."""
    blob = bytes(range(256)) * 1000
    (tmp_path / "abc").write_bytes(blob)
    server = serve_blobs(tmp_path)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(path: str, first: int | None = None) -> tuple[int, bytes, str | None]:
        headers = {"Range": f"bytes={first}-"} if first is not None else {}
        try:
            with opener.open(urllib.request.Request(url + path, headers=headers)) as answer:
                return answer.status, answer.read(), answer.headers["Content-Range"]
        except urllib.error.HTTPError as error:
            return error.code, b"", error.headers["Content-Range"]

    try:
        assert get("/abc") == (200, blob, None)
        assert get("/abc", 1000) == (206, blob[1000:], f"bytes 1000-{len(blob) - 1}/{len(blob)}")
        assert get("/abc", len(blob))[::2] == (416, f"bytes */{len(blob)}")
        assert get("/missing")[0] == 404
        assert get("/")[0] == 404  # no listing
    finally:
        server.shutdown()
        server.server_close()


def copied_from(
    hub: Hub, cache: Path, server: http.server.ThreadingHTTPServer
) -> subprocess.CompletedProcess[str]:
    """A fleet copy into `cache` from `server`, stopped after."""
    try:
        result = fetch(hub, cache, "--source", f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert isinstance(result, subprocess.CompletedProcess)
    return result


def test_a_fleet_copy_cut_resumes_from_the_box(
    hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy cut half way asks the box for the rest (a Range, answered 206): the blob lands
    whole and checked, the part kept not sent again."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert fetch(hub, first).returncode == 0
    blobs = repo_dir(second) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{ZEROS_SHA256}.incomplete").write_bytes(bytes(WEIGHTS // 2))  # what a cut left
    result = copied_from(hub, second, serve_blobs(repo_dir(first) / "blobs"))
    assert result.returncode == 0, result.stderr
    assert (blobs / ZEROS_SHA256).stat().st_size == WEIGHTS
    # The server's log line (http.server's log_request): the rest asked, and answered 206.
    assert f'"GET /{ZEROS_SHA256} HTTP/1.1" 206 -' in capsys.readouterr().err


def cut_after_a_mebibyte() -> type:
    """A box whose link goes down a MiB into the weights: their whole length promised, 1 MiB
    sent, the connection closed; its other blobs served as files/spark_serve.py serves them."""

    class Cut(script("spark_serve").Blobs):
        def do_GET(self) -> None:
            if self.path != f"/{ZEROS_SHA256}":
                return super().do_GET()
            self.send_response(200)
            self.send_header("Content-Length", str(WEIGHTS))
            self.end_headers()
            self.wfile.write(bytes(2**20))
            self.close_connection = True

    return Cut


def test_a_transfer_cut_mid_file_fails_the_fetch_keeping_what_came(
    hub: Hub, tmp_path: Path
) -> None:
    """A sender that closes mid-file (CPython's HTTPResponse.readinto then returns 0, raising
    nothing: its comment says so) ends the fetch as a failure the status file says, and keeps
    the part, which the unit's restart resumes from: not a short file hashed, found wrong and
    deleted."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert fetch(hub, first).returncode == 0
    result = copied_from(
        hub, second, serve_blobs(repo_dir(first) / "blobs", cut_after_a_mebibyte())
    )
    assert result.returncode == 1, result.stderr
    assert f"cut off at {2**20} of {WEIGHTS} bytes; kept for the next start" in result.stderr
    status = json.loads((second / "status.json").read_text())
    assert status["state"].startswith("failed: ") and "cut off" in status["state"], status
    partial = repo_dir(second) / "blobs" / f"{ZEROS_SHA256}.incomplete"
    assert partial.stat().st_size == 2**20
    resumed = copied_from(hub, second, serve_blobs(repo_dir(first) / "blobs"))
    assert resumed.returncode == 0, resumed.stderr
    assert (repo_dir(second) / "blobs" / ZEROS_SHA256).stat().st_size == WEIGHTS


def test_the_files_are_fetched_at_once(hub: Hub, tmp_path: Path) -> None:
    """The stand-in's two files (config.json, model.safetensors) asked of the box together: its
    server answers neither until both asks are in (a barrier of two, broken after 10 s, which
    fails a fetcher that asks them one after the other)."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert fetch(hub, first).returncode == 0
    both = threading.Barrier(2, timeout=10)

    class Together(script("spark_serve").Blobs):  # type: ignore[name-defined,misc]
        def do_GET(self) -> None:
            both.wait()
            super().do_GET()

    result = copied_from(hub, second, serve_blobs(repo_dir(first) / "blobs", Together))
    assert result.returncode == 0, result.stderr
    assert (repo_dir(second) / "blobs" / ZEROS_SHA256).stat().st_size == WEIGHTS

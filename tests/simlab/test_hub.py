"""The lab's Hugging Face hub stand-in, on loopback: its URL shapes, headers, ranges, rate and
counters. The expected hashes are worked out here from the stand-in repository's content
(serving/hf_standin.py: config.json's JSON text, 256 MiB of zeros for the weights)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.simlab.hub import Hub
from tests.simlab.loopback import HTTP, free_port, request
from tests.simlab.serving import hf_standin
from tests.simlab.waits import until

REPO = "org/name"
COMMIT = hashlib.sha1(REPO.encode()).hexdigest()
CONFIG = (
    json.dumps({"_name_or_path": REPO, "simlab": "fetched by the hf stand-in"}) + "\n"
).encode()
CONFIG_GIT_ID = hashlib.sha1(b"blob %d\0" % len(CONFIG) + CONFIG).hexdigest()
ZEROS_SHA256 = hashlib.sha256(bytes(256 * 2**20)).hexdigest()


pytestmark = pytest.mark.usefixtures("gguf_model")


def test_the_listing_gives_each_file_its_size_and_hash() -> None:
    with Hub() as hub:
        status, body, _ = request(f"{hub.url}/api/models/{REPO}/revision/main?blobs=true")
    assert status == 200
    info = json.loads(body)
    assert info["sha"] == COMMIT
    siblings = {sibling["rfilename"]: sibling for sibling in info["siblings"]}
    assert siblings["config.json"] == {
        "rfilename": "config.json",
        "size": len(CONFIG),
        "blobId": CONFIG_GIT_ID,
    }
    weights = siblings["model.safetensors"]
    assert weights["size"] == 256 * 2**20
    assert weights["lfs"]["sha256"] == ZEROS_SHA256


def test_a_file_with_the_hubs_headers_and_a_range() -> None:
    url = f"/{REPO}/resolve/main/config.json"
    with Hub() as hub:
        status, body, headers = request(hub.url + url)
        assert (status, body.encode()) == (200, CONFIG)
        assert headers["X-Repo-Commit"] == COMMIT
        assert headers["ETag"] == f'"{CONFIG_GIT_ID}"'
        status, body, headers = request(hub.url + url, headers={"Range": "bytes=10-"})
        assert (status, body.encode()) == (206, CONFIG[10:])
        assert headers["Content-Range"] == f"bytes 10-{len(CONFIG) - 1}/{len(CONFIG)}"
        status, _, headers = request(hub.url + url, headers={"Range": f"bytes={len(CONFIG)}-"})
        assert status == 416
        assert hub.downloads == {f"{REPO}/config.json": 2}
        assert hub.resumed == {f"{REPO}/config.json": [10]}


def test_an_lfs_file_names_its_sha256() -> None:
    with Hub() as hub:
        status, body, headers = request(
            f"{hub.url}/{REPO}/resolve/{COMMIT}/model.safetensors", headers={"Range": "bytes=0-99"}
        )
    assert (status, body) == (206, "\0" * 100)
    assert headers["X-Linked-Etag"] == f'"{ZEROS_SHA256}"'
    assert headers["X-Linked-Size"] == str(256 * 2**20)


def test_unknown_revision_and_file_answer_the_hubs_error_codes() -> None:
    with Hub() as hub:
        status, _, headers = request(f"{hub.url}/api/models/{REPO}/revision/v9")
        assert (status, headers["X-Error-Code"]) == (404, "RevisionNotFound")
        status, _, headers = request(f"{hub.url}/{REPO}/resolve/main/nothing.bin")
        assert (status, headers["X-Error-Code"]) == (404, "EntryNotFound")
        assert not hub.downloads


def test_the_rate_bounds_every_download_together() -> None:
    # 2 MiB at 1 MiB/s: two seconds at least, the bytes counted.
    with Hub(rate=2**20) as hub:
        started = time.monotonic()
        status, body, _ = request(
            f"{hub.url}/{REPO}/resolve/main/model.safetensors",
            headers={"Range": f"bytes=0-{2 * 2**20 - 1}"},
        )
        took = time.monotonic() - started
        assert (status, len(body)) == (206, 2 * 2**20)
        assert hub.sent == {f"{REPO}/model.safetensors": 2 * 2**20}
    assert took >= 1.9


def fetching(url: str, last: int) -> tuple[threading.Thread, list[bytes]]:
    """A GET of bytes 0 to ``last`` on a thread of its own, waiting a minute for each read (as
    spark_fetch.py does); its body, once whole, in the list."""
    body: list[bytes] = []
    ask = urllib.request.Request(url, headers={"Range": f"bytes=0-{last}"})

    def get() -> None:
        with HTTP.open(ask, timeout=60) as answer:
            body.append(answer.read())

    thread = threading.Thread(target=get)
    thread.start()
    return thread, body


def test_a_held_file_stops_at_its_offset_until_released() -> None:
    """Held at 1 MiB (a byte a minute while held: none within the test), a range of 4 MiB stops
    there while the repository's config.json, not held, comes; released, the rest comes."""
    weights = f"{REPO}/model.safetensors"
    with Hub(trickle=60) as hub:
        hub.hold({weights: 2**20})
        thread, body = fetching(f"{hub.url}/{REPO}/resolve/main/model.safetensors", 4 * 2**20 - 1)
        until(lambda: hub.holding == {weights: 1}, 30, "the transfer at its hold", every=0.05)
        assert hub.sent[weights] == 2**20
        assert request(f"{hub.url}/{REPO}/resolve/main/config.json")[:2] == (200, CONFIG.decode())
        assert hub.stats()["holds"] == {weights: 2**20}
        hub.hold({})
        thread.join(timeout=30)
        assert body == [bytes(4 * 2**20)]
        assert hub.sent[weights] == 4 * 2**20
        assert hub.holding == {}


def test_a_held_transfer_trickles_a_byte_at_a_time_and_a_client_cut_off_leaves_it() -> None:
    """A byte every 0.05 s past the hold: the client's reads never wait long; a client gone
    leaves the hold (nothing counted as held), the hold itself staying for the next."""
    weights = f"{REPO}/model.safetensors"
    with Hub(trickle=0.05) as hub:
        hub.hold({weights: 2**20})
        ask = urllib.request.Request(
            f"{hub.url}/{REPO}/resolve/main/model.safetensors", headers={"Range": "bytes=0-"}
        )
        with HTTP.open(ask, timeout=60) as answer:
            assert len(answer.read(2**20 + 3)) == 2**20 + 3  # the hold, then three bytes trickled
            assert hub.holding == {weights: 1}
        until(lambda: not hub.holding, 30, "the cut transfer no longer held", every=0.05)
        assert hub.holds == {weights: 2**20}
        assert 2**20 + 3 <= hub.sent[weights] < 4 * 2**20


def test_the_files_are_the_hf_standins() -> None:
    """The hub serves what the serving image's `hf` stand-in writes: same names, same blobs."""
    gguf = hf_standin.gguf_files("org/Model-GGUF")[0]
    with Hub() as hub:
        _, body, _ = request(f"{hub.url}/api/models/org/Model-GGUF/revision/main")
    siblings = json.loads(body)["siblings"]
    assert [sibling["rfilename"] for sibling in siblings] == hf_standin.gguf_files("org/Model-GGUF")
    assert siblings[0]["lfs"]["sha256"] == hf_standin.repo_file("org/Model-GGUF", gguf).blob


def test_the_labs_hub_process_tells_its_counters_and_takes_a_rate() -> None:
    """As lab.py runs it: a process of its own; a test reads and sets it over HTTP."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.simlab.hub", "--bind", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    try:
        assert process.stdout and process.stdout.readline() == f"hub at http://127.0.0.1:{port}\n"
        url = f"http://127.0.0.1:{port}"
        assert request(f"{url}/{REPO}/resolve/main/config.json")[0] == 200
        put = urllib.request.Request(f"{url}/_simlab/rate", data=b"1234", method="PUT")
        with HTTP.open(put, timeout=5) as answer:
            assert answer.status == 200
        holds = json.dumps({f"{REPO}/model.safetensors": 4096}).encode()
        put = urllib.request.Request(f"{url}/_simlab/holds", data=holds, method="PUT")
        with HTTP.open(put, timeout=5) as answer:
            assert answer.status == 200
        status, body, _ = request(f"{url}/_simlab/stats")
        assert status == 200
        assert json.loads(body) == {
            "downloads": {f"{REPO}/config.json": 1},
            "sent": {f"{REPO}/config.json": len(CONFIG)},
            "resumed": {},
            "heads": {},
            "rate": 1234,
            "holds": {f"{REPO}/model.safetensors": 4096},
            "holding": {},
        }
    finally:
        process.terminate()
        process.wait(timeout=10)

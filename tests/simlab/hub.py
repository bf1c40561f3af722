"""A Hugging Face hub stand-in for the lab: the stand-in repositories' files over HTTP, under the
hub's own URL shapes, at a bounded rate, each request counted.

The hosts reach it as the hub through the endpoint the deploy is given (HF_ENDPOINT, read by
huggingface_hub's constants.py: `ENDPOINT = os.getenv("HF_ENDPOINT", "https://huggingface.co")`);
it listens on this machine's side of the lab (loopback, or the lab's management bridge), never
beyond. The URL shapes and headers are those huggingface_hub reads (huggingface/huggingface_hub
at ee0a4510, 1.29.0.dev0):

- `GET /api/models/<id>/revision/<rev>` (hf_api.py model_info; `?blobs=true` asks each file's
  size, blob id and LFS SHA-256): the commit as `sha`, each file a sibling with `rfilename`,
  `size`, `blobId` and, for a file kept in Git LFS, `lfs: {sha256, size, pointerSize}`.
- `HEAD|GET /<id>/resolve/<rev>/<file>` (constants.py HUGGINGFACE_CO_URL_TEMPLATE): the file,
  with `X-Repo-Commit` (the commit), `ETag` (the blob's name in the cache, quoted), for an LFS
  file `X-Linked-Etag` and `X-Linked-Size` too (file_download.py get_hf_file_metadata prefers
  them), `Accept-Ranges: bytes`; a `Range: bytes=N-` or `bytes=N-M` (http_get's resume) answers
  206 with `Content-Range`. The real hub redirects an LFS file to its CDN; here it is served at
  once (the client follows the redirect to the same bytes).
- An unknown revision or file: 404 with the hub's `X-Error-Code` (RevisionNotFound,
  EntryNotFound; utils/_http.py hf_raise_for_status reads it).

The lab runs one per lab while it is up (lab.py up/down: `python -m tests.simlab.hub --bind
ADDRESS --port PORT`); a test reads its counters at `GET /_simlab/stats`, sets its rate with
`PUT /_simlab/rate` (bytes a second, the body) and holds files with `PUT /_simlab/holds` (a JSON
object, `{"<id>/<file>": offset}`; `{}` releases them all), routes the real hub does not have.
A held file's transfer stops at the offset until released, so a test, not the machine's load,
decides when a fetch lands: a stalled link, as a real one can be, but never silent for long,
trickling a byte every TRICKLE_SECONDS (spark_fetch.py's reads give up after 60 s without one).

Every repository id `org/name` exists, holding the files of the serving image's `hf` stand-in
(serving/hf_standin.py: config.json and weights, or a *-GGUF repository's GGUF files), the same
bytes and hashes. The whole hub sends at most `rate` bytes a second (one internet link, shared by
every download), so a fetch takes measurable seconds and can be cut half way.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from types import TracebackType

from tests.simlab.serving import hf_standin
from tests.simlab.threaded_server import ThreadedServer

DEFAULT_RATE = 64 * 2**20  # bytes a second: a 256 MiB stand-in weights file takes 4 s
CHUNK = 64 * 2**10
API = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/?]+)")
RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)")
RANGE = re.compile(r"bytes=(?P<start>\d+)-(?P<end>\d*)")
TRICKLE_SECONDS = 1.0  # a held transfer's byte this often (spark_fetch.py reads: timeout=60)


class Hub(ThreadedServer):
    """The stand-in hub on ``address`` (an ephemeral port unless ``port``), sending at most
    ``rate`` bytes a second. What it served, for the tests: ``downloads`` (GETs of a file's
    bytes, by `<id>/<file>`), ``sent`` (bytes handed to the connection, the same keys),
    ``resumed`` (the offsets asked by a Range, the same keys), ``heads`` (HEADs, the same
    keys), ``tokens`` (the bearer tokens requests carried), ``holding`` (the transfers
    stopped at their file's hold now, the same keys). ``holds``: where each file held stops
    (hold() sets them)."""

    def __init__(
        self,
        address: str = "127.0.0.1",
        port: int = 0,
        rate: int = DEFAULT_RATE,
        trickle: float = TRICKLE_SECONDS,
    ):
        self.rate = rate
        self.trickle = trickle
        self.holds: dict[str, int] = {}
        self.holding: Counter[str] = Counter()
        self._held = threading.Condition()
        self.downloads: Counter[str] = Counter()
        self.heads: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.resumed: dict[str, list[int]] = {}
        self.tokens: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._next_send = 0.0
        super().__init__(_handler(self), address, port)

    @property
    def url(self) -> str:
        """The endpoint the hosts are given (HF_ENDPOINT)."""
        return self.origin

    def __enter__(self) -> Hub:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def pace(self, size: int) -> None:
        """Wait for ``size`` bytes' turn on the hub's one link (every download shares it)."""
        with self._lock:
            start = max(time.monotonic(), self._next_send)
            self._next_send = start + size / self.rate
            ready = self._next_send
        time.sleep(max(0.0, ready - time.monotonic()))

    def stats(self) -> dict[str, object]:
        """What `GET /_simlab/stats` answers."""
        with self._held:
            holds, holding = dict(self.holds), dict(self.holding)
        return {"downloads": self.downloads, "sent": self.sent, "resumed": self.resumed,
                "heads": self.heads, "rate": self.rate, "holds": holds,
                "holding": holding}  # fmt: skip

    def hold(self, holds: dict[str, int]) -> None:
        """Each `<id>/<file>` named stops at its offset, the others go on: in place of any
        hold before (``{}`` releases every transfer held)."""
        with self._held:
            self.holds = dict(holds)
            self._held.notify_all()

    def pieces(self, key: str, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The (start, end) byte ranges a transfer of ``key`` sends in turn: CHUNK at most, none
        past the file's hold; there, one byte every ``trickle`` seconds until released."""
        offset, held = start, False
        try:
            while offset < end:
                with self._held:
                    at = self.holds.get(key)
                    if at is not None and offset >= at:
                        if not held:
                            self.holding[key] += 1
                            held = True
                        self._held.wait(self.trickle)
                        at = self.holds.get(key)
                    if held and (at is None or offset < at):
                        self._leave(key)
                        held = False
                if held:
                    stop = offset + 1
                else:
                    stop = min(offset + CHUNK, end, at if at is not None else end)
                yield offset, stop
                offset = stop
        finally:
            if held:
                with self._held:
                    self._leave(key)

    def _leave(self, key: str) -> None:
        self.holding[key] -= 1
        if not self.holding[key]:
            del self.holding[key]


def listing(repo_id: str) -> dict[str, object]:
    """The hub's answer to `/api/models/<id>/revision/<rev>?blobs=true`."""
    siblings = []
    for name in hf_standin.repository_files(repo_id):
        file = hf_standin.repo_file(repo_id, name)
        sibling: dict[str, object] = {"rfilename": name, "size": file.size}
        if file.lfs:
            # An LFS file's Git blob is its pointer; the hub gives its content's SHA-256.
            sibling["lfs"] = {"sha256": file.blob, "size": file.size, "pointerSize": 134}
        else:
            sibling["blobId"] = file.blob
        siblings.append(sibling)
    commit = hf_standin.revision(repo_id)
    return {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit,
            "siblings": siblings}  # fmt: skip


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the tests read the counters."""

        def do_GET(self) -> None:
            self._answer(send=True)

        def do_HEAD(self) -> None:
            self._answer(send=False)

        def _answer(self, send: bool) -> None:
            token = self.headers.get("Authorization", "")
            if token.startswith("Bearer "):
                hub.tokens[token.removeprefix("Bearer ")] += 1
            path = self.path.split("?")[0]
            if path == "/_simlab/stats":
                self._reply(HTTPStatus.OK, json.dumps(hub.stats()).encode(), send)
            elif api := API.fullmatch(path):
                self._json(api["repo"], api["rev"], send)
            elif resolve := RESOLVE.fullmatch(path):
                self._file(resolve["repo"], resolve["rev"], resolve["file"], send)
            else:
                self._error(HTTPStatus.NOT_FOUND, "RepoNotFound", f"{path}: no such route")

        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path == "/_simlab/rate":
                hub.rate = int(body)
            elif self.path == "/_simlab/holds":
                hub.hold(json.loads(body))
            else:
                self._error(HTTPStatus.NOT_FOUND, "RepoNotFound", f"{self.path}: no such route")
                return
            self._reply(HTTPStatus.OK, b"{}", True)

        def _reply(self, status: HTTPStatus, body: bytes, send: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send:
                self.wfile.write(body)

        def _known(self, repo_id: str, rev: str) -> bool:
            if rev in ("main", hf_standin.revision(repo_id)):
                return True
            self._error(HTTPStatus.NOT_FOUND, "RevisionNotFound", f"{repo_id}: no revision {rev}")
            return False

        def _json(self, repo_id: str, rev: str, send: bool) -> None:
            if not self._known(repo_id, rev):
                return
            self._reply(HTTPStatus.OK, json.dumps(listing(repo_id)).encode(), send)

        def _file(self, repo_id: str, rev: str, name: str, send: bool) -> None:
            if not self._known(repo_id, rev):
                return
            if name not in hf_standin.repository_files(repo_id):
                self._error(HTTPStatus.NOT_FOUND, "EntryNotFound", f"{repo_id}: no file {name}")
                return
            file = hf_standin.repo_file(repo_id, name)
            key = f"{repo_id}/{name}"
            start, end = 0, file.size
            asked = RANGE.fullmatch(self.headers.get("Range", ""))
            if asked:
                start = int(asked["start"])
                end = min(int(asked["end"]) + 1, file.size) if asked["end"] else file.size
                if start >= file.size or start >= end:
                    self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                    self.send_header("Content-Range", f"bytes */{file.size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            self.send_response(HTTPStatus.PARTIAL_CONTENT if asked else HTTPStatus.OK)
            self.send_header("X-Repo-Commit", hf_standin.revision(repo_id))
            self.send_header("ETag", f'"{file.blob}"')
            if file.lfs:
                self.send_header("X-Linked-Etag", f'"{file.blob}"')
                self.send_header("X-Linked-Size", str(file.size))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start))
            if asked:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{file.size}")
            self.end_headers()
            if not send:
                hub.heads[key] += 1
                return
            hub.downloads[key] += 1
            if asked:
                hub.resumed.setdefault(key, []).append(start)
            with closing(hub.pieces(key, start, end)) as pieces:  # a hold left when cut off
                for offset, stop in pieces:
                    piece = file.read(offset, stop)
                    hub.pace(len(piece))
                    hub.sent[key] += len(piece)  # before: the client may count it at once
                    try:
                        self.wfile.write(piece)
                    except (BrokenPipeError, ConnectionResetError):
                        return  # the client was cut off

        def _error(self, status: HTTPStatus, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


def main(argv: list[str] | None = None) -> None:
    """The lab's hub, until killed (lab.py starts and stops it)."""
    parser = argparse.ArgumentParser(prog="python -m tests.simlab.hub")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=int, default=DEFAULT_RATE)
    args = parser.parse_args(argv)
    hub = Hub(args.bind, args.port, args.rate)
    print(f"hub at {hub.url}", flush=True)
    hub.serve_until_stopped()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""A model's weights fetched into a box's Hugging Face cache, resumable, with progress.

    spark_fetch.py MODEL [FILE...] --cache DIR [--endpoint URL] [--token-file PATH]
                   [--source URL] [--status PATH]

Run by the box's spark-fetch@ unit (operations/weights.py), as root, with the standard library
alone (the host's python3; no serving image needed). It writes the layout huggingface_hub's
`hf download` leaves, so a lane finds the model where it always has (huggingface/huggingface_hub
at ee0a4510, file_download.py and _snapshot_download.py): each file a blob under
`DIR/hub/models--org--name/blobs/`, named by its hash (the SHA-256 of a file kept in Git LFS,
the Git blob id of any other), linked from `snapshots/<commit>/<file>`, and `refs/main` naming
the commit.

Why not `hf download` itself: since huggingface_hub 1.18.0 (PR #4306, "download to a
process-unique tmp file") a download cut off is deleted and starts over; before it, a
`<blob>.incomplete` file was resumed. Weights of 60 to 130 GB need the resume, whatever
version the serving image holds, so this keeps `<blob>.incomplete` (the older name) and asks the
rest with `Range: bytes=N-`, as file_download.py's http_get did.

- The listing and every file's hash come from the hub (ENDPOINT/api/models/<id>/revision/main
  ?blobs=true, hf_api.py model_info); each file from ENDPOINT/<id>/resolve/<commit>/<file>
  (constants.py HUGGINGFACE_CO_URL_TEMPLATE), or with --source from another box of the fleet
  serving its cache's blobs (SOURCE/<blob>): the fabric's copy, checked against the hub's
  hashes all the same, each file asked again every WAIT_SECONDS while that box has not got it
  (it fetches it from the hub meanwhile). A file that does not match its hash is deleted and
  the fetch fails.
- FILES_AT_ONCE files are fetched at once, each hashed as it comes (one pass over its bytes),
  each blob once however many files have its content.
- The token, if any, is read from --token-file and sent as `Authorization: Bearer` to the hub
  only (never to a CDN it redirects to, nor to another box).
- Progress: a line every PROGRESS_SECONDS to stdout (the unit's journal), and --status, a JSON
  file the deploy reads: the hub's total, the bytes on disk, the rate, the state.

Exit status 0 once every file is in place and checked; 1 otherwise (the unit restarts it, and it
goes on from where it was).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from email.message import Message
from http.client import HTTPException, HTTPResponse
from typing import IO, Any

# Each read written, then hashed, while it is still in the CPU's cache: in the receiving thread,
# 256 KiB a read (bench/copy_rate.py on a 2-core machine: a third less CPU than 1 MiB reads
# with the hash in a second thread, whose hand-over of each chunk costs more than it saves when
# no core is idle; 64 KiB and 4 MiB reads cost more).
CHUNK = 256 << 10
# With a core to spare for each file, each 1 MiB chunk is hashed by a second thread while the
# next is received and written (hashlib lets go of the GIL while it hashes more than 2047 bytes,
# CPython Modules/hashlib.h HASHLIB_GIL_MINSIZE): a file then comes at the rate of its SHA-256
# alone (a GB/s or so on one core), not of its hash, receipt and write one after the other.
SPLIT_CHUNK = 1 << 20
PROGRESS_SECONDS = 5.0
WAIT_SECONDS = 1.0  # between asks of a box that has not got a file yet
# huggingface_hub's default endpoint (constants.py: _HF_DEFAULT_ENDPOINT).
HUB = "https://huggingface.co"


class Failed(Exception):
    """The fetch stops, saying why."""


class NotYet(Exception):
    """The box copied from has not got the file yet (it is fetching it from the hub)."""


class HubOnlyAuth(urllib.request.HTTPRedirectHandler):
    """Follow a redirect, without the token where it leaves the host it was given to."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != req.host:
            new.remove_header("Authorization")
        return new


# Direct: a box's proxy settings are not this unit's, and a fleet copy goes over the fabric.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), HubOnlyAuth())


def request(url: str, token: str | None, start: int = 0) -> urllib.request.Request:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if start:
        headers["Range"] = f"bytes={start}-"
    return urllib.request.Request(url, headers=headers)


def listing(endpoint: str, model: str, token: str | None) -> tuple[str, dict[str, dict]]:
    """The hub's commit of `main` and each file's {size, blob, lfs}."""
    url = f"{endpoint}/api/models/{model}/revision/main?blobs=true"
    try:
        with OPENER.open(request(url, token), timeout=60) as answer:
            info = json.load(answer)
    except OSError as error:
        raise Failed(f"{url}: {error}") from error
    files = {}
    for sibling in info.get("siblings", []):
        lfs = sibling.get("lfs")
        blob = lfs["sha256"] if lfs else sibling.get("blobId")
        if not blob or sibling.get("size") is None:
            raise Failed(f"{url}: {sibling.get('rfilename')} has no size or hash (blobs=true)")
        files[sibling["rfilename"]] = {"size": sibling["size"], "blob": blob, "lfs": bool(lfs)}
    return info["sha"], files


def wanted(files: dict[str, dict], names: list[str]) -> dict[str, dict]:
    """The files named (a GGUF's parts, or patterns), else every file of the repository."""
    if not names:
        return files
    chosen = {
        name: spec
        for name, spec in files.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in names)
    }
    if missing := [n for n in names if not any(fnmatch.fnmatchcase(f, n) for f in files)]:
        raise Failed(f"not in the repository: {', '.join(missing)}")
    return chosen


def hasher(spec: dict) -> Any:  # hashlib names no public type for its objects
    """What names the blob: SHA-256 of an LFS file, the Git blob id (SHA-1 of "blob <size>\\0"
    and the content) of any other."""
    if spec["lfs"]:
        return hashlib.sha256()
    return hashlib.sha1(b"blob %d\0" % spec["size"])


class Progress:
    """Bytes on disk against the total, a line every PROGRESS_SECONDS, the status file."""

    def __init__(self, model: str, total: int, done: int, status: str | None):
        self.model, self.total, self.done, self.status = model, total, done, status
        self.started, self.at_start = time.monotonic(), done
        self.last = 0.0
        self.lock = threading.Lock()

    def rate(self) -> float:
        return (self.done - self.at_start) / max(time.monotonic() - self.started, 1e-6)

    def add(self, size: int, state: str = "fetching", force: bool = False) -> None:
        with self.lock:  # the files fetched at once add to it from their threads
            self.done += size
            if not force and time.monotonic() - self.last < PROGRESS_SECONDS:
                return
            self.last = time.monotonic()
            self.report(state)

    def report(self, state: str) -> None:
        share = 100 * self.done / self.total if self.total else 100.0
        print(
            f"{self.model}: {self.done} of {self.total} bytes ({share:.0f}%),"
            f" {self.rate() / 1e6:.1f} MB/s, {state}",
            flush=True,
        )
        if self.status:
            record = {
                "model": self.model,
                "total": self.total,
                "done": self.done,
                "rate": round(self.rate()),
                "state": state,
                "time": int(time.time()),
            }
            with open(f"{self.status}.new", "w") as out:
                json.dump(record, out)
            os.replace(f"{self.status}.new", self.status)


def files_at_once(cores: int) -> int:
    """Files fetched at once: half the usable cores, at least four. One SHA-256 runs at a GB/s
    or so a core, so four files cap a copy near 5 GB/s (the copy bench: 29% of a 16-core
    machine's loopback) where a Spark's fabric runs at 25 GB/s (issue 13: 200 Gb/s); a Spark's
    20 cores (field-facts.md: 10 X925 + 10 A725) fetch ten, each received on one core and
    hashed on another (hash_apart). huggingface_hub's snapshot_download asks eight at once
    (_snapshot_download.py: max_workers=8), so ten is no burden on the hub."""
    return max(4, cores // 2)


def hash_apart(cores: int, files: int) -> bool:
    """Hash in a second thread per file only where each file's two threads have a core each."""
    return cores >= 2 * files


# The cores this process may run on (Python's os.cpu_count docs: "the number of usable CPUs can
# be obtained with len(os.sched_getaffinity(0))"), not the machine's.
CORES = len(os.sched_getaffinity(0))
FILES_AT_ONCE = files_at_once(CORES)
HASH_APART = hash_apart(CORES, FILES_AT_ONCE)


def stream(
    answer: HTTPResponse, out: IO[bytes], digest: Any, progress: Progress, apart: bool = HASH_APART
) -> None:
    """The answer's bytes written to `out` and hashed, one pass over each byte: each read hashed
    in this thread once written, or (`apart`) in a second thread while the next is received into
    the other of two buffers and written."""
    if not apart:
        buffer = memoryview(bytearray(CHUNK))
        while size := answer.readinto(buffer):
            out.write(buffer[:size])
            digest.update(buffer[:size])
            progress.add(size)
        return
    buffers = [memoryview(bytearray(SPLIT_CHUNK)), memoryview(bytearray(SPLIT_CHUNK))]
    hashing: Future | None = None
    which = 0
    with ThreadPoolExecutor(1) as hasher_thread:
        while size := answer.readinto(buffers[which]):
            chunk = buffers[which][:size]
            if hashing:
                hashing.result()  # the other buffer hashed: it may be filled again
            hashing = hasher_thread.submit(digest.update, chunk)
            out.write(chunk)
            progress.add(size)
            which ^= 1
        if hashing:
            hashing.result()


def fetch_file(url: str, token: str | None, path: str, spec: dict, progress: Progress) -> None:
    """The blob at `path`, from `url`, resumed from `path`.incomplete; checked, then renamed."""
    partial = f"{path}.incomplete"
    digest = hasher(spec)
    start = os.path.getsize(partial) if os.path.exists(partial) else 0
    if start > spec["size"]:
        os.unlink(partial)
        start = 0
    try:
        answer = OPENER.open(request(url, token, start), timeout=60)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise NotYet(url) from error
        raise Failed(f"{url}: {error}") from error
    except OSError as error:
        raise Failed(f"{url}: {error}") from error
    with answer, open(partial, "ab") as out:
        if start and answer.status != 206:  # the Range was ignored: from the start
            progress.add(-start)
            out.truncate(0)
            start = 0
        with open(partial, "rb") as done:  # what the cut-off fetch left, into the hash
            while start and (chunk := done.read(min(CHUNK, start - done.tell()))):
                digest.update(chunk)
        try:
            stream(answer, out, digest, progress)
        except (OSError, HTTPException) as error:  # a read timed out, a link reset
            raise Failed(
                f"{url}: cut off ({error!r}); what came is kept for the next start"
            ) from error
    got = os.path.getsize(partial)
    if got < spec["size"]:  # the sender closed early: http.client's readinto says nothing
        raise Failed(f"{url}: cut off at {got} of {spec['size']} bytes; kept for the next start")
    if got != spec["size"] or digest.hexdigest() != spec["blob"]:
        os.unlink(partial)
        raise Failed(
            f"{url}: {got} bytes hashing to {digest.hexdigest()}, the hub says {spec['size']}"
            f" bytes and {spec['blob']}: deleted, fetched again on the next start"
        )
    os.replace(partial, path)


def copy_file(url: str, path: str, spec: dict, progress: Progress) -> None:
    """The blob from another box, once it has it: asked again every WAIT_SECONDS until then."""
    waited = 0.0
    while True:
        try:
            fetch_file(url, None, path, spec, progress)
            return
        except NotYet:
            if waited % PROGRESS_SECONDS == 0:  # the journal says what it waits for
                print(f"waiting for {url}: not there yet", flush=True)
            time.sleep(WAIT_SECONDS)
            waited += WAIT_SECONDS


def one_file(
    args: argparse.Namespace,
    endpoint: str,
    commit: str,
    token: str | None,
    name: str,
    spec: dict,
    blobs: str,
    progress: Progress,
) -> None:
    """One file into `blobs`: from the box given as --source, else from the hub."""
    path = os.path.join(blobs, spec["blob"])
    if args.source:  # a fleet copy: the box's blobs, no token
        copy_file(f"{args.source.rstrip('/')}/{spec['blob']}", path, spec, progress)
    else:
        fetch_file(f"{endpoint}/{args.model}/resolve/{commit}/{name}", token, path, spec, progress)


def on_disk(blobs: str, files: dict[str, dict]) -> int:
    """Bytes of the files already in the cache, whole or begun."""
    total = 0
    for spec in files.values():
        path = os.path.join(blobs, spec["blob"])
        for candidate in (path, f"{path}.incomplete"):
            if os.path.exists(candidate):
                total += os.path.getsize(candidate)
                break
    return total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spark_fetch.py")
    parser.add_argument("model")
    parser.add_argument("files", nargs="*")
    parser.add_argument("--cache", required=True)
    parser.add_argument("--endpoint", default=os.environ.get("HF_ENDPOINT", HUB))
    parser.add_argument("--token-file")
    parser.add_argument("--source", help="another box's blobs, over the fabric")
    parser.add_argument("--status")
    args = parser.parse_args(argv)
    endpoint = args.endpoint.rstrip("/")
    token = None
    if args.token_file and os.path.exists(args.token_file):
        with open(args.token_file) as secret:
            token = secret.read().strip() or None
    repo = os.path.join(args.cache, "hub", "models--" + args.model.replace("/", "--"))
    blobs = os.path.join(repo, "blobs")
    progress = None
    try:
        commit, files = listing(endpoint, args.model, token)
        files = wanted(files, args.files)
        os.makedirs(blobs, exist_ok=True)
        total = sum(spec["size"] for spec in files.values())
        progress = Progress(args.model, total, on_disk(blobs, files), args.status)
        progress.add(0, force=True)
        # One fetch per blob: files of the same content (the hub names the same blob) would
        # otherwise write one .incomplete file from two threads at once.
        missing = {
            spec["blob"]: (name, spec)
            for name, spec in sorted(files.items())
            if not os.path.exists(os.path.join(blobs, spec["blob"]))
        }
        with ThreadPoolExecutor(FILES_AT_ONCE) as pool:
            fetches = [
                pool.submit(one_file, args, endpoint, commit, token, name, spec, blobs, progress)
                for name, spec in missing.values()
            ]
            for each in fetches:  # the first failure, once every file has stopped
                each.result()
        # The snapshot once every file is in place: a model half fetched never looks present
        # (the deploy and a lane look for the snapshot's config.json).
        for name, spec in sorted(files.items()):
            path = os.path.join(blobs, spec["blob"])
            link = os.path.join(repo, "snapshots", commit, name)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            target = os.path.relpath(path, os.path.dirname(link))
            if not os.path.islink(link) or os.readlink(link) != target:
                if os.path.lexists(link):
                    os.unlink(link)
                os.symlink(target, link)
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", "main"), "w") as ref:
            ref.write(commit)
        progress.add(0, state="done", force=True)
    except Failed as error:
        print(f"spark_fetch: {args.model}: {error}", file=sys.stderr, flush=True)
        if progress:
            progress.add(0, state=f"failed: {error}", force=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

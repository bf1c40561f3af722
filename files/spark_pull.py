#!/usr/bin/python3
"""A serving image pulled through docker's Engine API, with progress.

    spark_pull.py IMAGE --status PATH --layer DIGEST=BYTES [--layer ...]
                  [--socket PATH] [--docker-config PATH]

Run by the box's transient unit spark-pull-<image> (operations/images.py), as root, with the
standard library alone (the host's python3), so that a deploy cut off does not cut the pull: the
unit runs on, and the next deploy waits for it. It asks the daemon as `docker pull` does
(docker's Engine API v1.41, ImageCreate: POST /images/create?fromImage=<name>&tag=<tag or
digest>; docker/cli's client ImagePull sends a pinned `repo:tag@sha256:...` as fromImage=repo,
tag=sha256:..., and the daemon pulls by that digest), and reads the answer it streams: one JSON
object a line (CreateImageInfo: status, id, progressDetail {current, total}, or error).

- Credentials: the registry's entry of root's docker configuration (`docker login` writes
  auths.<registry>.auth, base64 of user:password: docker/cli's configfile), sent as the
  X-Registry-Auth header (the Engine API's "Authentication": base64url of a JSON
  {username, password, serveraddress}). Never in argv, the unit, the journal or the status.
- Progress: bytes downloaded of every layer (its manifest size once docker says it is complete
  or already on the box) against their total, the registry's manifest's layers as --layer
  (operations/images.py RegistryImage; docker names a layer in the stream by its digest's first
  12 hex digits: moby's distribution/pull_v2 layer descriptor ID, stringid.TruncateID); a line
  every JOURNAL_SECONDS to stdout (the unit's journal), and --status, a JSON file (written
  beside, then renamed) that the deploy and the metrics collector read.
- docker registers the image only once every layer is in: a pull cut half way leaves no image.

Exit status 0 once the daemon says the pull ended without error; 1 otherwise, with docker's
answer in the status file's `error` and on stderr.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import sys
import time
import urllib.parse

SOCKET = "/var/run/docker.sock"  # the daemon's default socket (dockerd --host's default)
DOCKER_CONFIG = "/root/.docker/config.json"  # root's `docker login` (docker/cli config dir)
API = "/v1.41"  # docker 20.10's API version; later daemons serve it too (API version matrix)
JOURNAL_SECONDS = 10.0
STATUS_SECONDS = 2.0
READ_TIMEOUT_S = (
    900  # the daemon writes while it downloads or extracts; silence this long is a hang
)
# What docker says of a layer whose bytes are all downloaded (distribution/xfer and
# distribution/pull_v2: "Verifying Checksum", "Download complete", then "Extracting" and "Pull
# complete"; the first two carry no progressDetail).
DOWNLOADED = {"Verifying Checksum", "Download complete", "Pull complete"}


class UnixConnection(http.client.HTTPConnection):
    """HTTP to the daemon's Unix socket."""

    def __init__(self, path: str):
        super().__init__("localhost", timeout=READ_TIMEOUT_S)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def query(image: str) -> dict[str, str]:
    """ImageCreate's fromImage and tag for registry/repository:tag[@sha256:...], as docker's
    client sends them: the digest as the tag where there is one."""
    name, _, digest = image.partition("@")
    path, _, last = name.rpartition("/")
    repository, _, tag = last.partition(":")
    return {"fromImage": f"{path}/{repository}" if path else repository, "tag": digest or tag}


def registry_auth(image: str, config_path: str) -> str | None:
    """X-Registry-Auth for the image's registry from a docker configuration's auths entry;
    None where it has none (a credential helper's store is not read here)."""
    registry = image.split("/", 1)[0]
    try:
        with open(config_path) as config:
            entry = json.load(config).get("auths", {}).get(registry, {})
    except (OSError, ValueError):
        return None
    if not entry.get("auth"):
        return None
    username, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
    header = {"username": username, "password": password, "serveraddress": registry}
    return base64.urlsafe_b64encode(json.dumps(header).encode()).decode()


def short_ids(layers: list[str]) -> dict[str, int]:
    """--layer's DIGEST=BYTES as {the id docker's stream names the layer by: bytes}."""
    found = {}
    for layer in layers:
        digest, _, size = layer.rpartition("=")
        found[digest.partition(":")[2][:12]] = int(size)
    return found


class Progress:
    """Each layer's bytes as the daemon reports them, the status file and the journal's line."""

    def __init__(self, image: str, manifest: dict[str, int], status: str):
        self.image, self.status = image, status
        self.total = sum(manifest.values())
        self.layers: dict[str, int] = {}  # bytes in, by the layer's short id
        self.sizes = dict(manifest)  # each layer's size: the manifest's, else its `Downloading`
        self.existing: set[str] = set()  # the layers docker found on the box already
        self.started = time.monotonic()
        self.written = self.said = 0.0

    def done(self) -> int:
        return sum(self.layers.values())

    def rate(self) -> float:
        """Bytes downloaded a second (a layer on the box already is none of them)."""
        downloaded = self.done() - sum(self.layers[layer] for layer in self.existing)
        return downloaded / max(time.monotonic() - self.started, 1e-6)

    def update(self, message: dict) -> None:
        """One message of the daemon's stream: a layer's bytes so far, or its whole size once
        downloaded or found on the box already."""
        layer, status = message.get("id"), message.get("status", "")
        detail = message.get("progressDetail") or {}
        if layer and status == "Downloading" and "current" in detail:
            self.layers[layer] = detail["current"]
            self.sizes.setdefault(layer, detail.get("total", 0))
        elif layer and (status in DOWNLOADED or status == "Already exists"):
            if status == "Already exists":
                self.existing.add(layer)
            self.layers[layer] = max(self.layers.get(layer, 0), self.sizes.get(layer, 0))

    def tick(self, state: str = "pulling", error: str = "", force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.written >= STATUS_SECONDS:
            self.written = now
            self.write(state, error)
        if force or now - self.said >= JOURNAL_SECONDS:
            self.said = now
            print(self.line(state), flush=True)

    def line(self, state: str) -> str:
        done = self.total if state == "done" else self.done()
        share = 100 * done / self.total if self.total else 100.0
        return (
            f"{self.image}: {done} of {self.total} bytes ({share:.0f}%),"
            f" {self.rate() / 1e6:.1f} MB/s, {state}"
        )

    def write(self, state: str, error: str) -> None:
        record = {
            "image": self.image,
            "total": self.total,
            "done": self.total if state == "done" else self.done(),
            "rate": round(self.rate()),
            "state": state,
            "error": error,
            "time": int(time.time()),
        }
        with open(f"{self.status}.new", "w") as out:
            json.dump(record, out)
        os.replace(f"{self.status}.new", self.status)


def pull(image: str, progress: Progress, socket_path: str, auth: str | None) -> str:
    """The pull, through the daemon; "" once it ended well, else docker's answer."""
    headers = {"X-Registry-Auth": auth} if auth else {}
    connection = UnixConnection(socket_path)
    try:
        connection.request(
            "POST", f"{API}/images/create?{urllib.parse.urlencode(query(image))}", headers=headers
        )
        answer = connection.getresponse()
        if answer.status != 200:  # the daemon's error body: {"message": ...}
            body = answer.read().decode(errors="replace")
            try:
                return json.loads(body).get("message", body)
            except ValueError:
                return f"{answer.status} {body}".strip()
        for line in answer:
            if not line.strip():
                continue
            message = json.loads(line)
            if "error" in message:
                return message.get("errorDetail", {}).get("message") or message["error"]
            progress.update(message)
            progress.tick()
        return ""
    except (OSError, ValueError, http.client.HTTPException) as error:
        return f"the docker daemon at {socket_path}: {error}"
    finally:
        connection.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spark_pull.py")
    parser.add_argument("image")
    parser.add_argument("--status", required=True)
    parser.add_argument("--layer", action="append", default=[], help="DIGEST=BYTES")
    parser.add_argument("--socket", default=SOCKET)
    parser.add_argument("--docker-config", default=DOCKER_CONFIG)
    args = parser.parse_args(argv)
    progress = Progress(args.image, short_ids(args.layer), args.status)
    progress.tick(force=True)
    error = pull(args.image, progress, args.socket, registry_auth(args.image, args.docker_config))
    progress.tick("failed" if error else "done", error, force=True)
    if error:
        print(f"spark_pull: {args.image}: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/python3
"""Stand-in for huggingface_hub's `hf download` in the simulated lab's serving image.

It reaches no network: it writes the layout `hf download <org/name>` leaves in the cache, as
huggingface_hub's file_download does: each file a blob named by its hash (the SHA-256 of a file
kept in Git LFS, the Git blob id of any other) under blobs/, linked from
snapshots/<revision>/<name>, and refs/main naming the revision. Its files: a config.json and
weights (model.safetensors, WEIGHTS_BYTES of zeros, written sparse: no disk is used until
another box copies them). It says whether a token file was given through HF_TOKEN_PATH, never
what it holds. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

USAGE = "usage: hf download REPO_ID"
WEIGHTS_BYTES = 256 * 2**20
CHUNK = 2**20


def cache_dir() -> Path:
    """Where huggingface_hub keeps repositories: HF_HUB_CACHE, else HF_HOME/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
    return Path(home) / "hub"


def download(repo_id: str) -> Path:
    org, _, name = repo_id.partition("/")
    if not org or not name or "/" in name:
        raise SystemExit(f"{USAGE}\nhf download: {repo_id!r} is no org/name repository id")
    token_path = os.environ.get("HF_TOKEN_PATH")
    has_token = bool(token_path) and Path(token_path).is_file()
    print(f"token: {'read from HF_TOKEN_PATH' if has_token else 'none'}", flush=True)
    revision = hashlib.sha1(repo_id.encode()).hexdigest()  # a commit id, stable per repository
    repo = cache_dir() / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    config = {"_name_or_path": repo_id, "simlab": "fetched by the hf stand-in"}
    text = (json.dumps(config) + "\n").encode()
    git_id = hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest()
    _blob(repo, snapshot / "config.json", git_id, lambda path: path.write_bytes(text))
    zeros = hashlib.sha256()
    for _ in range(WEIGHTS_BYTES // CHUNK):
        zeros.update(bytes(CHUNK))

    def sparse(path: Path) -> None:
        with path.open("wb") as out:
            out.truncate(WEIGHTS_BYTES)

    _blob(repo, snapshot / "model.safetensors", zeros.hexdigest(), sparse)
    return snapshot


def _blob(repo: Path, link: Path, name: str, write) -> None:
    """The blob `name` (written by `write` when absent) and the snapshot's link to it."""
    blob = repo / "blobs" / name
    blob.parent.mkdir(exist_ok=True)
    if not blob.exists():
        write(blob)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(blob, link.parent))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "download":
        print(USAGE, file=sys.stderr)
        return 2
    print(download(argv[1]))  # the real command ends with the snapshot's path
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/python3
"""Stand-in for huggingface_hub's `hf download` in the simulated lab's serving image.

It reaches no network: it writes the layout `hf download` leaves in the cache, as
huggingface_hub's file_download does: each file a blob named by its hash (the SHA-256 of a file
kept in Git LFS, the Git blob id of any other) under blobs/, linked from
snapshots/<revision>/<name>, and refs/main naming the revision. It says whether a token file was
given through HF_TOKEN_PATH, never what it holds. Standard library only.

The command line is huggingface_hub's (cli/download.py in huggingface_hub 2.4.0):
`hf download REPO_ID [FILENAMES...] [--include PATTERN]... [--exclude PATTERN]...`, each
pattern one value of a repeatable option (`--include A --include B`, or `--include=A`).

- No file named: snapshot_download, limited to the files matching an --include pattern and no
  --exclude one (fnmatchcase; a pattern ending in "/" takes the folder's files), or every file
  of the repository; it prints the snapshot's path.
- One file named: hf_hub_download; it prints that file's path in the snapshot.
- Several files named: snapshot_download of those; it prints the snapshot's path. Patterns
  given beside named files are ignored, with huggingface_hub's warning.

The stand-in cannot list a real repository. Its repository holds config.json and weights
(model.safetensors, WEIGHTS_BYTES of zeros, written sparse: no disk is used until another box
copies them); a repository named *-GGUF holds GGUF files instead (gguf_files), each the lab's
GGUF model (tests/simlab/lab_gguf.py: one that llama.cpp's own llama-server loads) followed by
zeros up to GGUF_BYTES. A file named on the command line is in every repository: a name ending
in .gguf is a GGUF file, any other a small text file.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

USAGE = "usage: hf download REPO_ID [FILENAMES]... [--include PATTERN]... [--exclude PATTERN]..."
WEIGHTS_BYTES = 256 * 2**20
GGUF_BYTES = 16 * 2**20
# The lab's GGUF model: in the serving image at GGUF_IN_IMAGE; the lab's hub, on the machine
# running the lab, is given the cache's copy in GGUF_MODEL_VARIABLE.
GGUF_MODEL_VARIABLE = "SIMLAB_GGUF_MODEL"
GGUF_IN_IMAGE = "/usr/local/share/hf-standin/lab-model.gguf"
GGUF_QUANTS = ("Q4_K_M", "Q8_0", "UD-Q4_K_XL")
CHUNK = 2**20


def cache_dir() -> Path:
    """Where huggingface_hub keeps repositories: HF_HUB_CACHE, else HF_HOME/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
    return Path(home) / "hub"


def gguf_files(repo_id: str) -> list[str]:
    """The GGUF files of the stand-in's *-GGUF repository: one a quantization, named after it."""
    base = repo_id.split("/")[-1]
    base = base[: -len("-GGUF")] if base.upper().endswith("-GGUF") else base
    return [f"{base}-{quant}.gguf" for quant in GGUF_QUANTS]


def repository_files(repo_id: str) -> list[str]:
    if repo_id.upper().endswith("-GGUF"):
        return gguf_files(repo_id)
    return ["config.json", "model.safetensors"]


@dataclass(frozen=True)
class RepoFile:
    """A file of a stand-in repository: ``head``, then zeros up to ``size`` bytes."""

    head: bytes
    size: int
    lfs: bool  # kept in Git LFS (weights, GGUF): its blob is named by its SHA-256

    @property
    def blob(self) -> str:
        """Its blob's name in the cache (huggingface_hub's etag): the SHA-256 of a file kept
        in Git LFS, the Git blob id (SHA-1 of "blob <size>\\0" + content) of any other."""
        return _digest(self.head, self.size, self.lfs)

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of the file."""
        end = min(end, self.size)
        inside = self.head[start:end]
        return inside + bytes(max(0, end - max(start, len(self.head))))

    def write(self, path: Path) -> None:
        """The file at ``path``, its zeros left as a hole (no disk used)."""
        with path.open("wb") as out:
            out.write(self.head)
            out.truncate(self.size)


@functools.cache
def _digest(head: bytes, size: int, lfs: bool) -> str:
    digest = hashlib.sha256(head) if lfs else hashlib.sha1(b"blob %d\0" % size + head)
    left = size - len(head)
    while left:
        digest.update(bytes(min(CHUNK, left)))
        left -= min(CHUNK, left)
    return digest.hexdigest()


@functools.cache
def gguf_model() -> bytes:
    """The lab's GGUF model, every GGUF file's first bytes."""
    return Path(os.environ.get(GGUF_MODEL_VARIABLE, GGUF_IN_IMAGE)).read_bytes()


def repo_file(repo_id: str, name: str) -> RepoFile:
    """The repository's file ``name``: a GGUF file, weights, its config, or a small text."""
    if name.endswith(".gguf"):
        return RepoFile(gguf_model(), GGUF_BYTES, lfs=True)
    if name.endswith(".safetensors"):
        return RepoFile(b"", WEIGHTS_BYTES, lfs=True)
    if name == "config.json":
        config = {"_name_or_path": repo_id, "simlab": "fetched by the hf stand-in"}
        text = (json.dumps(config) + "\n").encode()
    else:
        text = f"{name} of {repo_id}, written by the hf stand-in\n".encode()
    return RepoFile(text, len(text), lfs=False)


def revision(repo_id: str) -> str:
    """The repository's commit id: stable per repository."""
    return hashlib.sha1(repo_id.encode()).hexdigest()


def _pattern(pattern: str) -> str:
    """huggingface_hub's filter_repo_objects: a folder pattern ("art/") takes its files."""
    return pattern + "*" if pattern.endswith("/") else pattern


def selected(repo_id: str, files: list[str], include: list[str], exclude: list[str]) -> list[str]:
    """The files `hf download` fetches: those named, else the repository's that the patterns
    let through."""
    if files:
        return files
    return [
        name
        for name in repository_files(repo_id)
        if (not include or any(fnmatch.fnmatchcase(name, _pattern(p)) for p in include))
        and not any(fnmatch.fnmatchcase(name, _pattern(p)) for p in exclude)
    ]


def download(
    repo_id: str,
    files: list[str] | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
) -> Path:
    """Write the repository's selected files into the cache; the snapshot's path, or the one
    file's path where one file was named."""
    files, include, exclude = files or [], include or [], exclude or []
    org, _, name = repo_id.partition("/")
    if not org or not name or "/" in name:
        raise SystemExit(f"{USAGE}\nhf download: {repo_id!r} is no org/name repository id")
    token_path = os.environ.get("HF_TOKEN_PATH")
    has_token = bool(token_path) and Path(token_path).is_file()
    print(f"token: {'read from HF_TOKEN_PATH' if has_token else 'none'}", flush=True)
    commit = revision(repo_id)
    repo = cache_dir() / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for file in selected(repo_id, files, include, exclude):
        _blob(repo, snapshot / file, repo_file(repo_id, file))
    return snapshot / files[0] if len(files) == 1 else snapshot


def _blob(repo: Path, link: Path, file: RepoFile) -> None:
    """The file's blob (written when absent) and the snapshot's link to it."""
    blob = repo / "blobs" / file.blob
    blob.parent.mkdir(exist_ok=True)
    if not blob.exists():
        file.write(blob)
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(blob, link.parent))


def parse(argv: list[str]) -> tuple[str, list[str], list[str], list[str]]:
    """`download REPO_ID [FILENAMES]... [--include P]... [--exclude P]...` as click reads it:
    (repo id, files, include, exclude); SystemExit(2) with click's message otherwise."""
    if not argv or argv[0] != "download":
        raise SystemExit(2)
    words: list[str] = []
    patterns: dict[str, list[str]] = {"--include": [], "--exclude": []}
    rest = iter(argv[1:])
    for word in rest:
        option, has_value, value = word.partition("=")
        if option in patterns:
            if not has_value:
                value = next(rest, None)
                if value is None:
                    raise SystemExit(f"Error: Option '{option}' requires an argument.")
            patterns[option].append(value)
        elif word.startswith("-") and word != "-":
            raise SystemExit(f"Error: No such option: {option}")
        else:
            words.append(word)
    if not words:
        raise SystemExit("Error: Missing argument 'REPO_ID'.")
    return words[0], words[1:], patterns["--include"], patterns["--exclude"]


def main(argv: list[str]) -> int:
    try:
        repo_id, files, include, exclude = parse(argv)
    except SystemExit as error:
        print(USAGE, file=sys.stderr)
        if isinstance(error.code, str):
            print(error.code, file=sys.stderr)
        return 2
    for option, given in (("include", include), ("exclude", exclude)):
        if files and given:
            print(f"UserWarning: Ignoring `--{option}` since filenames have been explicitly set.",
                  file=sys.stderr)  # fmt: skip
    print(download(repo_id, files, include, exclude))  # the real command ends with the path
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

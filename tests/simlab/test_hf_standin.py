"""The serving image's `hf download` stand-in, on this machine (a cache in a temporary folder)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simlab.serving import hf_standin

STANDIN = Path(hf_standin.__file__)


pytestmark = pytest.mark.usefixtures("gguf_model")


def hf(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return subprocess.run(
        [sys.executable, str(STANDIN), *args],
        capture_output=True, text=True, timeout=60, env={**env, "HF_HOME": str(home)}, check=False,
    )  # fmt: skip


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def listing(snapshot: Path) -> dict[str, str]:
    """Each file of the snapshot and the blob its link names."""
    return {
        str(link.relative_to(snapshot)): Path(os.readlink(link)).name
        for link in sorted(snapshot.rglob("*"))
        if link.is_symlink()
    }


def test_a_repository_as_before(tmp_path: Path) -> None:
    result = hf(tmp_path, "download", "org/name")
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.splitlines()[-1])
    repo = tmp_path / "hub/models--org--name"
    assert snapshot.parent == repo / "snapshots"
    assert (repo / "refs/main").read_text() == snapshot.name
    files = listing(snapshot)
    assert sorted(files) == ["config.json", "model.safetensors"]
    weights = snapshot / "model.safetensors"
    assert weights.stat().st_size == hf_standin.WEIGHTS_BYTES
    assert files["model.safetensors"] == sha256(weights)  # an LFS file: its SHA-256
    text = (snapshot / "config.json").read_bytes()
    assert files["config.json"] == hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest()


def test_one_gguf_file_named(tmp_path: Path) -> None:
    name = "Qwen3-Coder-Next-UD-Q4_K_XL.gguf"
    result = hf(tmp_path, "download", "unsloth/Qwen3-Coder-Next-GGUF", name)
    assert result.returncode == 0, result.stderr
    # hf_hub_download: the file's path in the snapshot.
    path = Path(result.stdout.splitlines()[-1])
    assert path.name == name and path.is_symlink()
    assert path.parent.parent.name == "snapshots"
    assert listing(path.parent) == {name: sha256(path)}
    with path.open("rb") as file:
        assert file.read(4) == b"GGUF"
    blob = path.resolve()
    assert blob.parent.name == "blobs"
    assert blob.stat().st_size == hf_standin.GGUF_BYTES
    assert blob.stat().st_blocks * 512 < hf_standin.GGUF_BYTES // 4  # written sparse


def test_several_files_and_folders_named(tmp_path: Path) -> None:
    result = hf(tmp_path, "download", "org/m-GGUF", "a.gguf", "Q8/b-00001-of-00002.gguf")
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.splitlines()[-1])
    assert snapshot.parent.name == "snapshots"
    assert sorted(listing(snapshot)) == ["Q8/b-00001-of-00002.gguf", "a.gguf"]


@pytest.mark.parametrize(
    ("args", "files"),
    [
        (["--include", "*Q8_0.gguf"], ["m-Q8_0.gguf"]),
        (["--include=*Q4_K_*.gguf"], ["m-Q4_K_M.gguf", "m-UD-Q4_K_XL.gguf"]),
        (["--include", "*.gguf", "--exclude", "*UD-*"], ["m-Q4_K_M.gguf", "m-Q8_0.gguf"]),
        (["--include", "*.safetensors"], []),
    ],
)
def test_patterns_choose_among_the_repositorys_files(
    tmp_path: Path, args: list[str], files: list[str]
) -> None:
    result = hf(tmp_path, "download", "org/m-GGUF", *args)
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.splitlines()[-1])
    assert snapshot.parent.name == "snapshots"
    assert sorted(listing(snapshot)) == files


def test_patterns_beside_named_files_are_ignored(tmp_path: Path) -> None:
    result = hf(tmp_path, "download", "org/m-GGUF", "a.gguf", "--include", "*Q8_0*")
    assert result.returncode == 0
    assert "Ignoring `--include` since filenames have been explicitly set." in result.stderr
    assert Path(result.stdout.splitlines()[-1]).name == "a.gguf"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["download", "org/name", "--revision", "main"], "Error: No such option: --revision"),
        (["download", "org/name", "--include"], "Option '--include' requires an argument"),
        (["download"], "Missing argument 'REPO_ID'"),
        (["upload", "org/name"], "usage: hf download"),
    ],
)
def test_what_the_standin_refuses(tmp_path: Path, args: list[str], said: str) -> None:
    result = hf(tmp_path, *args)
    assert result.returncode == 2
    assert said in result.stderr

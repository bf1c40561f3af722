"""The llama.cpp source the lab's server is built from: how it is fetched and checked."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.simlab import llama_build, rootfs


def sdist_bytes(marker: bytes) -> bytes:
    """A source distribution's tarball: llama_cpp_python-0.3.36/README holding `marker`."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as archive:
        entry = tarfile.TarInfo("llama_cpp_python-0.3.36/README")
        entry.size = len(marker)
        archive.addfile(entry, io.BytesIO(marker))
    return packed.getvalue()


def pip_saving(tarball: bytes, commands: list[list[str]]):
    """subprocess.run as `pip download` that saves `tarball` into --dest, keeping the command."""

    def run(cmd: list[str], **_: object) -> subprocess.CompletedProcess:
        commands.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / "llama_cpp_python-0.3.36.tar.gz").write_bytes(tarball)
        return subprocess.CompletedProcess(cmd, 0)

    return run


def test_the_sdist_alone_is_taken_from_source_and_by_its_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tarball = sdist_bytes(b"the vendored llama.cpp")
    pinned = hashlib.sha256(tarball).hexdigest()
    commands: list[list[str]] = []
    monkeypatch.setattr(llama_build, "CACHE", tmp_path)
    monkeypatch.setattr(rootfs, "CACHE", tmp_path)  # for the build lock
    monkeypatch.setattr(llama_build, "SDIST_SHA256", pinned)
    monkeypatch.setattr(llama_build.subprocess, "run", pip_saving(tarball, commands))

    tree = llama_build.sdist_tree()

    assert tree == tmp_path / f"llama_cpp_python-0.3.36-{pinned[:12]}"
    assert (tree / "README").read_bytes() == b"the vendored llama.cpp"
    [command] = commands
    assert command[1:3] == ["-m", "pip"] and command[4:7] == ["--quiet", "download", "--no-deps"]
    # Only this project from source: its build backend's own needs come as wheels (with
    # `:all:` a machine without pip's cache built setuptools, hatchling... from source).
    assert command[command.index("--no-binary") + 1] == "llama-cpp-python"
    assert "--require-hashes" in command
    requirement = Path(command[command.index("-r") + 1])
    assert requirement.name == "requirement.txt"
    assert llama_build.sdist_tree() == tree and len(commands) == 1  # unpacked once


def test_a_tarball_of_another_hash_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llama_build, "CACHE", tmp_path)
    monkeypatch.setattr(rootfs, "CACHE", tmp_path)  # for the build lock
    monkeypatch.setattr(llama_build, "SDIST_SHA256", "0" * 64)
    monkeypatch.setattr(llama_build.subprocess, "run", pip_saving(sdist_bytes(b"other"), []))

    with pytest.raises(RuntimeError, match="not the pinned 0000"):
        llama_build.sdist_tree()
    assert not (tmp_path / f"llama_cpp_python-0.3.36-{'0' * 12}").exists()

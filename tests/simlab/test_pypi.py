"""The router's wheelhouse: downloaded once, and by one lab at a time."""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

import pytest

from tests.simlab import pypi, rootfs


def lock_is_held(lock: Path) -> bool:
    """Whether another open file holds `lock` (flock(2): a second open file description is
    refused an exclusive lock while the first holds one, in the same process too)."""
    with open(lock, "w") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(other, fcntl.LOCK_UN)
        return False


@pytest.fixture
def downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """pip's downloads as they were asked for: the command, and whether the cache's wheelhouse
    lock was held meanwhile; each writes one wheel into its --dest."""
    monkeypatch.setattr(rootfs, "CACHE", tmp_path / "simlab")  # where the lock is
    seen: list[dict] = []

    def run(cmd: list[str], **_: object) -> subprocess.CompletedProcess:
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / "litellm-1.0-py3-none-any.whl").write_bytes(b"wheel")
        seen.append({"cmd": cmd, "locked": lock_is_held(tmp_path / "simlab/.router-wheels.lock")})
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(pypi.subprocess, "run", run)
    return seen


def test_the_wheelhouse_is_downloaded_under_the_lock_and_only_once(
    tmp_path: Path, downloads: list[dict]
) -> None:
    directory = tmp_path / "router/wheels"

    assert pypi.wheelhouse(directory) == directory
    assert pypi.wheelhouse(directory) == directory  # the stamp: nothing downloaded again

    assert len(downloads) == 1
    assert downloads[0]["locked"] is True
    command = downloads[0]["cmd"]
    assert command[1:4] == ["-m", "pip", "download"]
    assert command[command.index("--python-version") + 1] == "3.11.2"  # Debian 12's CPython
    assert command[command.index("--dest") + 1] == str(directory)
    assert "--only-binary=:all:" in command
    assert [path.name for path in directory.glob("*.whl")] == ["litellm-1.0-py3-none-any.whl"]


def test_a_download_that_failed_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, downloads: list[dict]
) -> None:
    directory = tmp_path / "router/wheels"
    succeeded = pypi.subprocess.run

    def cut_off(cmd: list[str], **_: object) -> subprocess.CompletedProcess:
        raise subprocess.CalledProcessError(2, cmd)

    monkeypatch.setattr(pypi.subprocess, "run", cut_off)
    with pytest.raises(subprocess.CalledProcessError):
        pypi.wheelhouse(directory)
    assert not list(directory.glob(".downloaded-*"))
    assert not lock_is_held(tmp_path / "simlab/.router-wheels.lock")  # let go on the failure

    monkeypatch.setattr(pypi.subprocess, "run", succeeded)
    pypi.wheelhouse(directory)
    assert len(downloads) == 1

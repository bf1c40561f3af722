"""The lab's image builder: which host packages it installs, which mirror it takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simlab import rootfs


def test_ensure_host_tools_installs_only_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(rootfs.shutil, "which", lambda tool: None if tool == "gpgv" else tool)
    monkeypatch.setattr(rootfs.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    rootfs.ensure_host_tools()
    assert calls[0][:2] == ["apt-get", "update"]
    assert calls[1][:2] == ["apt-get", "install"] and calls[1][-1] == "gpgv"
    assert "apt-utils" not in calls[1]


def test_ensure_host_tools_does_nothing_when_all_are_present(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(rootfs.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(rootfs.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    rootfs.ensure_host_tools()
    assert calls == []


def test_mirror_comes_from_this_machines_deb822_sources(tmp_path: Path, monkeypatch) -> None:
    sources = tmp_path / "sources.list.d"
    sources.mkdir()
    (sources / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    real_path = rootfs.Path
    monkeypatch.setattr(
        rootfs, "Path", lambda p: real_path(str(p).replace("/etc/apt", str(tmp_path)))
    )
    assert rootfs.debian_mirror() == "http://mirror.example/debian"

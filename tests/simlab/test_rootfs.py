"""The lab's image builder: which host packages it installs, which mirror it takes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.simlab import rootfs


def test_ensure_host_tools_installs_only_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(rootfs, "CACHE", tmp_path)  # for the lock labs take turns on
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


def test_an_image_without_ray_is_the_default_tree_less_ray_and_with_its_release(
    tmp_path: Path,
) -> None:
    from tests.simlab import serving

    tree = tmp_path / "tree"
    kept = Path("usr/local/bin/vllm")
    release_file = serving.RELEASE_FILE.relative_to("/")
    ray_module = serving.RAY_SITE / "ray/__init__.py"
    for path in [serving.RAY_PTH, serving.RAY_BIN, ray_module, kept, release_file]:
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text("0.19.0\n")
    base = tmp_path / "serving-image-0123456789ab.tar"
    subprocess.run(["tar", "-C", str(tree), "-cf", str(base), "."], check=True)

    derived = rootfs._derived_image(base, "0.31.0", ray=False)

    listing = subprocess.run(["tar", "-tf", str(derived)], capture_output=True, text=True,
                             check=True).stdout.split()  # fmt: skip
    assert f"./{kept}" in listing and f"./{ray_module}" not in listing
    for gone in serving.RAY_PATHS:
        assert not [name for name in listing if name.startswith(f"./{gone}")], gone
    release = subprocess.run(["tar", "-xOf", str(derived), f"./{release_file}"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert release == "0.31.0\n"
    assert rootfs._derived_image(base, "0.31.0", ray=False) == derived  # built once

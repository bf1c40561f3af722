"""The lab's image builder: which host packages it installs, which mirror it takes."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.simlab import rootfs


def ran(calls: list[list[str]], python3_lacks: bool = False):
    """subprocess.run keeping each command; python3's imports fail where ``python3_lacks``."""

    def run(cmd: list[str], **_: object) -> subprocess.CompletedProcess:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, int(python3_lacks and cmd[0] == "python3"))

    return run


def test_ensure_host_tools_installs_only_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(rootfs, "CACHE", tmp_path)  # for the lock labs take turns on
    monkeypatch.setattr(rootfs.shutil, "which", lambda tool: None if tool == "gpgv" else tool)
    monkeypatch.setattr(rootfs.subprocess, "run", ran(calls))
    rootfs.ensure_host_tools()
    calls = [cmd for cmd in calls if cmd[0] != "python3"]  # python3 has its modules
    assert calls[0][:2] == ["apt-get", "update"]
    assert calls[1][:2] == ["apt-get", "install"] and calls[1][-1] == "gpgv"
    assert "apt-utils" not in calls[1]


def test_ensure_host_tools_does_nothing_when_all_are_present(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(rootfs.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(rootfs.subprocess, "run", ran(calls))
    rootfs.ensure_host_tools()
    assert calls == [["python3", "-c", "import yaml"]]  # asked, nothing installed


def test_a_module_python3_lacks_is_installed_with_its_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(rootfs, "CACHE", tmp_path)
    monkeypatch.setattr(rootfs.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(rootfs.subprocess, "run", ran(calls, python3_lacks=True))
    rootfs.ensure_host_tools()
    assert calls[-1][:2] == ["apt-get", "install"] and calls[-1][-1] == "python3-yaml"


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


def unpacked_layers(layers: list[Path], into: Path) -> Path:
    """An image's layers applied bottom first as the OCI image spec says a layer is applied
    (layer.md, Whiteouts): a `.wh.<name>` entry removes <name> of the layers below and is not
    itself kept; every other entry is extracted over what is there."""
    into.mkdir()
    for layer in layers:
        names = subprocess.run(["tar", "-tf", str(layer)], capture_output=True, text=True,
                               check=True).stdout.split()  # fmt: skip
        whiteouts = [Path(name) for name in names if Path(name).name.startswith(".wh.")]
        for whiteout in whiteouts:
            gone = into / whiteout.parent / whiteout.name.removeprefix(".wh.")
            if gone.is_dir():
                shutil.rmtree(gone)
            else:
                gone.unlink(missing_ok=True)
        excluded = [f"--exclude={whiteout.name}" for whiteout in whiteouts]
        subprocess.run(["tar", "-C", str(into), *excluded, "-xf", str(layer)], check=True)
    return into


def serving_tree_tar(tmp_path: Path, paths: list[Path], text: str = "0.19.0\n") -> Path:
    """A serving image's tar from a tree written here holding `paths` (files of `text`)."""
    tree = tmp_path / "tree"
    for path in paths:
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    base = tmp_path / "serving-image-0123456789ab.tar"
    subprocess.run(["tar", "-C", str(tree), "-cf", str(base), "."], check=True)
    return base


def test_an_image_without_ray_is_the_default_tree_less_ray_and_with_its_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.simlab import serving

    kept = Path("usr/local/bin/vllm")
    release_file = serving.RELEASE_FILE.relative_to("/")
    ray_module = serving.RAY_SITE / "ray/__init__.py"
    paths = [serving.RAY_PTH, serving.RAY_BIN, ray_module, kept, release_file]
    base = serving_tree_tar(tmp_path, paths)
    monkeypatch.setattr(rootfs, "CACHE", tmp_path)  # for the build lock
    monkeypatch.setattr(rootfs, "serving_image_tar", lambda: base)

    layers = rootfs.image_layers("nvcr.io/nvidia/vllm:26.10-py3")  # 0.31.0, no Ray (the table)

    assert layers[0] == base and len(layers) == 2
    image = unpacked_layers(layers, tmp_path / "image")
    assert (image / kept).exists() and not (image / ray_module).exists()
    for gone in serving.RAY_PATHS:
        assert not (image / gone).exists(), gone
    assert (image / release_file).read_text() == "0.31.0\n"
    # The table knows no NCCL of 26.10: the stand-in carries CUDA DL 26.03's, 2.29.7.
    assert (image / serving.TORCH_NCCL_FILE).read_text() == "2.29.7\n"
    assert not list(image.rglob(".wh.*"))
    assert rootfs.image_layers("nvcr.io/nvidia/vllm:26.10-py3") == layers  # built once
    assert rootfs.image_layers(serving.SERVING_IMAGE_TAG) == [base]


def test_a_layers_blob_is_its_tar_gzipped_with_both_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rootfs, "CACHE", tmp_path)  # for the build lock
    layer = serving_tree_tar(tmp_path, [Path("etc/release")])

    blob = rootfs.layer_blob(layer)

    packed = Path(blob["file"]).read_bytes()
    # The image spec's descriptors: digest and size of the blob as stored (gzipped); the
    # config's diff_id is the digest of the tar it unpacks to.
    assert blob["digest"] == f"sha256:{hashlib.sha256(packed).hexdigest()}"
    assert blob["size"] == len(packed)
    assert blob["diff_id"] == f"sha256:{hashlib.sha256(layer.read_bytes()).hexdigest()}"
    assert gzip.decompress(packed) == layer.read_bytes()
    assert rootfs.layer_blob(layer) == blob  # built once

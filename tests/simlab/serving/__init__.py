"""The stand-ins for NGC's vLLM images (Debian 12 with Ray and a `vllm` that serves no model),
and for the llama.cpp image of seed 002 (the same tree with a `llama-server` instead).

Real Sparks run nvcr.io/nvidia/vllm:26.04-py3 (vLLM 0.19.0) by default. The lab's registry
serves this tree under the same name (tests/simlab/registry.py), which the deploy pulls, so the
deploy's containers, `ray start` and `vllm serve` command lines run unchanged; only the engine
behind them is simulated (see vllm_standin.py). The other images of the deploy's table
(spark/vllm_release.py) are the same tree as their release and their lack of Ray make it: a
layer over it (rootfs.image_layers).

The llama.cpp image, LLAMA_IMAGE_TAG, is the same tree without Ray, `vllm`, `hf` and the vLLM
lists, with llama.cpp's own `llama-server` at /app/llama-server (built for the CPU from the
source of the commit whose options spark/data/ holds: tests/simlab/llama_build.py); its config
holds the settings of the server stage of its Dockerfile (LLAMA_IMAGE_CHANGES) but for its
HEALTHCHECK (the tree holds no curl). Every image holds the lab's GGUF model where the `hf`
stand-in reads it (hf_standin.GGUF_IN_IMAGE).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from spark.vllm_release import DATA, DEFAULT_IMAGE, IMAGES, KINDS, known_versions
from tests.simlab.paths import CACHE
from tests.simlab.serving import torch_standin
from tests.simlab.serving.hf_standin import GGUF_IN_IMAGE
from tests.simlab.serving.vllm_standin import SHARE

SERVING_IMAGE_TAG = DEFAULT_IMAGE
RAY_VERSION = "2.60.0"
# Bookworm's python3; Ray's wheels are chosen for this version and its ABI.
IMAGE_PYTHON = "3.11"
RAY_SITE = Path("opt/ray-site")
RAY_PTH = Path("usr/lib/python3/dist-packages/ray-site.pth")
RAY_BIN = Path("usr/local/bin/ray")
# What an image without Ray lacks: the paths assemble_serving_rootfs adds for it.
RAY_PATHS = (RAY_SITE, RAY_PTH, RAY_BIN)
# The option lists the deploy validates lanes against (spark/data/) are the ones the
# stand-in accepts: the same files, so the lab and the checks cannot drift apart.
RELEASE_DATA = [
    DATA / f"vllm-{version}-{kind}.json"
    for version in known_versions()
    for kind in KINDS
    if kind != "env-vars"
]
RELEASE_FILE = SHARE / "release"
# What the vLLM stand-in imports (standin_model.py), on the image's python3 path.
MODEL_MODULE = Path("usr/lib/python3/dist-packages/standin_model.py")
# PyTorch's stand-in (torch_standin.py): what files/nccl_check.py, the NCCL test, imports.
TORCH_PACKAGE = Path("usr/lib/python3/dist-packages/torch")
# Beside it, the NCCL release the image carries, which the stand-in prints as NCCL does.
TORCH_NCCL_FILE = TORCH_PACKAGE / torch_standin.NCCL_VERSION_FILE.name

# Seed 002's llama.cpp image, and the server stage of its Dockerfile (ardge-labs/
# llama-cpp-dgx-spark, Dockerfile: ENV LLAMA_ARG_HOST=0.0.0.0, WORKDIR /app, the binary at
# /app/llama-server, ENTRYPOINT ["/app/llama-server"]) as Dockerfile lines.
LLAMA_IMAGE_TAG = "ghcr.io/ardge-labs/llama-cpp-dgx-spark:server"
LLAMA_IMAGE_CHANGES = (
    "ENV LLAMA_ARG_HOST=0.0.0.0",
    "WORKDIR /app",
    'ENTRYPOINT ["/app/llama-server"]',
)
LLAMA_SERVER = Path("app/llama-server")
# What of the vLLM image's tree the llama.cpp image lacks.
NOT_IN_LLAMA_IMAGE = (
    *RAY_PATHS,
    Path("usr/local/bin/vllm"),
    Path("usr/local/bin/hf"),
    Path(GGUF_IN_IMAGE).parent.relative_to("/"),
    SHARE.relative_to("/"),
    TORCH_PACKAGE,
)


def image_changes(tag: str) -> tuple[str, ...]:
    """The Dockerfile settings of the image `tag`, which its config carries (registry.py's
    image_config; none for NGC's vLLM images, whose stand-ins run commands the deploy names)."""
    return LLAMA_IMAGE_CHANGES if tag == LLAMA_IMAGE_TAG else ()


def llama_server_adder(binary: Path) -> Callable[[Path], list[Path]]:
    """What puts the built `llama-server` (`binary`) into a tree: a function of the tree's root
    returning the paths it added (relative), for the image's tar."""

    def add(root: Path) -> list[Path]:
        (root / LLAMA_SERVER).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(binary, root / LLAMA_SERVER)
        (root / LLAMA_SERVER).chmod(0o755)
        return [LLAMA_SERVER.parent]

    return add


def release_of(tag: str) -> str:
    """The vLLM release an image of the deploy's table carries."""
    return IMAGES[tag].vllm


# Where the image table does not know an image's NCCL: the newest an NGC container's release
# note names for 2026 (CUDA DL 26.03: NCCL 2.29.7), not an older one the table might know.
DEFAULT_NCCL = "2.29.7"


def nccl_of(tag: str) -> str:
    """The NCCL release a stand-in of an image of the deploy's table carries: the table's, where
    it knows it; else DEFAULT_NCCL."""
    return IMAGES[tag].nccl or DEFAULT_NCCL


# Ray's three executables as its wheel ships them, with their symbol tables (a third of their
# 120 MB); `strip --strip-unneeded` leaves what loading and running them needs (the dynamic
# symbols), as a distribution's packages do (Debian Policy 10.1, 10.2: binaries are stripped,
# shared objects with --strip-unneeded).
RAY_UNSTRIPPED = (
    Path("ray/_raylet.so"),
    Path("ray/core/src/ray/gcs/gcs_server"),
    Path("ray/core/src/ray/raylet/raylet"),
)
# The dashboard's web UI (9 MB of static files): Ray core without ray[default] serves no
# dashboard, and nothing in the lab opens one.
RAY_DASHBOARD_UI = Path("ray/dashboard/client")
# What debootstrap leaves that nothing in the image reads, as Debian's images for Docker leave
# it out (debuerreotype: apt's lists; its slim variant: the rest): apt's package index (50 MB:
# nothing installs packages in a serving container), the packages' manual pages and info
# manuals, their documentation but for each one's copyright file, and the message translations
# (the image runs in the C locale; glibc's locale.alias, a file beside them, stays).
DEBIAN_UNREAD = (Path("var/lib/apt/lists"), Path("usr/share/man"), Path("usr/share/info"))
DEBIAN_DOC = Path("usr/share/doc")
DEBIAN_TRANSLATIONS = Path("usr/share/locale")

WHEELS = CACHE / "wheels"
RAY_COMMAND = '''#!/usr/bin/python3
"""`ray` in the serving image (Ray is installed in /opt/ray-site, found through a .pth)."""
import sys

from ray.scripts.scripts import main

sys.exit(main())
'''


def _install_ray(site: Path) -> None:
    """pip-install Ray's wheels for the image's Python into site, downloading them only once."""
    abi = "cp" + IMAGE_PYTHON.replace(".", "")
    wheels = [
        "--only-binary=:all:", "--implementation", "cp", "--python-version", IMAGE_PYTHON,
        "--abi", abi, "--platform", f"manylinux2014_{platform.machine()}", f"ray=={RAY_VERSION}",
    ]  # fmt: skip
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    install = [*pip, "install", "--no-index", "--find-links", str(WHEELS), "--upgrade",
               "--target", str(site), *wheels]  # fmt: skip
    WHEELS.mkdir(parents=True, exist_ok=True)
    cached = subprocess.run(install, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    if cached.returncode != 0:
        subprocess.run([*pip, "download", "--dest", str(WHEELS), *wheels],
                       stdin=subprocess.DEVNULL, check=True)  # fmt: skip
        subprocess.run(install, stdin=subprocess.DEVNULL, check=True)


def _slim_ray(site: Path) -> None:
    """Take out of Ray's install in `site` what the lab never runs, and strip its executables."""
    # Console scripts naming this machine's interpreter, and Ray's Java runtime (33 MB) that
    # nothing here starts.
    shutil.rmtree(site / "bin")
    shutil.rmtree(site / "ray/jars")
    shutil.rmtree(site / RAY_DASHBOARD_UI)
    subprocess.run(
        ["strip", "--strip-unneeded", *(str(site / path) for path in RAY_UNSTRIPPED)],
        stdin=subprocess.DEVNULL, check=True,
    )  # fmt: skip


def _slim_debian(rootfs: Path) -> None:
    """Take out of debootstrap's tree what no serving container reads."""
    unread = [entry for path in DEBIAN_UNREAD for entry in (rootfs / path).glob("*")]
    # A package's doc directory may be a link to another's: its files are that one's.
    docs = [package for package in (rootfs / DEBIAN_DOC).glob("*") if not package.is_symlink()]
    unread += [doc for package in docs for doc in package.glob("*") if doc.name != "copyright"]
    unread += [
        language for language in (rootfs / DEBIAN_TRANSLATIONS).glob("*") if language.is_dir()
    ]
    for entry in unread:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def assemble_serving_rootfs(rootfs: Path, gguf_model: Path) -> None:
    """Make a debootstrapped Debian 12 tree with python3 the serving image.

    Empties what debootstrap left that no container reads (_slim_debian), adds Ray (core only:
    `ray start` runs without the dashboard extras; stripped, _slim_ray), a `ray` command, the
    `vllm` stand-in and the option list it checks command lines against, the `hf download`
    stand-in, the stand-ins' model (standin_model.py) and PyTorch's (torch_standin.py, the NCCL
    test's) on python3's path, and the lab's GGUF model (`gguf_model`) for the `hf` stand-in.
    """
    if not (rootfs / f"usr/bin/python{IMAGE_PYTHON}").exists():
        raise RuntimeError(f"{rootfs} has no python{IMAGE_PYTHON}, which Ray's wheels are for")
    _slim_debian(rootfs)
    site = rootfs / RAY_SITE
    _install_ray(site)
    _slim_ray(site)
    pth = rootfs / RAY_PTH
    pth.parent.mkdir(parents=True, exist_ok=True)
    pth.write_text(f"/{RAY_SITE}\n")
    _executable(rootfs / RAY_BIN, RAY_COMMAND)
    _executable(
        rootfs / "usr/local/bin/vllm", (Path(__file__).parent / "vllm_standin.py").read_text()
    )
    _executable(rootfs / "usr/local/bin/hf", (Path(__file__).parent / "hf_standin.py").read_text())
    (rootfs / MODEL_MODULE).write_text((Path(__file__).parent / "standin_model.py").read_text())
    (rootfs / TORCH_PACKAGE).mkdir(parents=True, exist_ok=True)
    (rootfs / TORCH_PACKAGE / "__init__.py").write_text(
        (Path(__file__).parent / "torch_standin.py").read_text()
    )
    (rootfs / TORCH_NCCL_FILE).write_text(nccl_of(SERVING_IMAGE_TAG) + "\n")
    share = rootfs / SHARE.relative_to("/")
    share.mkdir(parents=True, exist_ok=True)
    for data in RELEASE_DATA:
        shutil.copyfile(data, share / data.name)
    (rootfs / RELEASE_FILE.relative_to("/")).write_text(release_of(SERVING_IMAGE_TAG) + "\n")
    (rootfs / GGUF_IN_IMAGE[1:]).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gguf_model, rootfs / GGUF_IN_IMAGE[1:])

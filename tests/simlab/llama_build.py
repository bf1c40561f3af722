"""llama.cpp's own `llama-server` for the lab's llama.cpp image, and the GGUF model it serves.

The source is the llama.cpp that llama-cpp-python 0.3.36 vendors (its CHANGELOG: commit
0c1e57098, the commit whose argument table is spark/data/), taken from its source distribution
on PyPI, whose SHA-256 is pinned here and checked before the tree is used. It is built once per
machine into the lab's cache, for the CPU (the lab has no GPU; the HTTP server, its options,
--api-key, --metrics, /health, slots and chat templates are the CUDA build's), and linked so that
it runs in the serving image's Debian 12 tree: llama.cpp's and ggml's libraries static
(BUILD_SHARED_LIBS=OFF), no OpenMP (libgomp is not in the image: ggml's own thread pool), no
OpenSSL (the lab serves plain HTTP behind its front); what is left is libc, libm, libstdc++ and
libgcc_s, which the image's apt already needs.

The model is written with the `gguf` package of the same source tree (gguf-py), in a Python of
the cache's own (lab_gguf.py says what it holds), since gguf needs numpy and PyYAML, which the
project's own environment does not carry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from spark.llamacpp_release import DEFAULT_COMMIT
from tests.simlab.paths import CACHE, log
from tests.simlab.rootfs import building, cache_key, cached, ensure_host_tools

# llama-cpp-python's source distribution on PyPI; its SHA-256, as pip downloaded it here.
SDIST_PROJECT = "llama-cpp-python"
SDIST_REQUIREMENT = f"{SDIST_PROJECT}==0.3.36"
SDIST_NAME = "llama_cpp_python-0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_TREE = Path("vendor/llama.cpp")  # in the unpacked sdist
# What the build prints as its version (common/build-info.cpp.in: LLAMA_BUILD_NUMBER and
# LLAMA_COMMIT); the sdist holds no git history, from which cmake/build-info.cmake reads them.
BUILD_NUMBER = 1
BUILD_COMMIT = DEFAULT_COMMIT[:7]
# CMakeLists.txt's and ggml's options: CPU only, portable (GGML_NATIVE=OFF: not tuned to this
# machine's CPU), static, no OpenMP or OpenSSL (above), no tests, examples or web UI (the UI
# would be downloaded: LLAMA_USE_PREBUILT_UI fetches it from a Hugging Face bucket). Release at
# -O1 instead of CMake's -O3, NDEBUG kept: the same program for the lab's 0.5 MB model, compiled
# for 59% of the CPU (four of its largest units, ops.cpp, server-context.cpp, arg.cpp and
# httplib.cpp: 69 against 117 CPU s here; -O0 took 49 but leaves ggml's kernels unoptimized).
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_OPENMP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}",
    f"-DLLAMA_BUILD_COMMIT={BUILD_COMMIT}",
)
BUILD_JOBS = "2"
# Their own locks: the lab's other builds (base images) do not wait on the server's minutes,
# nor the model on them.
LOCK = ".llama-build.lock"
SERVER_LOCK = ".llama-server.lock"
# The gguf package's own needs (gguf-py/pyproject.toml: numpy >= 2.2.6, pyyaml >= 5.1; tqdm and
# requests are imported only by its scripts), pinned.
GGUF_NEEDS = ("numpy==2.4.6", "pyyaml==6.0.3")


def sdist_tree() -> Path:
    """The unpacked source distribution (downloaded once, its SHA-256 checked first)."""
    target = CACHE / f"{SDIST_NAME}-{SDIST_SHA256[:12]}"
    if cached(target):
        return target
    with building(target, LOCK) as needed:
        if needed:
            staging = CACHE / "llama-sdist.staging"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            archive = _download_sdist(staging)
            with tarfile.open(archive) as tar:
                tar.extractall(staging, filter="data")
            (staging / SDIST_NAME).rename(target)
            shutil.rmtree(staging)
    return target


def _download_sdist(into: Path) -> Path:
    # --require-hashes: pip refuses any other file; the check below is the project's own.
    # --no-binary names the project alone: pip reads the sdist's metadata with its build backend
    # (scikit-build-core), whose own build needs then come as wheels; with `:all:` pip built
    # every one of them from source on a machine with no pip cache (setuptools, hatchling,
    # flit_core...: still going after 7 minutes, where the download itself takes 11 s).
    pinned = into / "requirement.txt"
    pinned.write_text(f"{SDIST_REQUIREMENT} --hash=sha256:{SDIST_SHA256}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", "download",
         "--no-deps", "--no-binary", SDIST_PROJECT, "--require-hashes",
         "-r", str(pinned), "--dest", str(into)],
        check=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    archive = into / f"{SDIST_NAME}.tar.gz"
    found = hashlib.sha256(archive.read_bytes()).hexdigest()
    if found != SDIST_SHA256:
        raise RuntimeError(f"{archive.name}: sha256 {found}, not the pinned {SDIST_SHA256}")
    return archive


def llama_server() -> Path:
    """The built `llama-server` (built on first use, several minutes: BUILD_JOBS jobs)."""
    target = (
        CACHE / f"llama-server-{cache_key(SDIST_SHA256.encode(), *map(str.encode, CMAKE_OPTIONS))}"
    )
    binary = target / "llama-server"
    if cached(target):
        return binary
    source = sdist_tree() / LLAMA_TREE
    with building(target, SERVER_LOCK) as needed:
        if needed:
            ensure_host_tools()  # cmake and g++ among them
            # Kept when a build is cut off: the next one goes on from the objects it left.
            staging = CACHE / "llama-server.staging"
            # Lowest priority: the machine's other work (other labs, tests) goes first.
            nice = ["nice", "-n", "19"]
            configure = ["cmake", "-S", str(source), "-B", str(staging), *CMAKE_OPTIONS]
            subprocess.run([*nice, *configure], check=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            log(f"building llama-server ({BUILD_JOBS} jobs; about ten minutes on two cores)")
            start = time.monotonic()
            subprocess.run([*nice, "cmake", "--build", str(staging), "--target", "llama-server",
                            "-j", BUILD_JOBS], check=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            log(f"llama-server built in {time.monotonic() - start:.0f} s")
            target.with_suffix(".partial").mkdir(exist_ok=True)
            shutil.copy2(staging / "bin/llama-server", target.with_suffix(".partial"))
            target.with_suffix(".partial").rename(target)
            shutil.rmtree(staging)
    return binary


def gguf_python() -> Path:
    """A Python with gguf's needs (GGUF_NEEDS), made once in the cache; gguf itself is the
    sdist's gguf-py, on PYTHONPATH (gguf_env)."""
    target = CACHE / f"gguf-python-{cache_key(*map(str.encode, GGUF_NEEDS))}"
    python = target / "bin/python"
    if cached(target):
        return python
    with building(target, LOCK) as needed:
        if needed:
            staging = CACHE / "gguf-python.staging"
            shutil.rmtree(staging, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True)
            subprocess.run([str(staging / "bin/python"), "-m", "pip", "install", "--quiet",
                            "--disable-pip-version-check", *GGUF_NEEDS], check=True,
                           stdin=subprocess.DEVNULL)  # fmt: skip
            staging.rename(target)
    return python


def gguf_env() -> dict[str, str]:
    """The environment in which gguf_python() imports the sdist's gguf."""
    return {**os.environ, "PYTHONPATH": str(sdist_tree() / LLAMA_TREE / "gguf-py")}


def lab_model() -> Path:
    """The lab's GGUF model (lab_gguf.py), written once into the cache."""
    writer = Path(__file__).with_name("lab_gguf.py")
    inputs = [SDIST_SHA256.encode(), *map(str.encode, GGUF_NEEDS), writer.read_bytes()]
    target = CACHE / f"lab-model-{cache_key(*inputs)}.gguf"
    if cached(target):
        return target
    # Both before the lock: each takes it where it is not built yet, and a second flock of one
    # thread's would wait on itself (the set-up builds the source beside this, caches.PHASES).
    python, env = gguf_python(), gguf_env()
    with building(target, LOCK) as needed:
        if needed:
            partial = target.with_suffix(".partial")
            subprocess.run([str(python), str(writer), "write", str(partial)], check=True,
                           env=env, stdin=subprocess.DEVNULL)  # fmt: skip
            partial.rename(target)
    return target


def describe_model(path: Path) -> dict[str, object]:
    """What gguf's own reader finds in the GGUF file at `path` (lab_gguf.py describe)."""
    writer = Path(__file__).with_name("lab_gguf.py")
    command = [str(gguf_python()), str(writer), "describe", str(path)]
    described = subprocess.run(command, env=gguf_env(), capture_output=True, text=True, check=True)
    return json.loads(described.stdout)

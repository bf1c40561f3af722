"""Every build the lab and the tests take from the caches outside the clone, made in one go:
`make test`'s set-up (`python -m tests.simlab caches`), before its workers start, so that a
fresh machine builds each thing once, in this order, and the suite's own minutes are its tests'.

Each build is also made on first use where it is needed (and locked there: labs started side by
side wait for one build), so a lab or a test run without this step still works; this step only
takes the builds out of the tests' time and says what each took, the machine's load beside it
(a cold machine's figure: docs/lab.md, "On a fresh machine").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from time import monotonic

from tests.simlab import llama_build, pypi, registry
from tests.simlab.paths import log
from tests.simlab.rootfs import (
    ensure_host_tools,
    prometheus_binaries,
    serving_image_tar,
    spark_base,
    stand_in_repositories,
)


def registry_images() -> None:
    """Every image the lab's registry serves, its layers gzipped as the registry keeps them."""
    for image in registry.images():
        registry.layer_blobs(image)


# What `make test` needs, each after what it uses: the host packages first (the builds' tools),
# the lab's GGUF before the serving image (its `hf` stand-in holds the model).
BUILDS: tuple[tuple[str, Callable[[], object]], ...] = (
    ("host packages", ensure_host_tools),
    ("stand-in NVIDIA repositories", stand_in_repositories),
    ("bare Spark image", spark_base),
    ("registry program", registry.binary),
    ("prometheus", prometheus_binaries),
    ("llama.cpp source", llama_build.sdist_tree),
    ("gguf's Python", llama_build.gguf_python),
    ("the lab's GGUF", llama_build.lab_model),
    ("serving image", serving_image_tar),
    ("llama-server", llama_build.llama_server),
    ("registry's layers", registry_images),
    ("router wheelhouse", pypi.wheelhouse),
)


def build_all(builds: Sequence[tuple[str, Callable[[], object]]] = BUILDS) -> dict[str, float]:
    """Each build in turn (nothing where it is cached); the seconds each took."""
    seconds: dict[str, float] = {}
    for name, build in builds:
        started = monotonic()
        build()
        seconds[name] = monotonic() - started
        log(f"cache: {name} in {seconds[name]:.0f} s (load {os.getloadavg()[0]:.1f})")
    log(f"cache: all in {sum(seconds.values()):.0f} s")
    return seconds

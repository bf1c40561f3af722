"""Every build the lab and the tests take from the caches outside the clone, made in one go:
`make test`'s set-up (`python -m tests.simlab caches`), before its workers start, so that a
fresh machine builds each thing once (PHASES says in what order) and the suite's own minutes are
its tests'.

Each build is also made on first use where it is needed (and locked there: labs started side by
side wait for one build), so a lab or a test run without this step still works; this step only
takes the builds out of the tests' time and says what each took, the machine's load beside it
(a cold machine's figure: docs/lab.md, "On a fresh machine").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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


# What `make test` needs, in phases one after the other; a phase's chains run side by side, each
# chain's builds in turn, each after what it uses. The host packages come first, alone: the
# others' tools. Then the chains overlap what would otherwise add up on a fresh machine: pip's
# downloads (the router's 118 wheels: 42 CPU seconds in 732 s, docs/lab.md) and debootstrap's
# wait on the mirror against the compiler's minutes (llama-server, at nice 19: the rest goes
# first). Builds that share a lock (the default `.build.lock`: both images, the repositories,
# the unpacked packages) still take turns, so one chain holds them all, the serving image last
# (its `hf` stand-in holds the lab's GGUF, which it waits for). The registry's layers last:
# they need every image, llama.cpp's (llama-server) among them.
Chain = tuple[tuple[str, Callable[[], object]], ...]
PHASES: tuple[tuple[Chain, ...], ...] = (
    ((("host packages", ensure_host_tools),),),
    (
        (
            ("stand-in NVIDIA repositories", stand_in_repositories),
            ("bare Spark image", spark_base),
            ("registry program", registry.binary),
            ("prometheus", prometheus_binaries),
            ("serving image", serving_image_tar),
        ),
        (("llama.cpp source", llama_build.sdist_tree), ("llama-server", llama_build.llama_server)),
        (("gguf's Python", llama_build.gguf_python), ("the lab's GGUF", llama_build.lab_model)),
        (("router wheelhouse", pypi.wheelhouse),),
    ),
    ((("registry's layers", registry_images),),),
)


def build_chain(chain: Chain) -> dict[str, float]:
    """A chain's builds in turn (nothing where it is cached); the seconds each took."""
    seconds: dict[str, float] = {}
    for name, build in chain:
        started = monotonic()
        build()
        seconds[name] = monotonic() - started
        log(f"cache: {name} in {seconds[name]:.0f} s (load {os.getloadavg()[0]:.1f})")
    return seconds


def build_all(phases: Sequence[Sequence[Chain]] = PHASES) -> dict[str, float]:
    """Each phase in turn, its chains side by side; the seconds each build took. A failed build
    stops its chain, and the set-up once the phase's other chains are done: no test runs on a
    half-built cache."""
    seconds: dict[str, float] = {}
    started = monotonic()
    for chains in phases:
        with ThreadPoolExecutor(len(chains)) as pool:
            # Every chain submitted, and waited for as the pool closes (map would cancel those
            # not started once one failed); then the first failure, in PHASES' order, raised.
            runs = [pool.submit(build_chain, chain) for chain in chains]
        for run in runs:
            seconds |= run.result()
    wall = monotonic() - started
    log(f"cache: all in {wall:.0f} s (the builds one after another: {sum(seconds.values()):.0f} s)")
    return seconds

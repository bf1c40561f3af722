"""Which vLLM a lane's image carries, and what that release accepts.

Each release's `vllm serve` options, the types of their values and the environment variables
it reads are data read from the release's own parser (spark/data/vllm-<version>-*.json;
tools/vllm_option_values.py and the data's "about" say how). A lane is checked against the
release of its image: the table below, or the lane's own `vllm_version` for an image it does
not know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from files.nccl_check import DEADLOCK_FIXED_IN, DEADLOCK_MACHINE, DEADLOCK_WHY, deadlocks

DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Image:
    """What an NGC vLLM image carries: its vLLM release, whether Ray is in it, and its NCCL
    (None where no public source says: then the NCCL test's verdict, which reads NCCL's own
    log, is what judges it)."""

    vllm: str
    ray: bool
    source: str
    nccl: str | None = None
    nccl_source: str = ""


# NGC's vLLM images by tag. Only releases with data in spark/data/ can be listed.
# Their NCCL: each vLLM release note lists the vLLM stack only and defers to "the CUDA section
# for the list of libraries inherited from the CUDA container" (docs.nvidia.com vLLM release
# notes 26.05, 26.10); the CUDA DL release notes name NCCL, but only 26.03's were found (NCCL
# 2.29.7, CUDA 13.2.0), none for 26.04, 26.05 or 26.10: their NCCL is left unknown here.
NCCL_UNKNOWN = "unknown: no CUDA DL release note of this month found"
IMAGES = {
    "nvcr.io/nvidia/vllm:26.04-py3": Image(
        "0.19.0", True, "seed 004: vLLM 0.19.0, its two-box cluster on Ray", None, NCCL_UNKNOWN
    ),
    "nvcr.io/nvidia/vllm:26.05-py3": Image(
        "0.20.1",
        False,
        "NGC vLLM release notes 26.05; no Ray: NVIDIA/dgx-spark-playbooks#109",
        None,
        NCCL_UNKNOWN,
    ),
    "nvcr.io/nvidia/vllm:26.10-py3": Image(
        "0.31.0",
        False,
        "NGC vLLM release notes 26.10; no Ray in the images since 26.05",
        None,
        NCCL_UNKNOWN,
    ),
}
DEFAULT_IMAGE = "nvcr.io/nvidia/vllm:26.04-py3"


@dataclass(frozen=True)
class Release:
    """One vLLM release's `vllm serve`: its options ({name: {takes_value, choices}}), their
    value types ({name: {type, nargs, none}}) and the environment variables it reads."""

    version: str
    options: dict[str, dict[str, Any]]
    values: dict[str, dict[str, Any]]
    env_vars: frozenset[str]

    @property
    def label(self) -> str:
        return f"vLLM {self.version}"

    def reads(self, variable: str) -> bool:
        return variable in self.env_vars

    def has(self, option: str) -> bool:
        return option in self.options


@cache
def known_versions() -> list[str]:
    """The releases operations/data/ holds every list of."""
    names = {path.name.split("-")[1] for path in DATA.glob("vllm-*-serve-options.json")}
    return sorted(
        (v for v in names if all(_path(v, kind).exists() for kind in KINDS)),
        key=_version_key,
    )


KINDS = ("serve-options", "option-values", "env-vars")


def _path(version: str, kind: str) -> Path:
    return DATA / f"vllm-{version}-{kind}.json"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def newer(version: str, than: str) -> bool:
    return _version_key(version) > _version_key(than)


@cache
def release(version: str) -> Release:
    """The release's lists; ValueError naming the releases there are for an unknown one."""
    if version not in known_versions():
        raise ValueError(
            f"vllm_version: {version!r} has no option list here; one of:"
            f" {', '.join(known_versions())} (tools/vllm_option_values.py makes another)"
        )

    def load(kind: str) -> dict[str, Any]:
        return json.loads(_path(version, kind).read_text())

    return Release(
        version=version,
        options=load("serve-options")["options"],
        values=load("option-values")["values"],
        env_vars=frozenset(load("env-vars")["names"]),
    )


def image_release(image: str, vllm_version: str | None) -> Release:
    """The release a lane's image carries: the lane's `vllm_version` where it gives one (and
    the table agrees), else the table's; ValueError saying what to set."""
    known = IMAGES.get(_without_digest(image))
    if vllm_version is None:
        if known is None:
            raise ValueError(
                f"image: the vLLM release of {image} is not known here (known:"
                f" {', '.join(IMAGES)}); set vllm_version in the lane to the release it carries"
                f" ({', '.join(known_versions())})"
            )
        return release(known.vllm)
    if known is not None and known.vllm != vllm_version:
        raise ValueError(
            f"vllm_version: {vllm_version!r}, but {image} carries vLLM {known.vllm}"
            f" ({known.source}); leave vllm_version out"
        )
    return release(vllm_version)


def images_with_ray() -> list[str]:
    return [image for image, row in IMAGES.items() if row.ray]


def image_has_ray(image: str) -> bool | None:
    """Whether the image carries Ray; None where the table does not know the image."""
    known = IMAGES.get(_without_digest(image))
    return known.ray if known else None


def without_ray(image: str) -> list[str]:
    """Why a cluster on Ray cannot run in ``image``: the table knows it to carry no Ray."""
    if image_has_ray(image) is not False:
        return []
    return [
        f"{image} carries no Ray (NVIDIA/dgx-spark-playbooks#109); a cluster on Ray needs"
        f" {' or '.join(images_with_ray())}, or a cluster lane with executor mp"
    ]


def nccl_deadlock_warning(image: str) -> str | None:
    """Why an image whose NCCL is known to deadlock on a Spark (aarch64) is a risk for a
    cluster; None where its NCCL is good or not known (the NCCL test's verdict decides)."""
    known = IMAGES.get(_without_digest(image))
    if known is None or not deadlocks(known.nccl, DEADLOCK_MACHINE):
        return None
    return (
        f"{image} carries NCCL {known.nccl} ({known.nccl_source}): {DEADLOCK_WHY}; the NCCL"
        f" test fails it on a Spark: choose an image with NCCL"
        f" {'.'.join(map(str, DEADLOCK_FIXED_IN))} or later"
    )


def _without_digest(image: str) -> str:
    return image.split("@", 1)[0]

"""The box's own keys: its kernel, its NVIDIA driver and GPU clock, the container toolkit."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, field_validator

from spark.checks import matching
from spark.options import option

DRIVER_PACKAGE = re.compile(r"nvidia-driver-(\d+)(-open)?")
DEBIAN_VERSION = re.compile(r"(\d+:)?\d[A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]+)*")
SUPPORTED_BRANCH = 580
# The highest graphics clock a GB10 reports (nvidia-smi's clocks.max.gr, 3003 MHz on driver
# 580.178.04, its applications clock 2418; boosting it reaches ~2400 under load: public GB10
# write-ups). A lock's maximum above it locks nothing.
GB10_MAX_GRAPHICS_MHZ = 3003


class BoxKeys(BaseModel):
    """A box's keys for its kernel, driver, GPU clock and container toolkit."""

    kernel_hold: bool = option(
        "True (the kernel metapackages held, apt pinned to the running kernel's ABI) or False",
        why="Owners ask fleet tools for kernel holds: no upgrade then moves a fleet off a"
        " known-good kernel (DGX OS 7.6 moved boxes to 7.0, see fabric_kernel_kho_off). The"
        " owner moves it: apt-mark unhold, the pin file removed. Off: DGX OS updates the kernel"
        " as it ships.",
    )
    driver_branch: int = option(
        f"the integer {SUPPORTED_BRANCH}",
        why="590.x has a confirmed CUDA-graph deadlock on GB10 (seed 001).",
    )
    driver_package: str = option(
        f"nvidia-driver-{SUPPORTED_BRANCH}-open or nvidia-driver-{SUPPORTED_BRANCH}",
        why="Installed when no 580 driver package is present; DeepOps installs the -open flavour"
        " on DGX OS 7 (NVIDIA/deepops roles/nvidia-dgx/vars/ubuntu-24.04.yml).",
    )
    driver_version: str | None = option(
        "None (the build of the branch apt installs first, kept), or a Debian"
        f" version of branch {SUPPORTED_BRANCH} that `apt-cache madison"
        f" nvidia-driver-{SUPPORTED_BRANCH}-open` lists, e.g. 580.159.03-0ubuntu1",
        why="A held box never moves by itself: an upgrade under a loaded module leaves"
        ' nvidia-smi failing with "Driver/library version mismatch" until a reboot'
        " (oddmario/NVIDIA-Ubuntu-Driver-Guide#4). A newer build of the branch (a security"
        " fix): the deploy moves every driver package there, holds them again and says the box"
        " needs a reboot.",
        default=None,
    )
    gpu_clock_lock_mhz: tuple[int, int] | None = option(
        "(min, max): the MHz `nvidia-smi -lgc min,max` locks the GPU's graphics clock"
        f" to at every boot, integers with 0 <= min <= max <= {GB10_MAX_GRAPHICS_MHZ} (a GB10's"
        " highest), e.g. (300, 2200); None or False: no lock",
        why="A hot GB10 powers OFF (no reboot, no log, standby until AC is cycled) seconds into"
        " a 131k-token prefill at default clocks, boosting to ~2400 MHz: 2 losses in 22 long"
        " onsets on one unit, none in 15 locked; 0 in 66 long-input onsets with the lock on a"
        " loaded 7-unit pod. Cost: 1-3% of decode at one user, none at 32"
        " (capetron/gb10-cluster-bench docs/power-offs-and-clock-lock.md; the same power-offs in"
        " tonyd2wild/dgx-spark-hard-poweroff-fix and NVIDIA forum threads 373251 and 377478,"
        " where a user locks 300,2400; caps of 2100-2400 are reported).",
    )
    toolkit_version: Annotated[
        str,
        matching(
            DEBIAN_VERSION,
            "{!r} is not a Debian version; use one that `apt-cache madison"
            " nvidia-container-toolkit` lists, e.g. 1.19.0-1",
        ),
    ] = option(
        "a Debian version of nvidia-container-toolkit, e.g. 1.19.0-1",
        why="Pinned and held as NVIDIA's install guide pins it, so `apt upgrade` leaves it.",
    )
    toolkit_repo_url: str = option(
        "an https:// or file:/// URL of the apt repository",
        why="NVIDIA's apt repository for the container toolkit (NVIDIA's install guide);"
        " $(ARCH) is left for apt to fill in.",
    )
    toolkit_repo_key_url: str = option(
        "an https:// or file:/// URL of the signing key",
        why="The repository's signing key (NVIDIA's install guide).",
    )

    @field_validator("driver_branch")
    @classmethod
    def _driver_branch(cls, branch: int) -> int:
        if branch != SUPPORTED_BRANCH:
            problem = (
                "is refused: it has a confirmed CUDA-graph deadlock on GB10"
                if branch == 590
                else "is not supported on GB10"
            )
            raise ValueError(f"branch {branch} {problem}; set driver_branch = {SUPPORTED_BRANCH}")
        return branch

    @field_validator("driver_package")
    @classmethod
    def _driver_package(cls, package: str) -> str:
        match = DRIVER_PACKAGE.fullmatch(package)
        if not match:
            raise ValueError(
                f"{package!r} is not a driver package of a branch;"
                f" use nvidia-driver-{SUPPORTED_BRANCH}-open or nvidia-driver-{SUPPORTED_BRANCH}"
            )
        if int(match[1]) != SUPPORTED_BRANCH:
            raise ValueError(
                f"{package} is of branch {match[1]}, not of driver_branch {SUPPORTED_BRANCH};"
                f" use nvidia-driver-{SUPPORTED_BRANCH}-open or nvidia-driver-{SUPPORTED_BRANCH}"
            )
        return package

    @field_validator("driver_version")
    @classmethod
    def _driver_version(cls, version: str | None) -> str | None:
        if version is None:
            return None
        if not DEBIAN_VERSION.fullmatch(version):
            raise ValueError(
                f"{version!r} is not a Debian version; use one that `apt-cache madison"
                f" nvidia-driver-{SUPPORTED_BRANCH}-open` lists, e.g. 580.159.04-0ubuntu1"
            )
        if not version.startswith(f"{SUPPORTED_BRANCH}."):
            raise ValueError(
                f"{version} is not a build of driver branch {SUPPORTED_BRANCH}; the deploy moves"
                f" a box within the branch only: use a {SUPPORTED_BRANCH}.x version"
            )
        if "-" not in version:
            # A version without a hyphen has no Debian revision (deb-version(5): "If there is no
            # debian-revision then hyphens are not allowed"); Ubuntu's driver packages all have
            # one, so apt would find no such version on the box.
            raise ValueError(
                f"{version} has no Debian revision (it is the driver's own version, as nvidia-smi"
                " prints it), and apt has no such version; use the version `apt-cache madison"
                f" nvidia-driver-{SUPPORTED_BRANCH}-open` lists for it, e.g. {version}-0ubuntu1"
            )
        return version

    @field_validator("gpu_clock_lock_mhz", mode="before")
    @classmethod
    def _gpu_clock_lock_off_or_pair(cls, value: object) -> object:
        # False reads as off; a list (as JSON or an owner writes it) as the pair it holds.
        if value is False or value is None:
            return None
        if not isinstance(value, tuple | list) or len(value) != 2:
            example = value if type(value) is int else 2200
            raise ValueError(
                f"{value!r} is not a pair (min, max) of MHz; e.g. (300, {example}) to cap the"
                " clock there, or None for no lock"
            )
        return tuple(value)

    @field_validator("gpu_clock_lock_mhz")
    @classmethod
    def _gpu_clock_lock(cls, pair: tuple[int, int] | None) -> tuple[int, int] | None:
        if pair is not None and not 0 <= pair[0] <= pair[1] <= GB10_MAX_GRAPHICS_MHZ:
            raise ValueError(
                f"{pair} is not a range (min, max) with 0 <= min <= max <="
                f" {GB10_MAX_GRAPHICS_MHZ} MHz (a GB10's highest graphics clock); e.g. (300, 2200),"
                " or None for no lock"
            )
        return pair

    @field_validator("toolkit_repo_url", "toolkit_repo_key_url")
    @classmethod
    def _url(cls, url: str) -> str:
        parts = urlsplit(url)
        usable = (parts.scheme == "https" and parts.netloc) or (
            parts.scheme == "file" and not parts.netloc and parts.path.startswith("/")
        )
        if not usable or re.search(r"[\s\"'\\]", url):
            raise ValueError(
                f"{url!r} is not an https:// or file:/// URL (without spaces or quotes);"
                " use one: over plain http anyone on the path could swap packages or key"
            )
        return url

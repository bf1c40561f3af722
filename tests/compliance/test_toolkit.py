"""The container toolkit: its packages at the inventory's version and held; docker's runtime."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from operations.toolkit import PACKAGES

if TYPE_CHECKING:
    from tests.compliance.conftest import Box


def test_packages_at_version_and_held(box: Box, found: Callable[[object], None]) -> None:
    """toolkit packages at version, held"""
    version = box.plan.toolkit.version
    installed = box.packages(*PACKAGES)
    absent = [name for name in PACKAGES if name not in installed]
    other = [f"{name} {have}" for name, (have, _) in installed.items() if have != version]
    unheld = [name for name, (_, held) in installed.items() if not held]
    problems = []
    if absent:
        problems.append(f"absent: {', '.join(absent)}")
    if other:
        problems.append(f"at {', '.join(other)}")
    if unheld:
        problems.append(f"not held: {', '.join(unheld)}")
    found("; ".join(problems))
    assert not problems, f"expected {', '.join(PACKAGES)} at {version} and held, found: {problems}"


def test_docker_has_the_nvidia_runtime(box: Box, found: Callable[[object], None]) -> None:
    """docker nvidia runtime"""
    # What the running daemon loaded, not only what daemon.json says.
    info = box.run("docker info --format '{{json .Runtimes}}'")
    runtimes = sorted(json.loads(info.stdout)) if info.rc == 0 else []
    state = " ".join(runtimes) if info.rc == 0 else f"docker info failed: {info.stderr.strip()}"
    found(state)
    assert "nvidia" in runtimes, f"expected docker's runtimes to include nvidia, found {state}"

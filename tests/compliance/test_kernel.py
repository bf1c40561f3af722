"""The kernel: held as kernel_hold says (its metapackages held and apt pinned to the running
kernel's ABI; with the hold off, no pin of the deploy's left), and every box of the inventory
(those checked: --limit narrows it) on the same kernel, which a cluster's fabric needs (a box
moved to 7.0 fails RDMA registration: NVIDIA/NV-Kernels PRs 590, 591)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

from operations import kernel

if TYPE_CHECKING:
    from tests.compliance.conftest import Box

PIN_PATH = inspect.signature(kernel.held).parameters["pin_path"].default


def _running(box: Box) -> dict[str, object]:
    fact = kernel.RunningKernel()
    return fact.process(box.run(fact.command()).stdout.splitlines())


def test_kernel_held(box: Box, found: Callable[[object], None]) -> None:
    """kernel held as kernel_hold says"""
    pin = box.host.file(PIN_PATH)
    if not box.plan.kernel.hold:
        found(f"{PIN_PATH} left" if pin.exists else "")
        assert not pin.exists, f"expected no {PIN_PATH} (kernel_hold off), found one"
        return
    running = _running(box)
    unheld = [name for name, (_, held) in box.packages(*box.plan.kernel.hold).items() if not held]
    wanted = f"Pin: version {running['abi']}.*"
    problems = [f"not held: {', '.join(unheld)}"] if unheld else []
    if not pin.is_file or wanted not in pin.content_string.splitlines():
        problems.append(f"{PIN_PATH} without {wanted!r}")
    found("; ".join(problems))
    assert not problems, (
        f"expected the kernel metapackages held and apt pinned to {running['release']}, found:"
        f" {'; '.join(problems)}"
    )


def test_every_box_runs_the_same_kernel(
    box: Box, every_box: list[Box], found: Callable[[object], None]
) -> None:
    """kernel the same on every box"""
    releases = {other.name: _running(other)["release"] for other in every_box}
    mine = releases[box.name]
    others = {name: release for name, release in releases.items() if release != mine}
    found(", ".join(f"{name} {release}" for name, release in others.items()))  # not this one's
    assert not others, (
        f"expected every box on {mine}, found {others}; boot one kernel everywhere"
        " (kernel_hold = True keeps them there)"
    )

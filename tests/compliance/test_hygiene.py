"""Host hygiene: logind keeps IPC objects (RemoveIPC=no); sshd out of the OOM killer's reach."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from operations.hygiene import CAP_SYS_RESOURCE, OOM_PROTECTED, sshd_oom_protected

if TYPE_CHECKING:
    from tests.compliance.conftest import Box

SSHD_UNIT = inspect.signature(sshd_oom_protected).parameters["unit"].default


def test_logind_keeps_ipc(box: Box, found: Callable[[object], None]) -> None:
    """logind RemoveIPC=no"""
    # The configuration as logind reads it (last assignment wins), and what it runs with.
    config = box.run("systemd-analyze cat-config systemd/logind.conf").stdout
    assignments = re.findall(r"^RemoveIPC=(\S*)", config, re.M)
    configured = assignments[-1] if assignments else "unset (default yes)"
    running = box.run(
        "busctl get-property org.freedesktop.login1 /org/freedesktop/login1"
        " org.freedesktop.login1.Manager RemoveIPC"
    ).stdout.strip()
    state = f"config {configured}, logind {running or 'unknown'}"
    found(state)
    assert (configured, running) == ("no", "b false"), (
        f"expected RemoveIPC=no configured and in the running logind, found {state}"
    )


def test_sshd_oom_protected(box: Box, found: Callable[[object], None]) -> None:
    """sshd OOM protected"""
    pid = box.run(f"systemctl show -p MainPID --value {SSHD_UNIT}").stdout.strip()
    score = box.run(f"cat /proc/{pid}/oom_score_adj").stdout.strip() if pid != "0" else ""
    if score and score != str(OOM_PROTECTED):
        capabilities = box.run("sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status").stdout
        if not int(capabilities or "0", 16) >> CAP_SYS_RESOURCE & 1:
            # Nothing may lower a score here (a container): the deploy leaves it, as sshd does.
            pytest.skip(f"no CAP_SYS_RESOURCE here; sshd at {score}")
    state = f"pid {pid}: oom_score_adj {score}" if score else f"{SSHD_UNIT} has no main process"
    found(state)
    assert score == str(OOM_PROTECTED), (
        f"expected {SSHD_UNIT}'s sshd at oom_score_adj {OOM_PROTECTED}, found {state}"
    )

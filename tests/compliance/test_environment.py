"""The cluster environment file: exactly the variables the inventory gives, root-owned, 0644."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.compliance.conftest import Box

# KEY="value" (backslash before \ " ` $) or KEY=value: what sh and systemd both read alike.
ASSIGNMENT = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)=(?:"((?:[^"\\]|\\.)*)"|([^\s"\'\\`$]*))')


def parse(text: str) -> dict[str, str]:
    """The variables of an environment file, parsed, never sourced (it may have been tampered
    with); a line that is none of comment, blank or assignment shows as a '<line N>' key."""
    variables = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = ASSIGNMENT.fullmatch(line)
        if match is None:
            variables[f"<line {number}>"] = line
            continue
        name, quoted, bare = match.groups()
        variables[name] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
    return variables


def test_contents(box: Box, found: Callable[[object], None]) -> None:
    """cluster env contents"""
    path = box.plan.environment.path
    want = box.plan.environment.variables
    file = box.host.file(path)
    have = parse(file.content_string) if file.is_file else {}
    differences = [
        f"{name}={have[name]!r} (want {want[name]!r})"
        if name in have and name in want
        else (f"missing {name}" if name in want else f"extra {name}={have[name]!r}")
        for name in sorted(want.keys() | have.keys())
        if have.get(name) != want.get(name)
    ]
    state = "; ".join(differences) if file.is_file else f"no {path}"
    found(state)
    assert file.is_file and not differences, f"expected {path} to hold {want}, found: {state}"


def test_owner_and_mode(box: Box, found: Callable[[object], None]) -> None:
    """cluster env owner and mode"""
    path = box.plan.environment.path
    file = box.host.file(path)
    state = f"{file.user}:{file.group} {file.mode:04o}" if file.exists else "absent"
    found(state)
    # Units and every login shell read it: nobody but root may write it.
    assert state == "root:root 0644", f"expected {path} root:root 0644, found {state}"

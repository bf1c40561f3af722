"""Debian package state shared by the driver and toolkit concerns: version and hold at once."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from pyinfra.api import FactBase

# The second letter of dpkg's db:Status-Abbrev for a package whose files are not on the box:
# not-installed, config-files (removed, its conffiles left).
ABSENT = "nc"


def query(patterns: Iterable[str]) -> str:
    """A dpkg-query printing "<Status-Abbrev>\\t<name>\\t<version>" for packages matching
    the glob patterns (dpkg-query lists packages known but not installed too)."""
    quoted = " ".join(shlex.quote(pattern) for pattern in patterns)
    return rf"dpkg-query -W -f='${{db:Status-Abbrev}}\t${{Package}}\t${{Version}}\n' {quoted}"


def apt_install(*args: str) -> str:
    """apt-get install without questions, keeping local changes to configuration files.

    The package lists are refreshed first: a box fresh from its image may have none, or
    lists months old. Only an install pays for it, so a run with nothing to install asks no
    mirror anything."""
    options = "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
    quoted = " ".join(shlex.quote(arg) for arg in args)
    install = f"DEBIAN_FRONTEND=noninteractive apt-get install -y {options} {quoted}"
    return f"apt-get update -qq && {install}"


class PackageStates(FactBase):
    """Installed packages matching the subclass's ``patterns``, with version and hold.

    .. code:: python

        {
            "nvidia-driver-580-open": {"version": "580.142-0ubuntu0.24.04.1", "held": True},
            "libnvidia-compute-580": {"version": "580.142-0ubuntu0.24.04.1", "held": False},
        }
    """

    default = dict
    patterns: tuple[str, ...] = ()

    def command(self) -> str:
        # dpkg-query exits 1 when a pattern matches nothing: an answer ("none"), not a failure.
        return f"{query(self.patterns)} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, dict[str, str | bool]]:
        packages: dict[str, dict[str, str | bool]] = {}
        for line in output:
            status, name, version = line.split("\t")
            if status[1] not in ABSENT:
                packages[name] = {"version": version, "held": status[0] == "h"}
        return packages

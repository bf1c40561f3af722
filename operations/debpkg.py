"""Debian packages for the driver and toolkit concerns: version and hold at once; what an
interrupted dpkg left unfinished, finished."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations.asked import Question, answer, question

# The second letter of dpkg's db:Status-Abbrev for a package whose files are not on the box:
# not-installed, config-files (removed, its conffiles left).
ABSENT = "nc"
# apt-get install waits this long for the dpkg lock instead of failing at once: a run cut off
# during an install leaves its apt running on the box (a driver's DKMS build takes minutes), and
# a fresh box's unattended-upgrades holds the lock for a while after boot. (apt-get update has
# no such wait for its lists lock.)
LOCK_TIMEOUT = 600
APT_GET = f"apt-get -o DPkg::Lock::Timeout={LOCK_TIMEOUT}"
DPKG_JOURNAL = "/var/lib/dpkg/updates"  # apt: "dpkg was interrupted" when it holds NNNN files
JOURNAL_PENDING = "journal pending"  # DpkgAudit's own line; dpkg --audit never prints it
# Keep local changes to configuration files, without asking.
CONFFILES = ("--force-confdef", "--force-confold")


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
    options = " ".join(f"-o Dpkg::Options::={option}" for option in CONFFILES)
    quoted = " ".join(shlex.quote(arg) for arg in args)
    install = f"DEBIAN_FRONTEND=noninteractive {APT_GET} install -y {options} {quoted}"
    return f"apt-get update -qq && {install}"


class PackageStates(FactBase):
    """Installed packages matching the subclass's ``patterns`` (or the ones asked for), with
    version and hold.

    .. code:: python

        {
            "nvidia-driver-580-open": {"version": "580.142-0ubuntu0.24.04.1", "held": True},
            "libnvidia-compute-580": {"version": "580.142-0ubuntu0.24.04.1", "held": False},
        }
    """

    default = dict
    patterns: tuple[str, ...] = ()

    def command(self, patterns: tuple[str, ...] = ()) -> str:
        # dpkg-query exits 1 when a pattern matches nothing: an answer ("none"), not a failure.
        return f"{query(patterns or self.patterns)} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, dict[str, str | bool]]:
        packages: dict[str, dict[str, str | bool]] = {}
        for line in output:
            status, name, version = line.split("\t")
            if status[1] not in ABSENT:
                packages[name] = {"version": version, "held": status[0] == "h"}
        return packages


class DpkgAudit(FactBase):
    """What an interrupted dpkg left unfinished: the packages ``dpkg --audit`` names (unpacked
    but not configured, half installed...) and whether its journal still holds updates.

    .. code:: python

        {"packages": ["libnvidia-compute-580", "nvidia-driver-580-open"], "journal": True}
    """

    def command(self) -> str:
        journal = shlex.quote(DPKG_JOURNAL)
        return (
            f"dpkg --audit 2>/dev/null; ls {journal} 2>/dev/null | grep -q '^[0-9]'"
            f" && echo {shlex.quote(JOURNAL_PENDING)}; true"
        )

    def process(self, output: list[str]) -> dict[str, list[str] | bool]:
        # dpkg --audit lists each package indented by one space, under a sentence saying why.
        packages = {line.split()[0] for line in output if line.startswith(" ") and line.strip()}
        return {"packages": sorted(packages), "journal": JOURNAL_PENDING in output}

    @staticmethod
    def default() -> dict[str, list[str] | bool]:
        return {"packages": [], "journal": False}


@operation()
def completed():
    """
    Finish what an interrupted dpkg left half done, so that apt installs again.

    A run cut off during an install (a lost connection, a power cut, dpkg killed) can leave
    packages unpacked but not configured or half installed, and dpkg's journal pending; apt then
    refuses every install ("dpkg was interrupted, you must manually run 'dpkg --configure -a'").
    When ``dpkg --audit`` or the journal says so, this waits for the dpkg lock (the cut-off
    run's apt may still be running), runs ``dpkg --configure -a``, then lets apt reinstall what
    dpkg cannot finish (``apt-get install -f``), keeping local configuration files.
    """
    audit = answer(DpkgAudit)
    if not (audit["packages"] or audit["journal"]):
        host.noop("dpkg has no package left unfinished")
        return
    fix = " ".join(f"-o Dpkg::Options::={option}" for option in CONFFILES)
    yield (
        # apt-get check returns once the lock is free; its verdict is not needed.
        f"{APT_GET} check >/dev/null 2>&1;"
        f" DEBIAN_FRONTEND=noninteractive dpkg {' '.join(CONFFILES)} --configure -a"
        " && apt-get update -qq"
        f" && DEBIAN_FRONTEND=noninteractive {APT_GET} install -f -y {fix}"
    )


def questions() -> list[Question]:
    """What ``completed`` reads (operations/asked.py: its stage asks it with its others)."""
    return [question(DpkgAudit)]

"""What teardown.py takes off a box: the deploy's units, containers, files, firewall table,
NetworkManager profiles and package holds, each found on the box first."""

from __future__ import annotations

import shlex
from fnmatch import fnmatchcase

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import firewall, gpuclock, util
from operations.asked import answer
from spark.box_paths import GPU_CLOCK_UNIT

UNIT_DIR = "/etc/systemd/system"
PREFIX = "spark-"  # of every unit and container the deploy makes (lanes, Ray, NCCL test, ...)
FRONT = "nginx"
# Section headers in Pieces' output: never a unit, container or absolute path.
SECTIONS = ("units", "unit files", "containers", "paths", "table")


class Pieces(FactBase):
    """What of the deploy's is on the box: its units (spark-*, loaded or with a unit file,
    transient ones included), the entries of /etc/systemd/system named so (units, drop-in
    directories), its containers (spark-*, running or not), which of ``paths`` exist, and
    whether the firewall's nft table does.

    .. code:: python

        {"units": ["spark-lane-coder.service"],
         "unit files": ["spark-lane-coder.service"], "containers": ["spark-lane-coder"],
         "paths": ["/etc/spark"], "table": ["inet spark"]}
    """

    def command(self, paths: tuple[str, ...]) -> str:
        quoted = " ".join(map(shlex.quote, paths))
        return (
            f"echo units; {{ systemctl list-units --all --plain --no-legend '{PREFIX}*';"
            f" systemctl list-unit-files --no-legend '{PREFIX}*'; }}"
            " | awk '{print $1}' | sort -u;"
            f" echo 'unit files'; ls -1 {UNIT_DIR} | grep '^{PREFIX}';"
            " echo containers; command -v docker >/dev/null"
            f" && docker ps -a --format '{{{{.Names}}}}' | grep '^{PREFIX}';"
            f" echo paths; for p in {quoted}; do"
            ' if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi; done;'
            f" echo table; nft list table {firewall.TABLE} >/dev/null 2>&1"
            f" && echo {shlex.quote(firewall.TABLE)}; true"
        )

    def process(self, output: list[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {section: [] for section in SECTIONS}
        current = found["units"]
        for line in output:
            if line in SECTIONS:
                current = found[line]
            elif line:
                current.append(line)
        return found


@operation()
def removed(paths: list[str]):
    """
    Stop and remove every unit and container of the deploy's, the firewall's nft table, and
    those of ``paths`` that exist; the GPU clock's lock reset; nginx reloaded without the lanes'
    and the metrics' sites.

    + paths: files and directories the deploy writes (directories go whole)
    """
    found = answer(Pieces, paths=tuple(paths))
    units = found["units"]
    if not any(found.values()):
        host.noop("nothing of the deploy's is on the box")
        return
    # What may be enabled: services, timers, an on-demand lane's socket (operations/on_demand.py).
    enabled = [
        name for name in found["unit files"] if name.endswith((".service", ".timer", ".socket"))
    ]
    if enabled:
        yield f"systemctl disable {' '.join(enabled)}"
    if units:
        # A unit systemd lists as not-found (its file gone, its failure kept) refuses a stop and
        # the others still stop: what is left shows in the next run's answer.
        yield f"systemctl stop {' '.join(units)} || true"
    if found["containers"]:
        # Stopping a lane's unit may have removed its container (docker run --rm) by now.
        yield f"docker ps -aq --filter name='^{PREFIX}' | xargs -r docker rm -f"
    if found["table"]:
        yield firewall.DELETE_TABLE
    if GPU_CLOCK_UNIT in found["unit files"]:
        yield gpuclock.RESET  # its lock outlives the unit until the box reboots
    gone = [f"{UNIT_DIR}/{name}" for name in found["unit files"]] + found["paths"]
    if gone:
        yield f"rm -rf -- {' '.join(map(shlex.quote, gone))}"
    if units or found["unit files"]:
        yield "systemctl daemon-reload"
    if units:
        yield f"systemctl reset-failed {' '.join(units)} || true"
    if any(path.startswith(f"/etc/{FRONT}/") for path in found["paths"]):
        yield f"if systemctl is-active -q {FRONT}; then systemctl reload {FRONT}; fi"


class HeldPackages(FactBase):
    """The installed packages apt-mark holds, one a line (apt-mark(8): showhold)."""

    default = list

    def command(self) -> str:
        return "apt-mark showhold"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


@operation()
def released(patterns: list[str]):
    """
    Release the holds the deploy put on packages (they stay installed).

    + patterns: the names of the packages the deploy holds, as dpkg-query's glob patterns
    """
    held = [name for name in answer(HeldPackages) if any(fnmatchcase(name, p) for p in patterns)]
    if held:
        yield f"apt-mark unhold {' '.join(held)}"
    else:
        host.noop("none of them held")


class ProfileNames(FactBase):
    """The NetworkManager profiles' names, one a line (nmcli -g NAME connection show)."""

    default = list

    def command(self) -> str:
        return "nmcli -g NAME connection show 2>/dev/null; true"

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line]


@operation()
def profiles_removed(names: list[str]):
    """
    Delete these NetworkManager profiles where they exist.

    + names: the profiles' connection.id
    """
    present = [name for name in names if name in answer(ProfileNames)]
    for name in present:
        yield f"nmcli connection delete id {shlex.quote(name)}"
    if not present:
        host.noop("no such profile")


@operation()
def allowed(problem: str):
    """
    Stop the box here when the teardown may not go on (not confirmed, an option wrong).

    + problem: why, and what to do; "" to go on
    """
    if problem:
        yield from util.refused(problem)
    else:
        host.noop("the teardown goes on")

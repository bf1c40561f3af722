"""What several operations share, as pyinfra keeps it in its operations/util: a root-owned file
from a template, a systemd unit's reload, enable and restart-or-start, what a container may get
on the box, and the `docker run` line of a GPU container."""

from __future__ import annotations

from pathlib import Path

from pyinfra.operations import files

TEMPLATES = Path(__file__).parents[1] / "templates"
# A variable name that sh, systemd's EnvironmentFile= and docker's --env-file all read as one
# (POSIX, Base Definitions 8.1: letters, digits and underscores, not starting with a digit).
CAP_SYS_RESOURCE = 24  # raising RLIMIT_MEMLOCK, lowering an oom_score_adj (linux/capability.h)
# What a container may get on this box, as `kind value` lines for ``container_rights``: RDMA
# devices, and this (root) shell's effective capabilities.
RIGHTS_COMMAND = (
    "[ -d /dev/infiniband ] && echo rdma;"
    " sed -n 's/^CapEff:[[:space:]]*/capeff /p' /proc/self/status"
)


def template(name: str, dest: str, mode: str = "644", **variables: object) -> list:
    """The commands of ``files.template`` for a root:root file from templates/<name> (none when
    the file is as rendered)."""
    return list(
        files.template._inner(
            src=str(TEMPLATES / name), dest=dest, user="root", group="root", mode=mode, **variables
        )
    )


def has_capability(capeff: str, capability: int) -> bool:
    """Whether a CapEff mask of /proc/<pid>/status (hexadecimal) holds ``capability``."""
    return bool(int(capeff or "0", 16) >> capability & 1)


def container_rights(fields: dict[str, str]) -> dict[str, bool]:
    """What RIGHTS_COMMAND's lines (as {kind: value}) say: whether the box has RDMA devices, and
    whether root may lift the locked-memory limit (CAP_SYS_RESOURCE, which a container lacks)."""
    return {
        "rdma": "rdma" in fields,
        "unlimited_memlock": has_capability(fields.get("capeff", "0"), CAP_SYS_RESOURCE),
    }


def docker_run(
    container: str, options: list[str], rdma: bool, unlimited_memlock: bool
) -> list[str]:
    """The start of a GPU container's `docker run`, on the host's network and IPC, in the
    foreground (systemd supervises it), removed when it stops; image and command follow."""
    args = ["/usr/bin/docker", "run", "--rm", "--name", container, "--gpus", "all"]
    args += ["--network", "host", "--ipc", "host", *options]
    if unlimited_memlock:  # RDMA registers (pins) memory; a container without the right keeps 8 MiB
        args += ["--ulimit", "memlock=-1"]
    if rdma:  # or NCCL silently falls back to sockets (vllm PR#42075)
        args += ["--device", "/dev/infiniband"]
    return args


def unit_started(
    unit: str,
    *,
    unit_changed: bool,
    enabled: str | None,
    running: bool,
    changed: bool,
    start: str | None = None,
    restart: str | None = None,
) -> list[str]:
    """What follows the writing of a unit's files: daemon-reload when its unit file changed,
    enable when it is not, then restart when something it runs changed (``changed``), else start
    when it is not running; nothing of the last when it runs as written.

    + start, restart: the commands (default `systemctl start|restart <unit>`)
    """
    commands = ["systemctl daemon-reload"] if unit_changed else []
    if enabled != "enabled":
        commands.append(f"systemctl enable {unit}")
    if changed:
        commands.append(restart or f"systemctl restart {unit}")
    elif not running:
        commands.append(start or f"systemctl start {unit}")
    return commands

"""What several operations share, as pyinfra keeps it in its operations/util: a root-owned file
as given or from a template (one question when it is so), a systemd unit's reload, enable and
restart-or-start, what a container may get on the box, the `docker run` line of a GPU
container, and how a box stops on its own problem (and where another box stopped)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Iterator
from io import StringIO
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api import FactBase, State
from pyinfra.api.host import Host
from pyinfra.api.util import get_file_sha1, get_template
from pyinfra.operations import files

from operations.asked import answer

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


class RootFiles(FactBase):
    """Each path's owner, group, mode (``stat -c %a``) and SHA-1, all in one command; None for a
    path that is not a regular file (absent, a directory, a link) or whose line does not read
    so (the file is then left to pyinfra's files.put, which reads it itself).

    .. code:: python

        {"/etc/x.conf": {"user": "root", "group": "root", "mode": "644", "sha1": "3c5d...e1"}}
    """

    default = dict

    def command(self, paths: tuple[str, ...]) -> str:
        self.paths = paths  # process() answers these, as pyinfra's Sha1File keeps its path
        return "; ".join(
            f"if [ -f {path} ] && [ ! -L {path} ]; then printf '%s\\t%s %s\\n' {path}"
            f" \"$(stat -c '%U %G %a' {path})\" \"$(sha1sum < {path} | cut -d ' ' -f 1)\";"
            f" else printf '%s\\t-\\n' {path}; fi"
            for path in map(shlex.quote, paths)
        )

    def process(self, output: list[str]) -> dict[str, dict[str, str] | None]:
        lines = dict(line.split("\t", 1) for line in output if "\t" in line)
        found: dict[str, dict[str, str] | None] = {}
        for path in self.paths:
            fields = lines.get(path, "").split()
            found[path] = (
                dict(zip(("user", "group", "mode", "sha1"), fields, strict=True))
                if len(fields) == 4
                else None
            )
        return found


def on_box(*paths: str) -> dict[str, dict[str, str] | None]:
    """RootFiles' answer for these paths: one question for all the files of an operation (give
    it to ``put`` and ``template`` as ``found``)."""
    return answer(RootFiles, paths=paths)


def put(
    src: str | StringIO,
    dest: str,
    mode: str = "644",
    found: dict[str, dict[str, str] | None] | None = None,
) -> list:
    """The commands of ``files.put`` for a root:root file holding ``src`` (a local path or the
    text itself): none when the file is so, as ``found`` (``on_box``; asked here when it does
    not hold ``dest``) says; else pyinfra's own files.put, which reads what it needs (its File,
    Directory and Sha1File facts: three questions where the file is there) and writes what
    differs."""
    if found is None or dest not in found:
        found = on_box(dest)
    if found.get(dest) == {
        "user": "root",
        "group": "root",
        "mode": mode,
        "sha1": get_file_sha1(src),
    }:
        host.noop(f"file {dest} is already uploaded")  # files.put's own words
        return []
    return list(files.put._inner(src=src, dest=dest, user="root", group="root", mode=mode))


def template(
    name: str,
    dest: str,
    mode: str = "644",
    found: dict[str, dict[str, str] | None] | None = None,
    **variables: object,
) -> list:
    """The commands of ``files.template`` for a root:root file from templates/<name> (none when
    the file is as rendered): rendered as files.template renders (host, state and inventory
    among the variables), then ``put``."""
    data = {"host": host, "state": state, "inventory": state.inventory, **variables}
    return put(StringIO(get_template(str(TEMPLATES / name)).render(data)), dest, mode, found)


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


def refused(message: str) -> Iterator[str]:
    """Stop this box, and this box alone, on a problem found on it: one command that prints
    ``message`` on stderr and fails.

    In pyinfra 3.10 a failed command fails its host, whose output pyinfra prints (in red, with
    the box's prefix) and whose other operations it skips, while the other boxes go on
    (pyinfra/api/operations.py: _run_host_op, _run_single_op, State.fail_hosts); an exception
    raised in an operation instead leaves run_ops and ends the run of every box. Before the run
    (pyinfra's change detection without -y, and --dry) no command runs: the message is logged
    then, so that a dry run shows it too. An operation yields from this and returns.
    """
    if not state.is_executing:
        host.log(f"would stop here: {message}", log_func=logger.warning)
    yield f"printf '%s\\n' {shlex.quote(message)} >&2; exit 1"


def failed_operation(run: State, box: Host) -> tuple[str, str] | None:
    """The operation ``box`` stopped at in this run and why: its name and the first line its
    failed command printed on stderr (``refused``'s message), else its last line on stdout.
    pyinfra names an operation run in a ``@deploy("Stage")`` "Stage | name"
    (pyinfra/api/operation.py: generate_operation_name), so the stage shows where there is one.
    None: no operation failed there (a box not reached: pyinfra said why when connecting)."""
    ops = run.ops.get(box, {})
    for op_hash in reversed(run.get_op_order()):
        meta = ops[op_hash].operation_meta if op_hash in ops else None
        if meta is None or not meta.is_complete() or meta.did_succeed():
            continue
        said = [line.strip() for line in meta.stderr_lines if line.strip()]
        said = said[:1] or [line.strip() for line in meta.stdout_lines if line.strip()][-1:]
        why = said[0].removeprefix(f"{box.name}: ") if said else "a command failed"
        return ", ".join(sorted(run.get_op_meta(op_hash).names)), why
    return None


def stopped_at(run: State, box: Host) -> str:
    """Where ``box`` stopped in this run and why: "<operation>: <what it printed>"."""
    failed = failed_operation(run, box)
    if failed is None:
        return "connecting: not reached (pyinfra's error above)"
    return f"{failed[0]}: {failed[1]}"


def missing(boxes: Iterable[str]) -> dict[str, str]:
    """The boxes of ``boxes`` other than this one that stopped in this run, by name, each with
    where it stopped (``stopped_at``)."""
    wanted = set(boxes) - {host.name}
    return {
        box.name: stopped_at(state, box)
        for box in sorted(state.failed_hosts, key=lambda failed: failed.name)
        if box.name in wanted
    }


def waits_for(stopped: dict[str, str]) -> str:
    """What an operation that needs the ``stopped`` boxes (``missing``) says instead of running."""
    return "; ".join(f"waits for {name}, stopped at {where}" for name, where in stopped.items())


def pull(image: str, box: str) -> str:
    """`docker pull` of the image; failing, one line on stderr naming the box, the registry
    and what docker said (the registry's answer: connection refused, manifest unknown, ...)."""
    failed = shlex.quote(f"{box}: docker pull {image} from registry {registry_of(image)} failed:")
    return (
        f"out=$(docker pull --quiet {shlex.quote(image)} 2>&1)"
        f" || {{ echo {failed} \"$(printf %s \"$out\" | tr '\\n' ' ')\" >&2; exit 1; }}"
    )


def registry_of(image: str) -> str:
    """The registry of registry/repository:tag (the name's first part)."""
    return image.split("/", 1)[0]

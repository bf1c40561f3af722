"""Lanes: one systemd unit per model server, rendered from the plan (spark/plan.py ServedLane:
its command line, environment, timeouts and canary's causes are the plan's values)."""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.facts.files import Sha1File

from operations import on_demand as demand
from operations import ray, util
from operations.asked import Question, answer, question
from operations.weights import FetchState
from spark.box_paths import (
    HF_CACHE_IN_CONTAINER,
    HF_TOKEN,
    HF_TOKEN_IN_CONTAINER,
    MODELS_DIR,
    SECRETS_DIR,
    key_path,
)
from spark.checks import ENV_NAME, LINE_BREAK
from spark.engines.record import ModelAtStart
from spark.lane import SLUG
from spark.plan import ServedLane

UNIT_DIR = "/etc/systemd/system"
PREFIX = "spark-lane-"  # of every lane's unit and container: what the deploy owns
LANE_DIR = "/etc/spark/lanes"
# Lanes load one at a time, whatever starts them (templates/spark-lane-turn.j2).
TURN_COMMAND = "/usr/local/sbin/spark-lane-turn"
LOADING_DIR = "/run/spark/loading"
# After /health, a fixed question whose answer is checked (templates/spark-lane-canary.j2).
CANARY_COMMAND = "/usr/local/sbin/spark-lane-canary"
# Measures a lane against the field's figures, run only by hand or `make lane-bench`
# (templates/spark-lane-bench.j2, lane_bench.py).
BENCH_COMMAND = "/usr/local/sbin/spark-lane-bench"
# A cluster lane's rank on executor mp, its rendezvous watched (templates/spark-lane-ranks.j2).
RANKS_COMMAND = "/usr/local/sbin/spark-lane-ranks"
# Where the container reads its secrets: mounted read-only, never passed as values.
KEY_IN_CONTAINER = "/run/secrets/api-key"
# Above 0 (everything else on the box) and below 1000: when memory runs out the kernel kills a
# lane's server before sshd (-1000), dockerd (-500) or anyone's shell (seed 003).
OOM_SCORE_ADJ = 500
SYSTEMD_PLAIN = re.compile(r"[A-Za-z0-9_./:=,@+-]+")  # a word systemd reads as it is
USERS = re.compile(r'\("([^"]*)",pid=(\d+)')  # ss -p: users:(("sshd",pid=63,fd=3),...)
SECRET_OK = "root 600"
# The authenticating front's process (operations/front.py): it owns each lane's port.
FRONT = "nginx"
# An on-demand lane's socket (operations/on_demand.py): systemd holds it, and the proxy it starts
# (systemd-socket-proxyd) shares it.
SOCKET_OWNER = "systemd"


def unit_name(lane: str) -> str:
    return f"{PREFIX}{lane}.service"


def key_made(lane: str) -> str:
    """Shell that makes the lane's key where there is none (its directory exists): 256 random
    bits, URL-safe base64 without padding or newline, a header-safe token; never replaced."""
    path = key_path(lane)
    return (
        f"[ -s {path} ] || ( umask 077; head -c 32 /dev/urandom | base64 -w0"
        f" | tr '+/' '-_' | tr -d '=' > {path}.new && mv {path}.new {path} )"
    )


class LaneUnits(FactBase):
    """The lane units on the box and their states (`systemctl show`).

    .. code:: python

        {"coder": {"ActiveState": "active", "UnitFileState": "enabled"}}
    """

    default = dict  # no lane unit: no output, and pyinfra gives the default

    def command(self) -> str:
        return (
            f"( cd {UNIT_DIR} 2>/dev/null && for unit in {PREFIX}*.service; do"
            ' [ -e "$unit" ] && systemctl show -p Id,ActiveState,UnitFileState -- "$unit"'
            " | sed 's/^/unit /'; done ); true"
        )

    def process(self, output: list[str]) -> dict[str, dict[str, str]]:
        units: dict[str, dict[str, str]] = {}
        current = None
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "unit" and "=" in rest:
                field, _, value = rest.partition("=")
                if field == "Id":
                    current = units.setdefault(
                        value.removeprefix(PREFIX).removesuffix(".service"), {}
                    )
                elif current is not None:
                    current[field] = value
        return units


class LaneAnswer(FactBase):
    """What the answer canary (templates/spark-lane-canary.j2) says of a serving lane asked
    again: None when it answers right, else the canary's lines (its judgement, the answer quoted,
    the usual causes). Reads the lane's key on the box; never prints it.

    .. code:: python

        None
    """

    def command(self, lane: str, port: int) -> str:
        return f'{CANARY_COMMAND} {shlex.quote(lane)} {port}; echo "exit $?"'

    def process(self, output: list[str]) -> str | None:
        return None if output[-1:] == ["exit 0"] else "\n".join(output[:-1])


class LocalImages(FactBase):
    """The images on the box, as registry/repository:tag and, where docker knows the digest it
    was pulled by, registry/repository@sha256:... (`docker image ls --digests`).

    .. code:: python

        {"nvcr.io/nvidia/vllm:26.04-py3", "nvcr.io/nvidia/vllm@sha256:0e4c..."}
    """

    default = set

    def command(self) -> str:
        return (
            "docker image ls --digests --format 'image {{.Repository}}:{{.Tag}} {{.Digest}}'"
            " 2>/dev/null; true"
        )

    def process(self, output: list[str]) -> set[str]:
        images = set()
        for line in output:
            if not line.startswith("image "):
                continue
            name, _, digest = line.removeprefix("image ").partition(" ")
            repository, _, tag = name.rpartition(":")
            if tag != "<none>":
                images.add(name)
            if digest.startswith("sha256:"):
                images.add(f"{repository}@{digest}")
        return images


def local_name(image: str) -> str:
    """How LocalImages lists an image: ``repo:tag``, or ``repo@digest`` for one pinned by
    digest (``repo:tag@sha256:...``: docker pulls by the digest and keeps no tag for it)."""
    name, _, digest = image.partition("@")
    if not digest:
        return image
    path, _, last = name.rpartition("/")
    repository = f"{path}/{last.partition(':')[0]}" if path else last.partition(":")[0]
    return f"{repository}@{digest}"


class LaneServing(FactBase):
    """What serving a lane asks of the box besides its unit: the API key files (owner and mode,
    never their contents), who listens on each TCP port (a container by name), whether the box
    has RDMA devices, and whether root may lift the locked-memory limit (CAP_SYS_RESOURCE, which
    a container may lack).

    .. code:: python

        {
            "keys": {"coder": "root 600"},
            "secrets_dir": "root 700",
            "listeners": {22: "sshd", 10101: "spark-lane-coder"},
            "rdma": True,
            "unlimited_memlock": True,
        }
    """

    def default(self) -> dict:
        return self.process([])

    def command(self) -> str:
        ss = "ss -ltnpH 2>/dev/null"
        return (
            f"stat -c 'secrets %U %a' {SECRETS_DIR} 2>/dev/null;"
            f" stat -c 'key %n %U %a' {SECRETS_DIR}/*.key 2>/dev/null;"
            f" {ss} | sed 's/^/listen /';"
            f" for pid in $({ss} | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do"
            " echo \"cgroup $pid $(grep -o '[0-9a-f]\\{64\\}' /proc/$pid/cgroup 2>/dev/null"
            ' | head -n 1)"; done;'
            " docker ps --no-trunc --format 'container {{.ID}} {{.Names}}' 2>/dev/null;"
            f" {util.RIGHTS_COMMAND}; true"
        )

    def process(self, output: list[str]) -> dict:
        keys, sockets, cgroups, containers, fields = {}, [], {}, {}, {}
        secrets_dir = None
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "secrets":
                secrets_dir = rest
            elif kind == "key":
                path, owner_mode = rest.split(" ", 1)
                keys[Path(path).name.removesuffix(".key")] = owner_mode
            elif kind == "listen":
                columns = rest.split()
                if len(columns) >= 4:
                    sockets.append((int(columns[3].rpartition(":")[2]), USERS.findall(rest)))
            elif kind == "cgroup":
                pid, _, container = rest.partition(" ")
                cgroups[pid] = container
            elif kind == "container":
                container, _, name = rest.partition(" ")
                containers[container] = name
            elif kind in ("rdma", "capeff"):
                fields[kind] = rest
        listeners: dict[int, str] = {}
        for port, users in sockets:
            for process_name, pid in users or [("unknown", "")]:
                owner = containers.get(cgroups.get(pid, ""), process_name)
                # Any owner that is not a lane decides: the port is someone else's.
                if port not in listeners or listeners[port].startswith(PREFIX):
                    listeners[port] = owner
        return {
            "keys": keys,
            "secrets_dir": secrets_dir,
            "listeners": listeners,
        } | util.container_rights(fields)


def systemd_word(arg: str) -> str:
    """One argument of an Exec*= line, as systemd reads it back: double-quoted with backslash
    escapes where needed, and "$" and "%" doubled (systemd expands variables and specifiers).
    A line break or NUL, which no quoting carries, was refused before (unsayable)."""
    if not SYSTEMD_PLAIN.fullmatch(arg):
        arg = '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return arg.replace("$", "$$").replace("%", "%%")


def serve_script(
    argv: Sequence[str], key_variable: str | None, model: ModelAtStart | None = None
) -> str:
    """The shell command the container runs: the server's ``argv``, with the lane's key read
    from its mounted file into the server's own ``key_variable`` just before exec (so it is in
    neither argv nor the container's configuration), and a ``model`` path read as the container
    starts (a snapshot's revision from refs/main) into its variable."""
    prelude = ""
    if model is not None:
        refs = shlex.quote(f"{model.repo}/refs/main")
        path = f"{shlex.quote(model.repo)}/snapshots/$(cat {refs})/{shlex.quote(model.file)}"
        prelude = f"{model.variable}={path} || exit 1; export {model.variable}; "
    serve = f"{prelude}exec " + " ".join(shlex.quote(arg) for arg in argv)
    if key_variable is None:
        return serve
    return f"{key_variable}=$(cat {KEY_IN_CONTAINER}) || exit 1; export {key_variable}; {serve}"


def env_lines(unit: ServedLane) -> list[tuple[str, str]]:
    """The container's environment file as the plan gives it, line by line as docker reads it
    (names and values it cannot carry were refused before: unsayable)."""
    return sorted(unit.variables.items())


def unsayable(unit: ServedLane) -> list[str]:
    """What the lane's unit and its container's environment file cannot carry, each with its
    fix: a value with a line break or NUL (systemd reads a unit, docker an environment file,
    line by line, and no quoting carries them), a variable name no shell or systemd takes, a
    lane to start after that has no lane's name (its unit's name is made of it)."""
    wrong = [
        f"{where}: {text!r} has a line break or NUL, which a unit cannot carry; remove it"
        for field, value in unit.model_dump().items()
        for where, text in _texts(value, field)
        if LINE_BREAK.search(text)
    ]
    wrong += [
        f"variables[{key}]: {key!r} is no variable name (A-Z a-z 0-9 _, no digit first); rename it"
        for key in unit.variables
        if not ENV_NAME.fullmatch(key)
    ]
    if unit.after is not None and not SLUG.fullmatch(unit.after):
        wrong.append(
            f"after: {unit.after!r} is no lane name (1-32 of a-z 0-9 -, a letter or digit"
            " first); rename that lane"
        )
    return wrong


def _texts(value: object, where: str) -> Iterator[tuple[str, str]]:
    """Every string in a plan's value, with where it is in it: argv[3], variables[HF_HOME]."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _texts(item, f"{where}[{key}]")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _texts(item, f"{where}[{index}]")


def docker_run(unit: ServedLane, rdma: bool, unlimited_memlock: bool) -> list[str]:
    """The `docker run` argument list of the lane's container; a cluster lane's on Ray gets the
    Ray token as ray.py mounts it and Ray's session directory, where its driver finds the box's
    Ray node (the raylet's sockets), sharing the Ray container's processes. A headless rank
    serves no API: no key."""
    options = ["--oom-score-adj", str(OOM_SCORE_ADJ)]
    args = util.docker_run(PREFIX + unit.name, options, rdma, unlimited_memlock)
    args += ["--env-file", f"{LANE_DIR}/{unit.name}.env"]
    args += ["-v", f"{MODELS_DIR}:{HF_CACHE_IN_CONTAINER}"]
    if unit.model_mount:  # the user's directory, read where the server is told
        args += ["-v", f"{unit.model_mount}:{unit.model_mount}:ro"]
    if unit.key_variable:
        args += ["-v", f"{key_path(unit.name)}:{KEY_IN_CONTAINER}:ro"]
    if unit.hf_token:
        args += ["-v", f"{HF_TOKEN}:{HF_TOKEN_IN_CONTAINER}:ro"]
    if unit.on_ray:  # the box's Ray node: its processes (the driver looks for its raylet)
        args += ["--pid", f"container:{ray.CONTAINER}", "-v", f"{ray.SESSION_DIR}:/tmp/ray"]
        if unit.ray_token:
            args += ["-v", f"{ray.TOKEN_PATH}:{ray.TOKEN_IN_CONTAINER}:ro"]
    script = serve_script(unit.argv, unit.key_variable, unit.model_at_start)
    if unit.replaces_entrypoint:  # the image's entrypoint is the server itself
        return [*args, "--entrypoint", "/bin/sh", unit.image, "-c", script]
    return [*args, unit.image, "/bin/sh", "-c", script]


def unit_variables(unit: ServedLane, rdma: bool, unlimited_memlock: bool) -> dict:
    """What templates/vllm-lane.service.j2 is rendered with."""
    run = docker_run(unit, rdma, unlimited_memlock)
    mark = f"{LOADING_DIR}/{unit.name}"
    timeouts = unit.timeouts
    if unit.rank is not None:  # under the rendezvous watch
        # A headless rank has no /health to wait for: the watch keeps the box's turn to load
        # until the rank is ready to serve, at most as long as a lane's health wait.
        turn = ["--turn", mark, str(timeouts.health_s)] if unit.headless else []
        peers = [
            f"{address}={box}" for address, box in zip(unit.peers, unit.peer_boxes, strict=True)
        ]
        join = str(timeouts.nodes_wait_s)
        run = [RANKS_COMMAND, *turn, str(unit.rank.master_port), join, *peers, "--", *run]
    canary = None
    if unit.canary_causes is not None:
        canary = [CANARY_COMMAND, unit.name, str(unit.server_port), *unit.canary_causes]
    return {
        "lane": unit.name,
        "port": unit.port,
        "backend_port": unit.backend_port,
        "server_port": unit.server_port,
        "health_path": unit.health_path,
        "after": unit_name(unit.after) if unit.after else None,
        "fetch_unit": unit.fetch_unit,
        "container": PREFIX + unit.name,
        "exec_start": " ".join(systemd_word(arg) for arg in run),
        "ray_nodes": unit.nnodes if unit.on_ray else None,
        "mp_peers": " ".join(unit.peers) if unit.rank is not None else None,
        "headless": unit.headless,
        "node_rank": unit.rank.node_rank if unit.rank else None,
        "nnodes": unit.nnodes,
        "master": f"{unit.rank.master_addr}:{unit.rank.master_port}" if unit.rank else None,
        "ray_unit": ray.UNIT,
        "nodes_command": ray.NODES_COMMAND,
        "turn_command": TURN_COMMAND,
        "canary_command": " ".join(systemd_word(arg) for arg in canary) if canary else None,
        "loading_mark": mark,
        "start_timeout": timeouts.start_s,
        "health_timeout": timeouts.health_s,
        "nodes_wait": timeouts.nodes_wait_s,
        **demand.lane_unit_variables(unit.name, unit.on_demand, unit_name),
    }


def _secret_commands(state: dict, name: str) -> tuple[list[str], bool]:
    """Commands that give the lane its API key, and whether the key is new (clients and the
    server must then change together: never regenerated while the file is there)."""
    commands = []
    if state["secrets_dir"] != "root 700":
        commands.append(f"install -d -m 700 -o root -g root {SECRETS_DIR}")
    path = key_path(name)
    current = state["keys"].get(name)
    if current is None:
        commands.append(key_made(name))
    elif current != SECRET_OK:
        commands.append(f"chown root:root {path} && chmod 600 {path}")
    return commands, current is None


def _port_owner_problem(state: dict, lane: ServedLane) -> str | None:
    """A port of the lane that another service holds: its own (the front's, nginx) or its
    vLLM's on loopback (an on-demand lane's: its socket's, systemd's, and its server's); a
    lane's container is one the deploy restarts or removes."""
    socket = (PREFIX,) if lane.server_port == lane.backend_port else (PREFIX, SOCKET_OWNER)
    ports = [("port", lane.port, (PREFIX, FRONT)), ("loopback_port", lane.backend_port, socket)]
    if lane.server_port != lane.backend_port:
        ports.append(("server port on demand (loopback_port + 1000)", lane.server_port, (PREFIX,)))
    for key, port, ours in ports:
        owner = state["listeners"].get(port)
        if owner is not None and not owner.startswith(ours):
            return (
                f"{host.name}: {key} {port} of lane {lane.name} is taken by {owner}; stop that"
                f" service or give the lane another {key} in group_data `lanes`"
            )
    return None


class QueuedStart(FactBase):
    """Whether a start of ``unit`` waits in systemd's queue (`systemctl list-jobs`: a lane's
    start queued after its model's fetch).

    .. code:: python

        True
    """

    def command(self, unit: str) -> str:
        return f"systemctl list-jobs --no-legend --plain {shlex.quote(unit)} 2>/dev/null; true"

    def process(self, output: list[str]) -> bool:
        # "490 spark-lane-coder.service start waiting" (job, unit, type, state)
        return any(line.split()[2:3] == ["start"] for line in output)


# How long a lane's start waits for its model's fetch before the deploy goes on: a fetch that
# lands by then (a small model) has its lane started within the deploy; a longer one goes on in
# the background, the lane's start queued after it (After=).
FETCH_WAIT_S = 10


def fetch_wait(name: str, fetch: str) -> str:
    """Shell that queues the lane's start after its model's fetch and exits 0 saying so while
    the fetch still runs after FETCH_WAIT_S; then the lane's own start follows (it waits for
    that queued job: `systemctl start` of a unit with a start job pending waits for it)."""
    running = f'[ "$(systemctl show -p ActiveState --value {fetch})" = activating ]'
    return (
        f"if {running}; then systemctl start --no-block {name}; n=0;"
        f" while {running} && [ $n -lt {FETCH_WAIT_S} ]; do sleep 1; n=$((n + 1)); done;"
        f" if {running}; then echo '{name}: starts once {fetch} lands'; exit 0; fi; fi"
    )


@operation()
def serving(unit: ServedLane, held: bool = False):
    """
    Serve one lane as the systemd unit spark-lane-<lane>, enabled and serving.

    + unit: the lane as this box runs it (spark/plan.py ``ServedLane``: its command line,
      environment, timeouts and canary's causes, rendered here as the plan gives them); its
      image is on the box (see ``images.image_present``); a port another service holds is
      refused; with the lane's key, /v1 is guarded by the key in /etc/spark/secrets/<lane>.key
      (root 0600), generated on the box when absent and never regenerated, so clients keep
      working; a cluster lane on Ray requires ``spark-ray.service`` and waits until all its Ray
      nodes have joined before its container starts; one on executor mp has a unit on every
      box (``unit.rank``) under the watch of its rendezvous (spark-lane-ranks), the head's
      serving and the others' headless (no port, no key, active once running)

    + held: write the lane's files and stop the lane where they changed, starting nothing: an
      mp cluster lane's head before its ranks start (stages/cluster.py), then served as usual

    A changed unit, environment or new key restarts this lane only; otherwise a lane that is
    not running is started. Starting returns once /health answers.

    **Example:**

    .. code:: python

        lanes.serving(name="Lane coder", unit=box_plan.lanes[0].served)
    """
    # Checked before any box is contacted (spark/lane.py: a lane's name; spark/engines/: its
    # extra_args and environment); what a plan still holds stops this box alone.
    wrong = unsayable(unit)
    if wrong:
        yield from util.refused(f"{host.name}: lane {unit.name}: {'; '.join(wrong)}")
        return
    state = answer(LaneServing)
    problem = None if unit.headless else _port_owner_problem(state, unit)
    if problem:
        yield from util.refused(problem)
        return
    with_key = unit.key_variable is not None
    commands, new_key = _secret_commands(state, unit.name) if with_key else ([], False)
    yield from commands
    env_path, name = f"{LANE_DIR}/{unit.name}.env", unit_name(unit.name)
    found = util.on_box(*lane_files(unit.name))
    env_changes = util.template(
        "vllm-lane.env.j2",
        env_path,
        found=found,
        lane=unit.name,
        variables=env_lines(unit),
    )
    yield from env_changes
    # Read at each start: a new version changes no running lane.
    scripts = [
        *util.template(
            "spark-lane-turn.j2", TURN_COMMAND, "755", found, loading_dir=LOADING_DIR, prefix=PREFIX
        ),
        *util.template(
            "spark-lane-canary.j2", CANARY_COMMAND, "755", found, secrets_dir=SECRETS_DIR
        ),
        *util.template("spark-lane-bench.j2", BENCH_COMMAND, "755", found, secrets_dir=SECRETS_DIR),
        *(
            util.template("spark-lane-ranks.j2", RANKS_COMMAND, "755", found)
            if unit.rank is not None
            else []
        ),
    ]
    yield from scripts
    unit_changes = util.template(
        "vllm-lane.service.j2",
        f"{UNIT_DIR}/{name}",
        found=found,
        **unit_variables(unit, state["rdma"], state["unlimited_memlock"]),
    )
    yield from unit_changes
    current = answer(LaneUnits).get(unit.name, {})
    # A deploy's start is deliberate: reset-failed keeps it from counting toward the unit's start
    # limit (meant for crash loops). A failed start shows the lane's own log (which holds no
    # secret) where pyinfra shows errors.
    start = f"systemctl reset-failed {name}; systemctl {{}} {name}"
    show_log = f"{{ journalctl -u {name} -n 40 --no-pager >&2; exit 1; }}"
    if unit.fetch_unit:
        start = f"{fetch_wait(name, unit.fetch_unit)}; {start}"
    running = current.get("ActiveState") == "active"
    changed = bool(unit_changes or env_changes or new_key)
    if held:
        if unit_changes:
            yield "systemctl daemon-reload"
        if changed and running:
            yield f"systemctl stop {name}"
        return
    if unit.on_demand is not None:  # not enabled, started by its socket (operations/on_demand.py)
        yield from demand.activated(
            unit.name,
            name,
            unit.on_demand,
            lane_state=current,
            lane_changed=changed,
            reload=bool(unit_changes),
            check_start=f"{start.format('restart')} || {show_log}",
        )
        return
    enabled = current.get("UnitFileState") == "enabled"
    if unit.fetch_unit and enabled and not running and not changed:
        fetch = answer(FetchState, model=unit.model, models_dir=MODELS_DIR)
        if fetch["active"] == "activating":  # its start waits in the queue after it (After=)
            if answer(QueuedStart, unit=name):
                host.noop(f"lane {unit.name}: starts once {unit.fetch_unit} lands")
            else:
                yield f"systemctl start --no-block {name}"
                host.log(f"lane {unit.name}: starts once {unit.fetch_unit} lands")
            return
    yield from util.unit_started(
        name,
        unit_changed=bool(unit_changes),
        enabled=current.get("UnitFileState"),
        running=running,
        changed=changed,
        start=f"{start.format('start')} || {show_log}",
        restart=f"{start.format('restart')} || {show_log}",
    )
    if running and not changed and unit.headless:
        host.noop(f"lane {unit.name}: rank {unit.rank.node_rank if unit.rank else '?'} running")
    elif running and not changed and unit.canary_causes is None:
        host.noop(f"lane {unit.name} is serving on port {unit.port} (canary off)")
    elif running and not changed:
        # Left running, it was not asked at a start: the deploy asks it again (it may answer
        # garbage since, its weights replaced under it, say).
        # Asked afresh when the canary was just rewritten: what was read before is its old word.
        wrong = answer(LaneAnswer, fresh=bool(scripts), lane=unit.name, port=unit.backend_port)
        if wrong:
            yield from util.refused(f"{host.name}: lane {unit.name} serves wrong answers:\n{wrong}")
            return
        host.noop(f"lane {unit.name} is serving on port {unit.port}, answering right")


@operation()
def lanes_removed(keep: list[str]):
    """
    Stop, disable and remove every lane unit (and its environment file) not in ``keep``.

    + keep: the names of the lanes the box should serve

    Their API keys stay in /etc/spark/secrets: a lane added back keeps its clients' key.
    """
    stale = sorted(set(answer(LaneUnits)) - set(keep))
    for name in stale:
        unit = unit_name(name)
        yield f"systemctl disable --now {unit}"
        # Its container too: `docker run --rm` has the daemon remove it once it exited, after
        # the unit's `docker stop` returned (docker run reference, --rm), so it may still be
        # listed, or left where the stop timed out.
        yield f"docker rm -f {PREFIX}{name} >/dev/null 2>&1 || true"
        yield f"rm -f {UNIT_DIR}/{unit} {LANE_DIR}/{name}.env"
    if stale:
        yield "systemctl daemon-reload"
        yield "systemctl reset-failed " + " ".join(unit_name(name) for name in stale) + " || true"
    else:
        host.noop("no lane unit to remove")


@operation()
def hf_token(src: str, path: str = HF_TOKEN):
    """
    Put the Hugging Face token from a file on this machine into a root 0600 file on the box,
    without it ever being readable by anyone else there, even for a moment.

    + src: the file on this machine (the inventory's ``hf_token_file``)
    + path: where the lanes read it from

    The file exists as root 0600 before the upload writes into it (a copy keeps the mode of a
    file it overwrites), and pyinfra's temporary copy is created 0600 for the login user first.
    """
    local = Path(src).read_bytes()
    if answer(Sha1File, path=path) == hashlib.sha1(local).hexdigest():
        host.noop(f"{path} holds the token")
        return
    yield from ray.root_only_upload(src, path)


def lane_files(lane: str) -> tuple[str, ...]:
    """The files ``serving`` writes for a lane: its environment, the lanes' scripts, its unit."""
    return (
        f"{LANE_DIR}/{lane}.env",
        TURN_COMMAND,
        CANARY_COMMAND,
        BENCH_COMMAND,
        RANKS_COMMAND,
        f"{UNIT_DIR}/{unit_name(lane)}",
    )


def questions(images: list[str], hf_token: bool) -> list[Question]:
    """What ``lanes_removed``, ``images.image_present`` (of these images: one question for all)
    and ``hf_token`` read (operations/asked.py)."""
    return [
        question(LaneUnits),
        *([question(LocalImages)] if images else []),
        *([question(Sha1File, path=HF_TOKEN)] if hf_token else []),
    ]


def serving_questions(unit: ServedLane) -> list[Question]:
    """What ``serving`` reads for this lane, the canary's answer included (operations/asked.py):
    asked with the others, the lane answers a canary even where the run then finds its unit
    changed and restarts it."""
    return [
        question(LaneServing),
        question(util.RootFiles, paths=lane_files(unit.name)),
        question(LaneUnits),
        *(
            [question(LaneAnswer, lane=unit.name, port=unit.backend_port)]
            if unit.canary_causes is not None and not unit.headless and unit.on_demand is None
            else []
        ),
        *(demand.activation_questions(unit.name) if unit.on_demand is not None else []),
        *(
            [
                question(FetchState, model=unit.model, models_dir=MODELS_DIR),
                question(QueuedStart, unit=unit_name(unit.name)),
            ]
            if unit.fetch_unit
            else []
        ),
    ]

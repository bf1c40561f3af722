"""Lanes: one systemd unit per model server (vLLM, or llama.cpp for a GGUF)."""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.api.exceptions import OperationError
from pyinfra.facts.files import Sha1File

from operations import ray, util
from operations.asked import Question, answer, question
from operations.preflight import hf_cache_dir
from operations.weights import FetchState
from spark import llamacpp
from spark.box_paths import HF_CACHE_IN_CONTAINER, HF_TOKEN, MODELS_DIR, SECRETS_DIR, key_path
from spark.lane import ENV_NAME, SLUG, Lane, MpRank
from spark.sm121 import is_modelopt_nvfp4, is_qwen3, quantization, uses_cutlass_fp4

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
HF_TOKEN_IN_CONTAINER = "/run/secrets/hf-token"
# Above 0 (everything else on the box) and below 1000: when memory runs out the kernel kills a
# lane's server before sshd (-1000), dockerd (-500) or anyone's shell (seed 003).
OOM_SCORE_ADJ = 500
SYSTEMD_PLAIN = re.compile(r"[A-Za-z0-9_./:=,@+-]+")  # a word systemd reads as it is
USERS = re.compile(r'\("([^"]*)",pid=(\d+)')  # ss -p: users:(("sshd",pid=63,fd=3),...)
SECRET_OK = "root 600"
# The authenticating front's process (operations/front.py): it owns each lane's port.
FRONT = "nginx"


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
    escapes where needed, and "$" and "%" doubled (systemd expands variables and specifiers)."""
    if any(character in arg for character in "\n\r\0"):
        raise OperationError(f"{arg!r}: a line break or NUL cannot be passed in a systemd unit")
    if not SYSTEMD_PLAIN.fullmatch(arg):
        arg = '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return arg.replace("$", "$$").replace("%", "%%")


def canary_causes(lane: Lane) -> list[str]:
    """The usual causes of a wrong answer for this lane's model and quantization, named by the
    canary when it fails (no secrets: they are in the unit)."""
    if lane.engine == "llama.cpp":
        return llamacpp.CANARY_CAUSES
    causes = []
    nvfp4 = quantization(lane) in ("nvfp4", "nvfp4-modelopt")
    if nvfp4 or is_modelopt_nvfp4(lane):  # known ones are refused (sm121.py); others are not
        causes.append(
            "a ModelOpt NVFP4 checkpoint (quant_method modelopt in its config.json): loads and"
            " answers confident nonsense on SM121; use a compressed-tensors NVFP4 one (seed 003)"
        )
    if nvfp4 or uses_cutlass_fp4(lane):
        causes.append(
            "NVFP4 on a CUTLASS FP4 path, not Marlin: silent garbage on SM121; Marlin is"
            " VLLM_NVFP4_GEMM_BACKEND=marlin to 0.20.1, --linear-backend marlin from 0.31.0"
            " (seed 003)"
        )
    if is_qwen3(lane):
        causes.append(
            "a thinking template hiding the answer: Qwen3 models need --generation-config vllm,"
            " or their answer stays in the reasoning (seed 003)"
        )
    causes.append(
        "a chat template that does not fit the model, or weights that do not match its config"
        " (read the answer quoted above)"
    )
    return causes


def serve_script(
    serve_args: Sequence[str], api_key: bool, gguf: tuple[str, str] | None = None
) -> str:
    """The shell command the container runs: `vllm serve`, or with ``gguf`` (a repository's
    directory in the cache and a GGUF file in it, the revision read from refs/main as the
    container starts) llama.cpp's server, with the lane's arguments. The API key is read from its
    mounted file into the server's own variable (VLLM_API_KEY, LLAMA_API_KEY) just before exec,
    so it is in neither argv nor the container's configuration."""
    server, variable, prelude = "vllm serve", "VLLM_API_KEY", ""
    if gguf is not None:
        repo, name = gguf
        refs = shlex.quote(f"{repo}/refs/main")
        model = f"{shlex.quote(repo)}/snapshots/$(cat {refs})/{shlex.quote(name)}"
        server, variable = llamacpp.SERVER, llamacpp.KEY_VARIABLE
        prelude = f"{llamacpp.MODEL_VARIABLE}={model} || exit 1; export {llamacpp.MODEL_VARIABLE}; "
    serve = f"{prelude}exec {server} " + " ".join(shlex.quote(arg) for arg in serve_args)
    if not api_key:
        return serve
    return f"{variable}=$(cat {KEY_IN_CONTAINER}) || exit 1; export {variable}; {serve}"


@dataclass(frozen=True)
class LaneUnit:
    """A validated lane as this box runs it: its systemd unit, environment file and container.

    + lane: the lane (spark/lane.py), checked before any host was contacted
    + environment: the cluster's environment (the lane's own and SM121's are added); no secrets
    + after: the lane that starts before this one, if any
    + hf_token: mount /etc/spark/secrets/hf-token (see ``hf_token``) for gated models
    + start_timeout_s: how long a start may take, model load included, until /health answers
    + models_dir: the Hugging Face cache on the box, shared by the lanes
    + ray_address: a cluster lane's Ray GCS, host:port (the head's fabric address), on Ray
    + ray_token: a cluster lane mounts Ray's token (Ray runs with token authentication), on Ray
    + rank: this box's rank of a cluster lane on executor mp (a unit on every box)
    + peers: the fabric addresses of the boxes whose ranks this box's rank meets on the head's
      master port (the head: every other box's; another box: the head's), on executor mp
    + peer_boxes: those boxes' names, in the same order (the rendezvous watch names them)
    + fetch_unit: the unit fetching its model (operations/weights.py ``fetched``), which it
      starts after; None: its model is on the box or the box stops without it
    """

    lane: Lane
    environment: Mapping[str, str] = field(default_factory=dict)
    after: str | None = None
    hf_token: bool = False
    start_timeout_s: int = 1200
    models_dir: str = MODELS_DIR
    ray_address: str | None = None
    ray_token: bool = False
    rank: MpRank | None = None
    peers: tuple[str, ...] = ()
    peer_boxes: tuple[str, ...] = ()
    fetch_unit: str | None = None

    @property
    def name(self) -> str:
        return self.lane.name

    @property
    def on_ray(self) -> bool:
        """A cluster lane on Ray: its ranks run on every box's Ray node (this box's among them)."""
        return self.lane.cluster_executor == "ray"

    @property
    def headless(self) -> bool:
        """A rank of a cluster lane (executor mp) on a box other than the head: no API."""
        return self.rank is not None and self.rank.headless

    def variables(self) -> dict[str, str]:
        """The container's environment (its env file): names and paths, never a secret."""
        # The weights are on the box before a lane starts (preflight.model_present): a lane
        # never downloads inside its start window (huggingface_hub's HF_HUB_OFFLINE: cached
        # files only); a lane's own environment may still say otherwise.
        variables = {"HF_HUB_OFFLINE": "1"} | dict(self.environment) | self.lane.container_env()
        for key, value in variables.items():
            if not ENV_NAME.fullmatch(key) or any(c in value for c in "\n\r\0"):
                raise OperationError(
                    f"lane {self.name}: environment {key}={value!r}: a name of A-Z a-z 0-9 _ and"
                    " a value without line breaks only (docker reads the file line by line)"
                )
        if self.on_ray:
            if not self.ray_address:
                raise OperationError(
                    f"lane {self.name}: a cluster lane needs ray_address (host:port)"
                )
            variables["RAY_ADDRESS"] = self.ray_address
            if self.ray_token:
                variables |= {
                    "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN_PATH": ray.TOKEN_IN_CONTAINER,
                }
        if self.hf_token:  # the path only: huggingface_hub reads the token from there
            variables["HF_TOKEN_PATH"] = HF_TOKEN_IN_CONTAINER
        return variables

    def docker_run(self, rdma: bool, unlimited_memlock: bool) -> list[str]:
        """The `docker run` argument list of the lane's container; a cluster lane's on Ray gets
        the Ray token as ray.py mounts it and Ray's session directory, where its driver finds the
        box's Ray node (the raylet's sockets), sharing the Ray container's processes. A headless
        rank serves no API: no key."""
        options = ["--oom-score-adj", str(OOM_SCORE_ADJ)]
        args = util.docker_run(PREFIX + self.name, options, rdma, unlimited_memlock)
        args += ["--env-file", f"{LANE_DIR}/{self.name}.env"]
        args += ["-v", f"{self.models_dir}:{HF_CACHE_IN_CONTAINER}"]
        if self.lane.model.startswith("/"):  # the user's directory, read where vLLM is told
            args += ["-v", f"{self.lane.model}:{self.lane.model}:ro"]
        api_key = self.lane.api_key and not self.headless
        if api_key:
            args += ["-v", f"{key_path(self.name)}:{KEY_IN_CONTAINER}:ro"]
        if self.hf_token:
            args += ["-v", f"{HF_TOKEN}:{HF_TOKEN_IN_CONTAINER}:ro"]
        if self.on_ray:  # the box's Ray node: its processes (the driver looks for its raylet)
            args += ["--pid", f"container:{ray.CONTAINER}", "-v", f"{ray.SESSION_DIR}:/tmp/ray"]
            if self.ray_token:
                args += ["-v", f"{ray.TOKEN_PATH}:{ray.TOKEN_IN_CONTAINER}:ro"]
        if self.lane.engine == "llama.cpp":  # its image's entrypoint is the server itself
            repo = hf_cache_dir(HF_CACHE_IN_CONTAINER, self.lane.model)
            gguf = (repo, self.lane.gguf_file or "")
            script = serve_script(self.lane.llama_args(), api_key, gguf)
            return [*args, "--entrypoint", "/bin/sh", self.lane.image, "-c", script]
        script = serve_script(self.lane.vllm_args(self.rank), api_key)
        return [*args, self.lane.image, "/bin/sh", "-c", script]

    def timeouts(self) -> dict[str, int]:
        """How long the unit waits: the whole start (TimeoutStartSec), the health wait inside
        it (and the turn's wait before it, and a headless rank's hold of the turn), and a
        cluster lane's wait for every Ray node or every rank of executor mp (half the start: a
        box away longer fails the start, and the restart waits again)."""
        start = self.start_timeout_s
        return {
            "start_timeout": start,
            "health_timeout": max(start - 30, 30),
            "nodes_wait": max(start // 2, 30),
        }

    def unit_variables(self, rdma: bool, unlimited_memlock: bool) -> dict:
        """What templates/vllm-lane.service.j2 is rendered with."""
        run = self.docker_run(rdma, unlimited_memlock)
        mark = f"{LOADING_DIR}/{self.name}"
        timeouts = self.timeouts()
        if self.rank is not None:  # under the rendezvous watch
            # A headless rank has no /health to wait for: the watch keeps the box's turn to load
            # while the rank loads, at most as long as a lane's health wait.
            turn = ["--turn", mark, str(timeouts["health_timeout"])] if self.headless else []
            peers = [
                f"{address}={box}" for address, box in zip(self.peers, self.peer_boxes, strict=True)
            ]
            join = str(timeouts["nodes_wait"])
            run = [RANKS_COMMAND, *turn, str(self.rank.master_port), join, *peers, "--", *run]
        return {
            "lane": self.name,
            "port": self.lane.port,
            "backend_port": self.lane.backend_port,
            "after": unit_name(self.after) if self.after else None,
            "fetch_unit": self.fetch_unit,
            "container": PREFIX + self.name,
            "exec_start": " ".join(systemd_word(arg) for arg in run),
            "ray_nodes": self.lane.tensor_parallel_size if self.on_ray else None,
            "mp_peers": " ".join(self.peers) if self.rank is not None else None,
            "headless": self.headless,
            "node_rank": self.rank.node_rank if self.rank else None,
            "nnodes": self.lane.tensor_parallel_size,
            "master": f"{self.rank.master_addr}:{self.rank.master_port}" if self.rank else None,
            "ray_unit": ray.UNIT,
            "nodes_command": ray.NODES_COMMAND,
            "turn_command": TURN_COMMAND,
            "canary_command": " ".join(
                systemd_word(arg)
                for arg in [
                    CANARY_COMMAND,
                    self.name,
                    str(self.lane.backend_port),
                    *canary_causes(self.lane),
                ]
            )
            if self.lane.canary
            else None,
            "loading_mark": mark,
            **timeouts,
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


def _port_owner_problem(state: dict, lane: Lane) -> str | None:
    """A port of the lane that another service holds: its own (the front's, nginx) or its
    vLLM's on loopback; a lane's container is one the deploy restarts or removes."""
    for key, port, ours in (
        ("port", lane.port, (PREFIX, FRONT)),
        ("loopback_port", lane.backend_port, (PREFIX,)),
    ):
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
def serving(unit: LaneUnit):
    """
    Serve one vLLM lane as the systemd unit spark-lane-<lane>, enabled and serving.

    + unit: the lane and how this box runs it (see ``LaneUnit``); its image is on the box (see
      ``images.image_present``); a port another service holds is refused; with the lane's api_key,
      /v1 is guarded by the key in /etc/spark/secrets/<lane>.key (root 0600), generated on the
      box when absent and never regenerated, so clients keep working; a cluster lane on Ray
      requires ``spark-ray.service`` and waits until all its Ray nodes have joined before its
      container starts; one on executor mp has a unit on every box (``unit.rank``) under the
      watch of its rendezvous (spark-lane-ranks), the head's serving and the others' headless
      (no port, no key, active once running)

    A changed unit, environment or new key restarts this lane only; otherwise a lane that is
    not running is started. Starting returns once /health answers.

    **Example:**

    .. code:: python

        lanes.serving(name="Lane coder", unit=lanes.LaneUnit(lane, environment, after="fast"))
    """
    lane = unit.lane
    if unit.after is not None and not SLUG.fullmatch(unit.after):
        raise OperationError(f"lane names are 1-32 of a-z 0-9 - (got after {unit.after!r})")
    state = answer(LaneServing)
    problem = None if unit.headless else _port_owner_problem(state, lane)
    if problem:
        yield from util.refused(problem)
        return
    with_key = lane.api_key and not unit.headless
    commands, new_key = _secret_commands(state, lane.name) if with_key else ([], False)
    yield from commands
    env_path, name = f"{LANE_DIR}/{lane.name}.env", unit_name(lane.name)
    found = util.on_box(*lane_files(lane.name))
    env_changes = util.template(
        "vllm-lane.env.j2",
        env_path,
        found=found,
        lane=lane.name,
        variables=sorted(unit.variables().items()),
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
        **unit.unit_variables(state["rdma"], state["unlimited_memlock"]),
    )
    yield from unit_changes
    current = answer(LaneUnits).get(lane.name, {})
    # A deploy's start is deliberate: reset-failed keeps it from counting toward the unit's start
    # limit (meant for crash loops). A failed start shows the lane's own log (which holds no
    # secret) where pyinfra shows errors.
    start = f"systemctl reset-failed {name}; systemctl {{}} {name}"
    show_log = f"{{ journalctl -u {name} -n 40 --no-pager >&2; exit 1; }}"
    if unit.fetch_unit:
        start = f"{fetch_wait(name, unit.fetch_unit)}; {start}"
    running = current.get("ActiveState") == "active"
    changed = bool(unit_changes or env_changes or new_key)
    enabled = current.get("UnitFileState") == "enabled"
    if unit.fetch_unit and enabled and not running and not changed:
        fetch = answer(FetchState, model=lane.model, models_dir=unit.models_dir)
        if fetch["active"] == "activating":  # its start waits in the queue after it (After=)
            if answer(QueuedStart, unit=name):
                host.noop(f"lane {lane.name}: starts once {unit.fetch_unit} lands")
            else:
                yield f"systemctl start --no-block {name}"
                host.log(f"lane {lane.name}: starts once {unit.fetch_unit} lands")
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
        host.noop(f"lane {lane.name}: rank {unit.rank.node_rank if unit.rank else '?'} running")
    elif running and not changed and not lane.canary:
        host.noop(f"lane {lane.name} is serving on port {lane.port} (canary off)")
    elif running and not changed:
        # Left running, it was not asked at a start: the deploy asks it again (it may answer
        # garbage since, its weights replaced under it, say).
        # Asked afresh when the canary was just rewritten: what was read before is its old word.
        wrong = answer(LaneAnswer, fresh=bool(scripts), lane=lane.name, port=lane.backend_port)
        if wrong:
            yield from util.refused(f"{host.name}: lane {lane.name} serves wrong answers:\n{wrong}")
            return
        host.noop(f"lane {lane.name} is serving on port {lane.port}, answering right")


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


def serving_questions(unit: LaneUnit) -> list[Question]:
    """What ``serving`` reads for this lane, the canary's answer included (operations/asked.py):
    asked with the others, the lane answers a canary even where the run then finds its unit
    changed and restarts it."""
    lane = unit.lane
    return [
        question(LaneServing),
        question(util.RootFiles, paths=lane_files(lane.name)),
        question(LaneUnits),
        *(
            [question(LaneAnswer, lane=lane.name, port=lane.backend_port)]
            if lane.canary and not unit.headless
            else []
        ),
        *(
            [
                question(FetchState, model=lane.model, models_dir=unit.models_dir),
                question(QueuedStart, unit=unit_name(lane.name)),
            ]
            if unit.fetch_unit
            else []
        ),
    ]

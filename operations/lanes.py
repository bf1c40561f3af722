"""vLLM lanes: one systemd unit per model server."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import click
from pyinfra import host
from pyinfra.api import FactBase, State, operation
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files

from operations import ray
from operations.hygiene import CAP_SYS_RESOURCE

TEMPLATES = Path(__file__).parents[1] / "templates"
UNIT_DIR = "/etc/systemd/system"
PREFIX = "spark-lane-"  # of every lane's unit and container: what the deploy owns
LANE_DIR = "/etc/spark/lanes"
SECRETS_DIR = "/etc/spark/secrets"
HF_TOKEN = f"{SECRETS_DIR}/hf-token"
MODELS_DIR = "/var/lib/spark/models"
# Where the container reads its secrets: mounted read-only, never passed as values.
KEY_IN_CONTAINER = "/run/secrets/api-key"
HF_TOKEN_IN_CONTAINER = "/run/secrets/hf-token"
# Above 0 (everything else on the box) and below 1000: when memory runs out the kernel kills a
# lane's server before sshd (-1000), dockerd (-500) or anyone's shell (seed 003).
OOM_SCORE_ADJ = 500
NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")  # the Lane model's slug
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SYSTEMD_PLAIN = re.compile(r"[A-Za-z0-9_./:=,@+-]+")  # a word systemd reads as it is
USERS = re.compile(r'\("([^"]*)",pid=(\d+)')  # ss -p: users:(("sshd",pid=63,fd=3),...)
SECRET_OK = "root 600"


def unit_name(lane: str) -> str:
    return f"{PREFIX}{lane}.service"


def key_path(lane: str) -> str:
    return f"{SECRETS_DIR}/{lane}.key"


class LaneHost(FactBase):
    """Everything the lane operations ask of a box, in one command: the lane units and their
    states, the API key files (owner and mode, never their contents), the local images, who
    listens on each TCP port (a container by name), whether the box has RDMA devices, and whether
    root may lift the locked-memory limit (CAP_SYS_RESOURCE, which a container may lack).

    .. code:: python

        {
            "units": {"coder": {"ActiveState": "active", "UnitFileState": "enabled"}},
            "keys": {"coder": "root 600"},
            "secrets_dir": "root 700",
            "images": {"nvcr.io/nvidia/vllm:26.04-py3"},
            "listeners": {22: "sshd", 10101: "spark-lane-coder"},
            "rdma": True,
            "unlimited_memlock": True,
        }
    """

    def command(self) -> str:
        ss = "ss -ltnpH 2>/dev/null"
        return (
            f"( cd {UNIT_DIR} 2>/dev/null && for unit in {PREFIX}*.service; do"
            ' [ -e "$unit" ] && systemctl show -p Id,ActiveState,UnitFileState -- "$unit"'
            " | sed 's/^/unit /'; done );"
            f" stat -c 'secrets %U %a' {SECRETS_DIR} 2>/dev/null;"
            f" stat -c 'key %n %U %a' {SECRETS_DIR}/*.key 2>/dev/null;"
            " docker image ls --format 'image {{.Repository}}:{{.Tag}}' 2>/dev/null;"
            f" {ss} | sed 's/^/listen /';"
            f" for pid in $({ss} | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do"
            " echo \"cgroup $pid $(grep -o '[0-9a-f]\\{64\\}' /proc/$pid/cgroup 2>/dev/null"
            ' | head -n 1)"; done;'
            " docker ps --no-trunc --format 'container {{.ID}} {{.Names}}' 2>/dev/null;"
            " [ -d /dev/infiniband ] && echo rdma;"
            " sed -n 's/^CapEff:[[:space:]]*/capeff /p' /proc/self/status; true"
        )

    def process(self, output: list[str]) -> dict:
        units: dict[str, dict[str, str]] = {}
        keys, images, sockets, cgroups, containers = {}, set(), [], {}, {}
        secrets_dir, rdma, capabilities, current = None, False, 0, None
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
            elif kind == "secrets":
                secrets_dir = rest
            elif kind == "key":
                path, owner_mode = rest.split(" ", 1)
                keys[Path(path).name.removesuffix(".key")] = owner_mode
            elif kind == "image":
                images.add(rest)
            elif kind == "listen":
                fields = rest.split()
                users = USERS.findall(rest)
                if len(fields) >= 4:
                    sockets.append((int(fields[3].rpartition(":")[2]), users))
            elif kind == "cgroup":
                pid, _, container = rest.partition(" ")
                cgroups[pid] = container
            elif kind == "container":
                container, _, name = rest.partition(" ")
                containers[container] = name
            elif kind == "rdma":
                rdma = True
            elif kind == "capeff":
                capabilities = int(rest, 16)
        listeners: dict[int, str] = {}
        for port, users in sockets:
            for process_name, pid in users or [("unknown", "")]:
                owner = containers.get(cgroups.get(pid, ""), process_name)
                # Any owner that is not a lane decides: the port is someone else's.
                if port not in listeners or listeners[port].startswith(PREFIX):
                    listeners[port] = owner
        return {
            "units": units,
            "keys": keys,
            "secrets_dir": secrets_dir,
            "images": images,
            "listeners": listeners,
            "rdma": rdma,
            "unlimited_memlock": bool(capabilities >> CAP_SYS_RESOURCE & 1),
        }


def systemd_word(arg: str) -> str:
    """One argument of an Exec*= line, as systemd reads it back: double-quoted with backslash
    escapes where needed, and "$" and "%" doubled (systemd expands variables and specifiers)."""
    if any(character in arg for character in "\n\r\0"):
        raise OperationError(f"{arg!r}: a line break or NUL cannot be passed in a systemd unit")
    if not SYSTEMD_PLAIN.fullmatch(arg):
        arg = '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return arg.replace("$", "$$").replace("%", "%%")


def serve_script(serve_args: Sequence[str], api_key: bool) -> str:
    """The shell command the container runs: `vllm serve` with the lane's arguments, the API key
    read from its mounted file into VLLM_API_KEY (vLLM's own variable) just before exec, so it is
    in neither argv nor the container's configuration."""
    serve = "exec vllm serve " + " ".join(shlex.quote(arg) for arg in serve_args)
    if not api_key:
        return serve
    return f"VLLM_API_KEY=$(cat {KEY_IN_CONTAINER}) || exit 1; export VLLM_API_KEY; {serve}"


def docker_run(
    name: str,
    image: str,
    serve_args: Sequence[str],
    api_key: bool,
    hf_token: bool,
    rdma: bool,
    unlimited_memlock: bool,
    models_dir: str,
    cluster: bool = False,
    ray_token: bool = False,
) -> list[str]:
    """The `docker run` argument list of a lane's container; a cluster lane's gets the Ray
    token as ray.py mounts it (``ray_token``) and Ray's session directory, where its driver
    finds the box's Ray node (the raylet's sockets), sharing the Ray container's processes
    (``cluster``)."""
    container = PREFIX + name
    args = ["/usr/bin/docker", "run", "--rm", "--name", container, "--gpus", "all"]
    args += ["--network", "host", "--ipc", "host", "--oom-score-adj", str(OOM_SCORE_ADJ)]
    if unlimited_memlock:  # RDMA registers (pins) memory; a container without the right keeps 8 MiB
        args += ["--ulimit", "memlock=-1"]
    if rdma:  # or NCCL silently falls back to sockets (vllm PR#42075)
        args += ["--device", "/dev/infiniband"]
    args += ["--env-file", f"{LANE_DIR}/{name}.env"]
    args += ["-v", f"{models_dir}:/root/.cache/huggingface"]
    if api_key:
        args += ["-v", f"{key_path(name)}:{KEY_IN_CONTAINER}:ro"]
    if hf_token:
        args += ["-v", f"{HF_TOKEN}:{HF_TOKEN_IN_CONTAINER}:ro"]
    if cluster:  # the box's Ray node: its processes (the driver looks for its raylet there)
        args += ["--pid", f"container:{ray.CONTAINER}", "-v", f"{ray.SESSION_DIR}:/tmp/ray"]
    if ray_token:
        args += ["-v", f"{ray.TOKEN_PATH}:{ray.TOKEN_IN_CONTAINER}:ro"]
    return [*args, image, "/bin/sh", "-c", serve_script(serve_args, api_key)]


def _secret_commands(state: dict, name: str) -> tuple[list[str], bool]:
    """Commands that give the lane its API key, and whether the key is new (clients and the
    server must then change together: never regenerated while the file is there)."""
    commands = []
    if state["secrets_dir"] != "root 700":
        commands.append(f"install -d -m 700 -o root -g root {SECRETS_DIR}")
    path = key_path(name)
    current = state["keys"].get(name)
    if current is None:
        # 256 random bits, URL-safe base64 without padding or newline: a header-safe token.
        commands.append(
            f"[ -s {path} ] || ( umask 077; head -c 32 /dev/urandom | base64 -w0"
            f" | tr '+/' '-_' | tr -d '=' > {path}.new && mv {path}.new {path} )"
        )
    elif current != SECRET_OK:
        commands.append(f"chown root:root {path} && chmod 600 {path}")
    return commands, current is None


def _port_owner_problem(state: dict, lane: str, port: int) -> str | None:
    owner = state["listeners"].get(port)
    if owner is None or owner.startswith(PREFIX):
        return None  # free, or a lane's container the deploy restarts or removes
    return (
        f"{host.name}: port {port} of lane {lane} is taken by {owner}; stop that service or"
        " give the lane another port in group_data `lanes`"
    )


@operation()
def serving(
    lane: str,
    image: str,
    serve_args: list[str],
    port: int,
    environment: dict[str, str],
    api_key: bool = True,
    after: str | None = None,
    hf_token: bool = False,
    start_timeout_s: int = 1200,
    models_dir: str = MODELS_DIR,
    cluster_nodes: int = 1,
    ray_address: str | None = None,
    ray_token: bool = False,
):
    """
    Serve one vLLM lane as the systemd unit spark-lane-<lane>, enabled and serving.

    + lane: the lane's name (a-z, 0-9, -)
    + image: the serving image; present on the box (see ``image_present``)
    + serve_args: everything after `vllm serve`, model first; never an API key
    + port: the port vLLM listens on (in serve_args too); refused when another service holds it
    + environment: the container's environment (the cluster's and the lane's); no secrets
    + api_key: guard /v1 with the key in /etc/spark/secrets/<lane>.key (root 0600), generated on
      the box when absent and never regenerated, so clients keep working
    + after: the lane that starts before this one, if any
    + hf_token: mount /etc/spark/secrets/hf-token (see ``hf_token``) for gated models
    + start_timeout_s: how long a start may take, model load included, until /health answers
    + models_dir: the Hugging Face cache on the box, shared by the lanes
    + cluster_nodes: above 1, a cluster lane: its ranks run on this many Ray nodes (this box's
      among them, see ``ray.node``); the unit requires ``spark-ray.service`` and waits until
      all of them have joined before its container starts
    + ray_address: a cluster lane's Ray GCS, host:port (the head's fabric address)
    + ray_token: a cluster lane mounts Ray's token (Ray runs with token authentication)

    A changed unit, environment or new key restarts this lane only; otherwise a lane that is
    not running is started. Starting returns once /health answers.
    """
    if not NAME.fullmatch(lane) or (after is not None and not NAME.fullmatch(after)):
        raise OperationError(f"lane names are 1-32 of a-z 0-9 - (got {lane!r}, after {after!r})")
    for key, value in environment.items():
        if not ENV_NAME.fullmatch(key) or any(c in value for c in "\n\r\0"):
            raise OperationError(
                f"lane {lane}: environment {key}={value!r}: a name of A-Z a-z 0-9 _ and a value"
                " without line breaks only (docker reads the file line by line)"
            )
    state = host.get_fact(LaneHost)
    problem = _port_owner_problem(state, lane, port)
    if problem:
        raise OperationError(problem)

    commands, new_key = _secret_commands(state, lane) if api_key else ([], False)
    yield from commands
    cluster = cluster_nodes > 1
    if cluster and not ray_address:
        raise OperationError(f"lane {lane}: a cluster lane needs ray_address (host:port)")
    variables = dict(environment)
    if cluster:
        variables["RAY_ADDRESS"] = str(ray_address)
        if ray_token:
            variables |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": ray.TOKEN_IN_CONTAINER}
    if hf_token:  # the path only: huggingface_hub reads the token from there
        variables["HF_TOKEN_PATH"] = HF_TOKEN_IN_CONTAINER
    env_changes = list(
        files.template._inner(
            src=str(TEMPLATES / "vllm-lane.env.j2"),
            dest=f"{LANE_DIR}/{lane}.env",
            user="root",
            group="root",
            mode="644",
            lane=lane,
            variables=sorted(variables.items()),
        )
    )
    yield from env_changes
    run = docker_run(
        lane,
        image,
        serve_args,
        api_key,
        hf_token,
        state["rdma"],
        state["unlimited_memlock"],
        models_dir,
        cluster=cluster,
        ray_token=cluster and ray_token,
    )
    unit = unit_name(lane)
    unit_changes = list(
        files.template._inner(
            src=str(TEMPLATES / "vllm-lane.service.j2"),
            dest=f"{UNIT_DIR}/{unit}",
            user="root",
            group="root",
            mode="644",
            lane=lane,
            port=port,
            after=unit_name(after) if after else None,
            container=PREFIX + lane,
            exec_start=" ".join(systemd_word(arg) for arg in run),
            start_timeout=start_timeout_s,
            health_timeout=max(start_timeout_s - 30, 30),
            cluster_nodes=cluster_nodes if cluster else None,
            ray_unit=ray.UNIT,
            nodes_command=ray.NODES_COMMAND,
            # Half the start for the nodes, half for the load; a box away longer fails the
            # start, and the restart waits again.
            nodes_wait=max(start_timeout_s // 2, 30),
        )
    )
    yield from unit_changes
    if unit_changes:
        yield "systemctl daemon-reload"
    current = state["units"].get(lane, {})
    if current.get("UnitFileState") != "enabled":
        yield f"systemctl enable {unit}"
    # A deploy's start is deliberate: reset-failed keeps it from counting toward the unit's start
    # limit (meant for crash loops). A failed start shows the lane's own log (which holds no
    # secret) where pyinfra shows errors.
    start = f"systemctl reset-failed {unit}; systemctl {{}} {unit}"
    show_log = f"{{ journalctl -u {unit} -n 40 --no-pager >&2; exit 1; }}"
    if unit_changes or env_changes or new_key:
        yield f"{start.format('restart')} || {show_log}"
    elif current.get("ActiveState") != "active":
        yield f"{start.format('start')} || {show_log}"
    else:
        host.noop(f"lane {lane} is serving on port {port}")


@operation()
def lanes_removed(keep: list[str]):
    """
    Stop, disable and remove every lane unit (and its environment file) not in ``keep``.

    + keep: the names of the lanes the box should serve

    Their API keys stay in /etc/spark/secrets: a lane added back keeps its clients' key.
    """
    stale = sorted(set(host.get_fact(LaneHost)["units"]) - set(keep))
    for name in stale:
        unit = unit_name(name)
        yield f"systemctl disable --now {unit}"
        yield f"rm -f {UNIT_DIR}/{unit} {LANE_DIR}/{name}.env"
    if stale:
        yield "systemctl daemon-reload"
        yield "systemctl reset-failed " + " ".join(unit_name(name) for name in stale) + " || true"
    else:
        host.noop("no lane unit to remove")


@operation()
def image_present(image: str):
    """
    Make sure the serving image is on the box: `docker pull` it when absent (tens of GB: the
    first deploy of a box takes a while here), never when present (pinned tags do not move).

    + image: registry/repository:tag
    """
    if image in host.get_fact(LaneHost)["images"]:
        host.noop(f"{image} is present")
    else:
        yield ray.pull(image)


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
    if host.get_fact(Sha1File, path=path) == hashlib.sha1(local).hexdigest():
        host.noop(f"{path} holds the token")
        return
    yield from ray.root_only_upload(src, path)


# --- after the run: the endpoints table and a client configuration ---------------------------


class Endpoint(NamedTuple):
    """One lane as its clients see it."""

    lane: str
    served_name: str
    url: str  # the OpenAI base URL, ending in /v1
    memory_fraction: float
    max_model_len: int
    api_key: bool


def opencode_config(box: str, endpoints: Sequence[Endpoint]) -> dict:
    """An OpenCode configuration (as in seed 002) with one provider per lane of the box. The key
    is read from a file on the client ({file:...}), never written here."""
    slug = re.sub(r"[^a-z0-9-]+", "-", box.lower())
    providers = {}
    for endpoint in endpoints:
        options = {"baseURL": endpoint.url}
        if endpoint.api_key:
            options["apiKey"] = f"{{file:~/.config/opencode/{slug}-{endpoint.lane}.key}}"
        limit = {
            "context": endpoint.max_model_len,
            # Seed 002 leaves 16K of its 128K context for output; never more than a quarter.
            "output": min(16384, endpoint.max_model_len // 4),
        }
        providers[f"{slug}-{endpoint.lane}"] = {
            "npm": "@ai-sdk/openai-compatible",
            "name": f"{box} {endpoint.lane}",
            "options": options,
            "models": {endpoint.served_name: {"name": endpoint.served_name, "limit": limit}},
        }
    return {"$schema": "https://opencode.ai/config.json", "provider": providers}


def endpoints_table(endpoints: dict[str, Sequence[Endpoint]]) -> str:
    """The lanes of every box, one line each, and where their keys are."""
    rows = [("box", "lane", "served name", "URL", "memory", "API key")]
    rows += [
        (
            box,
            e.lane,
            e.served_name,
            e.url,
            f"{e.memory_fraction:.2f}",
            key_path(e.lane) if e.api_key else "none",
        )
        for box, lanes in endpoints.items()
        for e in lanes
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "    " + "  ".join(f"{c:{w}}" for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


class EndpointsReport(BaseStateCallback):
    """Once the run is over (pyinfra's results printed, hosts disconnecting): the endpoints of
    every box whose deploy succeeded, and clients/<box>.json for each."""

    def __init__(self) -> None:
        self.endpoints: dict[str, list[Endpoint]] = {}
        self.done = False

    def host_disconnect(self, state: State, host: Host) -> None:
        # The Disconnect stage is reached only after the operations ran (not with --dry).
        if self.done or state.current_stage != StateStage.Disconnect:
            return
        self.done = True
        failed = {failed.name for failed in state.failed_hosts}
        served = {box: e for box, e in self.endpoints.items() if box not in failed and e}
        if not served:
            return
        clients = Path(state.cwd or ".") / "clients"
        clients.mkdir(exist_ok=True)
        for box, endpoints in served.items():
            text = json.dumps(opencode_config(box, endpoints), indent=2) + "\n"
            (clients / f"{box}.json").write_text(text)
        click.echo("--> vLLM lanes serving:", err=True)
        click.echo(endpoints_table(served), err=True)
        click.echo(
            f"    OpenCode configuration: clients/<box>.json. Keys stay on the boxes; copy one"
            f" without showing it: ssh <box> sudo cat {SECRETS_DIR}/<lane>.key >"
            " ~/.config/opencode/<box>-<lane>.key",
            err=True,
        )


_reports: weakref.WeakKeyDictionary[State, EndpointsReport] = weakref.WeakKeyDictionary()


def report_endpoints(state: State, box: str, endpoints: Sequence[Endpoint]) -> None:
    """Print this box's endpoints after the run (call from deploy.py, once per box)."""
    if state not in _reports:
        _reports[state] = EndpointsReport()
        state.add_callback_handler(_reports[state])
    _reports[state].endpoints[box] = list(endpoints)

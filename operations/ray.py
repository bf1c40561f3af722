"""Ray over the fabric: head and workers as systemd units."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shlex
from io import StringIO
from pathlib import Path
from typing import Literal

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import File

from operations import util
from operations.asked import Question, answer, question
from spark.box_paths import RAY_TOKEN_IN_CONTAINER as TOKEN_IN_CONTAINER
from spark.box_paths import SECRETS_DIR
from spark.ports import DASHBOARD_PORT, PORT_OPTIONS, WORKER_PORTS

UNIT = "spark-ray.service"  # what the cluster lane orders itself after
CONTAINER = "spark-ray"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
# `spark-ray-nodes N [SECONDS]`: exits 0 once N Ray nodes are alive (waiting up to SECONDS).
NODES_COMMAND = "/usr/local/sbin/spark-ray-nodes"
TOKEN_PATH = f"{SECRETS_DIR}/ray-auth-token"
# Ray's session directory (/tmp/ray in its container), kept on the box: a cluster lane's driver
# finds the raylet's sockets there (and the raylet itself in the Ray container's processes).
SESSION_DIR = "/var/lib/spark/ray"
# "<image id> <its `ray --version`>": the image checked once, not on every run (a container's
# start costs about 1.5 s, the largest part of a no-change run).
RAY_CHECKED = "/var/lib/spark/ray-image-checked"
# The controller keeps the cluster's token: every box must hold the same one.
CONTROLLER_TOKEN = Path("~/.config/spark-provisioning/ray-auth-token")
TOKEN_AUTH_SINCE = (2, 52)  # Ray's RAY_AUTH_MODE=token (field-facts, "Security")
# Ray's defaults, pinned so that the firewall can name every port (field-facts, "Security").
RAY_VERSION = re.compile(r"version (\d+)\.(\d+)")
PLAIN = re.compile(r"[A-Za-z0-9_./:=,@+-]+")


class Secret(str):
    """A string that never shows itself in a repr (pyinfra may log operation arguments)."""

    def __repr__(self) -> str:
        return "<secret>"


def controller_token(path: Path = CONTROLLER_TOKEN) -> Secret:
    """The cluster's Ray token, made once on this machine (256 random bits in hex, as Ray's own
    `ray get-auth-token --generate` makes them) and kept there, readable by its user only."""
    path = path.expanduser()
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another run made it first: use that one
            pass
        else:
            with os.fdopen(descriptor, "w") as file:
                file.write(secrets.token_hex(32))
    return Secret(path.read_text().strip())


def ray_start(role: Literal["head", "worker"], node_ip: str, head_ip: str, port: int) -> list[str]:
    """The `ray start` command line of a head or a worker, in the foreground for systemd."""
    args = ["ray", "start", "--block", f"--node-ip-address={node_ip}", "--num-gpus=1"]
    if role == "head":
        # Its client server (CLIENT_PORT) starts where the image has ray[client]; naming the
        # port where it has not fails the start.
        args += ["--head", f"--port={port}", "--dashboard-host=127.0.0.1"]
        args.append(f"--dashboard-port={DASHBOARD_PORT}")
    else:
        args.append(f"--address={head_ip}:{port}")
    args += [f"{option}={port + n}" for n, option in enumerate(PORT_OPTIONS, 1)]
    args += [f"--min-worker-port={WORKER_PORTS[0]}", f"--max-worker-port={WORKER_PORTS[1]}"]
    return [*args, "--disable-usage-stats"]


def docker_run(
    image: str,
    ray_args: list[str],
    env_names: list[str],
    auth: bool,
    rdma: bool,
    unlimited_memlock: bool,
    models: tuple[tuple[str, str], ...] = (),
) -> list[str]:
    """The container of a Ray node: host network and IPC, the GPU, the RDMA devices, the
    cluster environment passed by name (systemd reads the file: docker's --env-file would keep
    its quotes), the token as a read-only file, and the models: a cluster lane's workers run in
    this container and read the weights on their own box (vLLM's run_cluster.sh mounts the
    Hugging Face cache into every node's container), never downloading them there."""
    args = util.docker_run(CONTAINER, ["--shm-size", "10.24g"], rdma, unlimited_memlock)
    for name in env_names:
        args += ["-e", name]
    for on_box, in_container in models:
        args += ["-v", f"{on_box}:{in_container}"]
    if models:
        args += ["-e", "HF_HUB_OFFLINE=1"]  # as the lanes: the deploy put the weights there
    if auth:
        args += ["-e", "RAY_AUTH_MODE=token", "-e", f"RAY_AUTH_TOKEN_PATH={TOKEN_IN_CONTAINER}"]
        args += ["-v", f"{TOKEN_PATH}:{TOKEN_IN_CONTAINER}:ro"]
    args += ["-v", f"{SESSION_DIR}:/tmp/ray"]
    return [*args, image, *ray_args]


def ray_version(image: str) -> str:
    """The command printing the image's ``ray --version`` (fails when it has no Ray)."""
    return f"docker run --rm --network none --entrypoint ray {shlex.quote(image)} --version"


def record_ray_version(image: str) -> str:
    """The command that checks the image's Ray and records it in RAY_CHECKED for RayNode."""
    quoted = shlex.quote(image)
    return (
        f'version=$({ray_version(image)} | head -n 1) && [ -n "$version" ]'
        f" && id=$(docker image inspect --format '{{{{.Id}}}}' {quoted})"
        f" && install -d -m 755 {os.path.dirname(RAY_CHECKED)}"
        f' && echo "$id $version" > {RAY_CHECKED}'
    )


def root_only_upload(source: str | StringIO, path: str) -> list:
    """Commands that put a secret into ``path``, readable by root only at every moment: the file
    is 0600 before the upload writes into it (a copy keeps the mode of the file it overwrites)
    and pyinfra's temporary copy is made 0600 for the login user first. Not files.put: its
    --diff would print the secret."""
    temporary = host.get_temp_filename(path)
    directory = shlex.quote(os.path.dirname(path))
    return [
        f"install -d -m 700 -o root -g root {directory}"
        f" && {{ [ -e {path} ] || install -m 600 /dev/null {path}; }}"
        f" && chown root:root {path} && chmod 600 {path}"
        f' && install -m 600 -o "${{SUDO_USER:-root}}" /dev/null {temporary}',
        FileUploadCommand(source, path, remote_temp_filename=temporary),
    ]


class RayNode(FactBase):
    """What a Ray node needs from the box: the image (and its Ray's version, from RAY_CHECKED
    when it holds this image, else from the image itself), the unit's state, the token's
    SHA-256 (never the token), RDMA devices and whether memlock may be raised.

    .. code:: python

        {"image": "sha256:0f3c...", "ray": (2, 60), "checked": True, "enabled": "enabled",
         "active": "active", "token": "9e1c...", "rdma": True, "unlimited_memlock": True}
    """

    def command(self, image: str) -> str:
        image = shlex.quote(image)
        return (
            f"id=$(docker image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null);"
            ' echo "image ${id:--}";'
            f' checked=$(cat {RAY_CHECKED} 2>/dev/null); if [ -z "$id" ]; then :;'
            ' elif [ "${checked%% *}" = "$id" ]; then echo "ray ${checked#* }"; echo checked;'
            f' else echo "ray $({ray_version(image)} 2>/dev/null | head -n 1)"; fi;'
            f' echo "enabled $(systemctl is-enabled {UNIT} 2>/dev/null)";'
            f' echo "active $(systemctl is-active {UNIT} 2>/dev/null)";'
            f' echo "token $(sha256sum {TOKEN_PATH} 2>/dev/null | cut -d" " -f1)";'
            f" {util.RIGHTS_COMMAND}; true"
        )

    def process(self, output: list[str]) -> dict:
        fields = dict(line.partition(" ")[::2] for line in output)
        version = RAY_VERSION.search(fields.get("ray", ""))
        return {
            "image": None if fields.get("image", "-") == "-" else fields["image"],
            "ray": (int(version[1]), int(version[2])) if version else None,
            "checked": "checked" in fields,
            "enabled": fields.get("enabled") or None,
            "active": fields.get("active") or None,
            "token": fields.get("token") or None,
        } | util.container_rights(fields)


def _token_commands(token: Secret, current: str | None) -> list:
    """Commands that put the token on the box (root only), unless it holds it already."""
    if current == hashlib.sha256(token.encode()).hexdigest():
        return []
    return root_only_upload(StringIO(token), TOKEN_PATH)


@operation()
def node(
    role: Literal["head", "worker"],
    node_ip: str,
    head_ip: str,
    image: str,
    environment: dict[str, str],
    env_file: str,
    port: int,
    token: Secret | None = None,
    models: tuple[tuple[str, str], ...] = (),
    head: str | None = None,
):
    """
    Run this box's Ray node (the head, or a worker joining it) as ``spark-ray.service``.

    + role: "head" on one box, "worker" on the others
    + node_ip: this box's address on the first fabric twin: Ray binds to it
    + head_ip: the head's address on the first fabric twin
    + image: the serving image Ray runs in (pulled when absent)
    + environment: the cluster environment (the file env_file holds), passed to the container
    + env_file: the cluster environment file the unit reads
    + port: the GCS port of the head; Ray's next six ports follow it
    + token: Ray's token authentication with this token (Ray 2.52 or later); None: without
    + models: (directory on the box, its path in the container) the cluster lane's workers
      read the weights from
    + head: the head's name: a worker whose head stopped in this run stops here, saying so (a
      head needs no worker, and a worker no other worker)

    A worker started before its head keeps retrying (Restart=always, no start limit); one that
    lost its head (the head restarted) exits, and systemd starts it again: it rejoins. A change
    of the unit, the token or the environment restarts the node.

    **Example:**

    .. code:: python

        ray.node(name="Ray", role="head", node_ip="192.168.100.10", head_ip="192.168.100.10",
                 image="nvcr.io/nvidia/vllm:26.04-py3", environment=env, env_file=env_file,
                 port=6379, token=token)
    """
    # Every word of ExecStart= stands unquoted: systemd would expand a "%" or "$" in it. The
    # inventory's checks admit only plain ones (spark/inventory/: addresses, ray_image, the
    # models' paths); here another stops this box alone.
    given = [image, node_ip, head_ip, *environment, *(path for pair in models for path in pair)]
    if unplain := [word for word in given if not PLAIN.fullmatch(word)]:
        yield from util.refused(
            f"{host.name}: {', '.join(map(repr, unplain))} cannot stand unquoted in {UNIT}"
            " (letters, digits and ._/:=,@+- only)"
        )
        return
    if role == "worker" and (stopped := util.missing([head] if head else [])):
        yield from util.refused(f"{host.name}: this Ray worker {util.waits_for(stopped)}")
        return
    state = answer(RayNode, image=image)
    changes: list = []
    if state["image"] is None:
        # The version is compared on the next run; today a missing Ray stops this one here.
        yield util.pull(image, host.name)
        yield record_ray_version(image)
    elif state["ray"] is None:
        yield from util.refused(
            f"{host.name}: {image} has no Ray (some NGC vLLM images ship without it:"
            " dgx-spark-playbooks#109); set ray_image to an image whose `ray --version` works"
        )
        return
    elif token is not None and state["ray"] < TOKEN_AUTH_SINCE:
        yield from util.refused(
            f"{host.name}: {image} has Ray {'.'.join(map(str, state['ray']))}, without token"
            " authentication (Ray 2.52 and later); use an image with a newer Ray, or set"
            " ray_auth = False (then only the firewall keeps others off Ray's ports)"
        )
        return
    elif not state["checked"]:
        yield record_ray_version(image)
    if token is not None:
        changes += _token_commands(token, state["token"])
    found = util.on_box(NODES_COMMAND, UNIT_PATH)
    script = util.template(
        "spark-ray-nodes.sh.j2", NODES_COMMAND, "755", found, container=CONTAINER
    )
    exec_start = docker_run(
        image,
        ray_start(role, node_ip, head_ip, port),
        sorted(environment),
        auth=token is not None,
        rdma=state["rdma"],
        unlimited_memlock=state["unlimited_memlock"],
        models=models,
    )
    unit = util.template(
        "spark-ray.service.j2",
        UNIT_PATH,
        found=found,
        role=role,
        node_ip=node_ip,
        head=f"{head_ip}:{port}",
        env_file=env_file,
        # Values are not in the unit: their digest is, so that a change restarts Ray.
        env_digest=hashlib.sha256(repr(sorted(environment.items())).encode()).hexdigest(),
        container=CONTAINER,
        exec_start=" \\\n    ".join(exec_start),
    )
    yield from script
    yield from changes
    yield from unit
    # "activating": between two tries of a worker whose head is not up yet.
    running = state["active"] in ("active", "activating")
    yield from util.unit_started(
        UNIT,
        unit_changed=bool(unit),
        enabled=state["enabled"],
        running=running,
        changed=running and bool(unit or changes),
    )
    if running and not (unit or changes) and state["enabled"] == "enabled" and not script:
        host.noop(f"Ray {role} runs on {node_ip} ({UNIT})")


@operation()
def node_removed():
    """
    Stop, disable and remove this box's Ray node (``spark-ray.service``) where one is left from
    a cluster lane on Ray: a cluster lane on vLLM's own multi-node mode (executor mp) needs no
    Ray, whose containers would hold memory the lanes need. Its token and images stay.
    """
    if answer(File, path=UNIT_PATH) is None:
        host.noop(f"no {UNIT} on this box")
        return
    yield f"systemctl disable --now {UNIT}"
    yield f"rm -f {UNIT_PATH}"
    yield "systemctl daemon-reload"
    # The node's container stops with an error status: the unit stays listed as failed.
    yield f"systemctl reset-failed {UNIT} || true"


def questions(image: str | None) -> list[Question]:
    """What ``node`` (Ray in this image) or else ``node_removed`` reads (operations/asked.py)."""
    if image is None:
        return [question(File, path=UNIT_PATH)]
    return [
        question(RayNode, image=image),
        question(util.RootFiles, paths=(NODES_COMMAND, UNIT_PATH)),
    ]

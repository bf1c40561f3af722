"""The fleet's router on its box: LiteLLM's proxy, pinned, in a virtualenv under systemd, holding
the fleet key and every lane's key (spark/router.py says what runs and how)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import FactBase, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.host import Host

from operations import debpkg, util
from operations.asked import Question, answer, question
from operations.lanes import key_made
from operations.preflight import boxes_in_run
from operations.ray import root_only_upload
from spark.box_paths import FLEET_KEY, SECRETS_DIR, key_path
from spark.router import (
    CA_BUNDLE,
    CACHE_DIRS,
    CONFIG,
    ENVIRONMENT,
    FLEET_KEY_VARIABLE,
    INSTALLED,
    OFFLINE,
    REQUIREMENTS,
    ROUTER_DIR,
    UNIT,
    VENV,
)

PACKAGE = "python3-venv"  # the distribution's venv module: Debian and Ubuntu split it out
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
# What a key may hold to stand in an EnvironmentFile unquoted and in nginx's map (a Bearer
# token, RFC 6750 b64token): the deploy's own keys are URL-safe base64 (operations/lanes.py).
KEY = re.compile(r"[A-Za-z0-9._~+/=-]+")
# LiteLLM's start, from the unit's start to /health/liveliness answering: 61 and 95 s on this
# project's busy 2-core machine (README, the router); five minutes before the box is stopped.
START_TIMEOUT_S = 300
LIVELINESS = "/health/liveliness"  # LiteLLM's: the server is up (docs: proxy/health)


class RouterState(FactBase):
    """Whether python3-venv is installed and the router's virtualenv has its python, and the
    router unit's states.

    .. code:: python

        {"venv_package": True, "venv": True, "active": "active", "enabled": "enabled"}
    """

    def command(self) -> str:
        return (
            f"{debpkg.query([PACKAGE])} 2>/dev/null | sed 's/^/package /';"
            f" [ -x {VENV}/bin/python ] && echo venv;"
            f" systemctl show {UNIT} -p ActiveState -p UnitFileState 2>/dev/null; true"
        )

    @staticmethod
    def default() -> dict:
        return {"venv_package": False, "venv": False, "active": None, "enabled": None}

    def process(self, output: list[str]) -> dict:
        found = self.default()
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "package":
                found["venv_package"] = rest.startswith("ii")
            elif kind == "venv":
                found["venv"] = True
            elif kind.startswith("ActiveState="):
                found["active"] = kind.partition("=")[2] or None
            elif kind.startswith("UnitFileState="):
                found["enabled"] = kind.partition("=")[2] or None
        return found


def read_secret(box: Host, path: str) -> str | None:
    """A root-only file of ``box`` (this one or another of the run), read over the connection
    pyinfra holds to it, as its facts are read there (its sudo), but printing neither the
    command nor its output whatever pyinfra's verbosity (pyinfra's connectors print only with
    print_input, print_output); None where it cannot be read."""
    arguments, _ = pop_global_arguments(state, box, {})
    connector = {key: value for key, value in arguments.items() if key in CONNECTOR_ARGUMENT_KEYS}
    read, output = box.run_shell_command(
        StringCommand("cat", path), print_output=False, print_input=False, **connector
    )
    text = "\n".join(output.stdout_lines).strip()
    return text if read and text else None


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def root_only(found: dict | None, text: str) -> bool:
    """Whether a RootFiles answer is a root 0600 file holding ``text``."""
    return found == {"user": "root", "group": "root", "mode": "600", "sha1": sha1(text)}


@operation()
def fleet_key(source: str | None = None):
    """
    The fleet key clients send the router, root 0600: made here (256 random bits, as a lane's),
    or copied from the router box ``source`` (a failover's, so both routers take one key).

    + source: None, or the box whose fleet key this box takes

    Made once and never replaced; a copy is written where it differs from the source's.
    """
    found = util.on_box(FLEET_KEY)[FLEET_KEY]
    if source is None:
        if found is not None:
            host.noop(f"{FLEET_KEY} is there")
            return
        yield f"install -d -m 700 -o root -g root {SECRETS_DIR} && {key_made('_fleet')}"
        return
    other = boxes_in_run([source]).get(source)
    key = read_secret(other, FLEET_KEY) if other is not None else None
    if key is None:
        yield from util.refused(
            f"{host.name}: router_failover_box takes the fleet key of {source}, which is not in"
            f" this run or has none yet ({FLEET_KEY}); deploy {source} too"
        )
        return
    if root_only(found, key):
        host.noop(f"{FLEET_KEY} is {source}'s")
        return
    yield from root_only_upload(StringIO(key), FLEET_KEY)


def bundle(ca_files: list[str]) -> str:
    """The router's CA bundle: the PEM files on this machine one after the other, each ending
    in a newline (a PEM file need not end in one; the next BEGIN line must start a line)."""
    texts = (Path(path).expanduser().read_text() for path in ca_files)
    return "".join(text if text.endswith("\n") else f"{text}\n" for text in texts)


def environment(keys: list[tuple[str, str, str]]) -> str | list[str]:
    """The router's EnvironmentFile: the fleet key (this box's) and each lane's key (``keys``:
    (variable, box, lane)), read from the boxes of the run; a box left out of it (``--limit``)
    or stopped in it keeps the value this box's file holds. Where a key is found nowhere, what
    is missing (one "box:path" each)."""
    lines, missing = [], []
    in_run = boxes_in_run([box for _, box, _ in keys] + [host.name])
    before: dict[str, str] = {}
    if any(box not in in_run for _, box, _ in keys):
        held = read_secret(host, ENVIRONMENT) or ""
        before = dict(line.split("=", 1) for line in held.splitlines() if "=" in line)
    for variable, box, path in [
        (FLEET_KEY_VARIABLE, host.name, FLEET_KEY),
        *((variable, box, key_path(lane)) for variable, box, lane in keys),
    ]:
        key = read_secret(in_run[box], path) if box in in_run else before.get(variable)
        if key is None or not KEY.fullmatch(key):
            missing.append(f"{box}:{path}")
            continue
        lines.append(f"{variable}={key}\n")
    return missing or "".join(lines)


@operation()
def serving(
    requirements: list[str],
    pip_command: list[str],
    config: dict,
    unit_command: list[str],
    loopback_port: int,
    keys: list[tuple[str, str, str]],
    ca_files: list[str] | None = None,
    ca_bundle: str | None = None,
):
    """
    LiteLLM's proxy serving on 127.0.0.1:``loopback_port``: python3-venv from the distribution,
    a virtualenv with ``requirements`` installed by ``pip_command``, the configuration, the keys
    in a root 0600 EnvironmentFile, a unit restarted on failure and enabled at boot, started (or
    restarted where any of it changed) and waited for until it answers.

    + requirements: the pinned set, one requirement a line
    + pip_command: what installs it into the virtualenv (the plan's)
    + config: LiteLLM's configuration (written as JSON, YAML's subset; no secret in it)
    + unit_command: the unit's ExecStart
    + loopback_port: where the router listens, on 127.0.0.1
    + keys: (variable, box, lane) of each keyed lane, read from its box (never logged)
    + ca_files: the PEM files on this machine the router trusts the TLS fronts with
    + ca_bundle: where they are written together, root 0644 (None: no front speaks TLS, and a
      bundle left from an earlier deploy is removed)

    A lane box not in the run, or stopped in it, stops this box: the router needs every key.

    **Example:**

    .. code:: python

        router.serving(name="Router", requirements=["litellm==1.106.12"], pip_command=[...],
                       config={...}, unit_command=[...], loopback_port=11100,
                       keys=[("SPARK_LANE_KEY_1", "spark-1", "coder")])
    """
    keys_text = environment(keys)
    if isinstance(keys_text, list) and not state.is_executing:
        # Before the run (a first deploy's lanes have no keys yet): written when it gets here.
        host.log("the router's keys are read from their boxes when the run gets here")
        keys_text = ""
    if isinstance(keys_text, list):
        yield from util.refused(
            f"{host.name}: the router holds every lane's key, and cannot read"
            f" {', '.join(keys_text)} (a box not deployed yet, left out of this run or stopped"
            " in it); deploy every box of the fleet"
        )
        return
    found_state = answer(RouterState)
    wanted = "".join(f"{line}\n" for line in requirements)
    found = util.on_box(REQUIREMENTS, INSTALLED, ENVIRONMENT, CONFIG, UNIT_PATH, CA_BUNDLE)
    installing: list = []
    if not found_state["venv_package"]:
        installing.append(debpkg.apt_install(PACKAGE))
    if not found_state["venv"]:
        installing.append(f"install -d -m 755 {ROUTER_DIR} && python3 -m venv {VENV}")
    installing += util.put(StringIO(wanted), REQUIREMENTS, found=found)
    if (found.get(INSTALLED) or {}).get("sha1") != sha1(wanted) or not found_state["venv"]:
        installing.append(f"{shlex.join(pip_command)} && cp {REQUIREMENTS} {INSTALLED}")
    yield from installing
    secrets = (
        []
        if root_only(found[ENVIRONMENT], keys_text)
        else root_only_upload(StringIO(keys_text), ENVIRONMENT)
    )
    yield from secrets
    configured = util.put(StringIO(json.dumps(config, indent=2) + "\n"), CONFIG, found=found)
    if ca_bundle:
        configured += util.put(StringIO(bundle(ca_files or [])), ca_bundle, found=found)
    if configured:
        configured.insert(0, f"install -d -m 755 {CONFIG.rsplit('/', 1)[0]}")
    if not ca_bundle and found.get(CA_BUNDLE) is not None:  # no front speaks TLS any more
        configured.append(f"rm -f {CA_BUNDLE}")
    yield from configured
    unit = util.template(
        "spark-router.service.j2",
        UNIT_PATH,
        found=found,
        command=shlex.join(unit_command),
        environment_file=ENVIRONMENT,
        environment=OFFLINE,
        loopback_port=loopback_port,
    )
    yield from unit
    running = found_state["active"] == "active"
    url = f"http://127.0.0.1:{loopback_port}{LIVELINESS}"
    serves = (
        f"timeout {START_TIMEOUT_S} sh -c 'until curl -fsS -o /dev/null --max-time 5 {url};"
        f" do sleep 1; done' || {{ echo '{host.name}: {UNIT} does not answer {url} after"
        f" {START_TIMEOUT_S} s; its journal:' >&2; journalctl -u {UNIT} -n 20 -o cat --no-pager"
        " >&2; exit 1; }"
    )
    changed = bool(installing or secrets or configured or unit)
    yield from util.unit_started(
        UNIT,
        unit_changed=bool(unit),
        enabled=found_state["enabled"],
        running=running,
        changed=changed,
        start=f"systemctl start {UNIT} && {serves}",
        restart=f"systemctl restart {UNIT} && {serves}",
    )
    if running and not changed and found_state["enabled"] == "enabled":
        host.noop(f"{UNIT} serves on 127.0.0.1:{loopback_port}")


class RouterLeft(FactBase):
    """What a router left on a box: its unit's states, and which of the files and directories
    that serving writes are there (``left``, in ``LEFT``'s order).

    .. code:: python

        {"active": "active", "enabled": "enabled",
         "left": ["/etc/systemd/system/spark-router.service", "/var/lib/spark/router"]}
    """

    def command(self) -> str:
        paths = " ".join(LEFT)
        return (
            f"systemctl show {UNIT} -p ActiveState -p UnitFileState 2>/dev/null;"
            f' for path in {paths}; do [ -e "$path" ] || [ -L "$path" ] && echo "left $path";'
            " done; true"
        )

    @staticmethod
    def default() -> dict:
        return {"active": None, "enabled": None, "left": []}

    def process(self, output: list[str]) -> dict:
        found = self.default()
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "left":
                found["left"].append(rest)
            elif kind.startswith("ActiveState="):
                found["active"] = kind.partition("=")[2] or None
            elif kind.startswith("UnitFileState="):
                found["enabled"] = kind.partition("=")[2] or None
        return found


# What serving leaves on a box besides the fleet key: its unit, its keys, its configuration's
# directory, the cache systemd keeps for its DynamicUser (a link and the directory it names),
# and the virtualenv (last: the one a box may keep).
LEFT = (UNIT_PATH, ENVIRONMENT, CONFIG.rsplit("/", 1)[0], *CACHE_DIRS, ROUTER_DIR)


@operation()
def removed(keep_virtualenv: bool):
    """
    No router on a box that is not (or no longer) a router box: its unit stopped, disabled and
    removed, its keys (the copies of every lane's key), its configuration and its cache removed.

    + keep_virtualenv: keep the installed virtualenv (the pinned LiteLLM), so a router put back
      on this box starts without a new install from the package index

    The fleet key stays in /etc/spark/secrets, as a removed lane's key does: a router put back
    on this box keeps its clients' key. nginx's router site and key map, and the firewall's
    opening, go with the front and the firewall, which the plan renders without them.

    **Example:**

    .. code:: python

        router.removed(name="No router on this box", keep_virtualenv=True)
    """
    found = answer(RouterLeft)
    commands = []
    if UNIT_PATH in found["left"] and found["enabled"] not in (None, "disabled"):
        commands.append(f"systemctl disable --now {UNIT}")
    elif found["active"] not in (None, "inactive"):
        commands.append(f"systemctl stop {UNIT}")
    gone = [path for path in found["left"] if path != ROUTER_DIR or not keep_virtualenv]
    if gone:
        commands.append(f"rm -rf {' '.join(gone)}")
    if UNIT_PATH in gone:
        commands.append("systemctl daemon-reload")
    if found["active"] == "failed":
        commands.append(f"systemctl reset-failed {UNIT} || true")  # gone once stopped
    yield from commands
    if not commands:
        host.noop(
            f"no router here{' (its virtualenv kept)' if ROUTER_DIR in found['left'] else ''}"
        )


def removed_questions() -> list[Question]:
    """What ``removed`` reads of this box (operations/asked.py)."""
    return [question(RouterLeft)]


def key_questions() -> list[Question]:
    """What ``fleet_key`` reads of this box (operations/asked.py)."""
    return [question(util.RootFiles, paths=(FLEET_KEY,))]


def questions() -> list[Question]:
    """What ``serving`` reads of this box (operations/asked.py)."""
    return [
        question(RouterState),
        question(
            util.RootFiles,
            paths=(REQUIREMENTS, INSTALLED, ENVIRONMENT, CONFIG, UNIT_PATH, CA_BUNDLE),
        ),
    ]

"""The lanes' authenticating front: nginx, from the distribution, owns each lane's port, asks the
lane's key on every path and forwards the OpenAI paths and /health to vLLM on loopback.

vLLM's own --api-key guards only paths under /v1: /invocations serves the same chat requests
with no key, and /tokenize, /metrics and other control routes answer anyone (vLLM's security
guide, docs/usage/security.md: do not rely on --api-key alone; vllm-project/vllm#18892). So a
lane's vLLM listens on 127.0.0.1 (spark/lane.py) and only this front faces the LAN.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.operations import files

from operations import debpkg, util
from operations.asked import Question, answer, question
from operations.lanes import FRONT, key_made
from spark.box_paths import SECRETS_DIR, key_path

PACKAGE = FRONT
UNIT = f"{FRONT}.service"
SITE = "/etc/nginx/conf.d/spark-lanes.conf"  # Debian's nginx.conf includes conf.d/*.conf in http
# One file per lane holding its key (root 0700 / 0600): nginx's master reads its configuration
# as root, its workers never do.
KEYS_DIR = "/etc/nginx/spark-keys"
TLS_DIR = "/etc/spark/front"
TLS_CERTIFICATE = f"{TLS_DIR}/certificate.pem"
TLS_KEY = f"{TLS_DIR}/key.pem"
# The package's welcome page on port 80 (sites-enabled/default): nothing of the lanes', and a
# port open for no reason.
DEFAULT_SITE = "/etc/nginx/sites-enabled/default"
# What a Bearer token may hold (RFC 6750, b64token); anything else cannot be quoted into nginx's
# configuration safely, so the key file is refused rather than written there.
TOKEN_CHARACTERS = "A-Za-z0-9._~+/=-"


def key_variable(lane: str) -> str:
    """The nginx variable that is 1 when a request carries the lane's key (a slug's '-' is not a
    variable character; slugs have no '_', so no two lanes meet)."""
    return "$spark_key_" + lane.replace("-", "_")


def key_map(lane: str) -> str:
    """Shell printing the lane's key map for nginx, read from the lane's key file: the key goes
    through printf, a shell builtin, so it is in no process's argv. Fails on a key that is not
    a Bearer token. A map is a hash lookup: no byte-by-byte comparison to time."""
    lines = ["map $http_authorization " + key_variable(lane) + " {", "    default 0;"]
    lines += ['    "Bearer %s" 1;', "}"]
    return printed_with_key(lane, "\\n".join(lines) + "\\n")


def printed_with_key(lane: str, template: str) -> str:
    """Shell printing ``template`` with the lane's key for its %s, read from the lane's key file
    (through printf, a shell builtin: in no process's argv); fails on a key that is not a
    Bearer token, which could not be quoted into nginx's configuration safely."""
    path = key_path(lane)
    return (
        f"key=$(cat {path}) && case $key in (''|*[!{TOKEN_CHARACTERS}]*)"
        f" echo '{path}: not a Bearer token (RFC 6750: {TOKEN_CHARACTERS})' >&2; false;;"
        f' esac && printf {shlex.quote(template)} "$key"'
    )


# The name the router's key map goes by among the lanes' (a lane's name is a slug, without "_"):
# its key file is the fleet key (spark/box_paths.py FLEET_KEY).
ROUTER = "_fleet"


@dataclass(frozen=True)
class RouterPort:
    """The router's port on this box's front: the fleet key asked on every path, the router on
    127.0.0.1:``backend_port``, its own allow-list (the clients' and the scrapers' networks),
    waited for ``timeout_s`` between two reads or writes (the plan's RouterFront.timeout_s)."""

    port: int
    backend_port: int
    allow_networks: tuple[str, ...]
    timeout_s: int


@dataclass(frozen=True)
class FrontLane:
    """A lane as the front serves it: its port, vLLM's own port on loopback, whether it has a
    key (a lane without one is forwarded to anyone the allow-list admits), how long nginx waits
    for it between two reads or writes (the plan's FrontLane.timeout_s)."""

    name: str
    port: int
    backend_port: int
    key: bool
    timeout_s: int


class FrontState(FactBase):
    """The front on the box: nginx installed and its unit's state, the package's default site,
    the keys directory, the key maps there, and for each of ``lanes`` whether its key map is
    what its key file gives, root 0600 ("same") or not ("differs"; no key file yet, too). Never
    a key: the comparison is the shell's.

    .. code:: python

        {
            "installed": True,
            "active": "active",
            "enabled": "enabled",
            "default_site": False,
            "keys_dir": "root 700",
            "map_files": ["coder", "old"],
            "key_maps": {"coder": "same"},
        }
    """

    def command(self, lanes: tuple[str, ...] = ()) -> str:
        checks = []
        for lane in lanes:
            path = f"{KEYS_DIR}/{lane}.conf"
            checks.append(
                f"if [ \"$(stat -c '%U %a' {path} 2>/dev/null)\" = 'root 600' ]"
                f' && [ "$(cat {path})" = "$({key_map(lane)} 2>/dev/null)" ];'
                f" then echo 'key-map {lane} same'; else echo 'key-map {lane} differs'; fi;"
            )
        return " ".join(
            [
                f"{debpkg.query([PACKAGE])} 2>/dev/null | sed 's/^/package /';",
                f"systemctl show {UNIT} -p ActiveState -p UnitFileState 2>/dev/null;",
                f"[ -L {DEFAULT_SITE} ] || [ -e {DEFAULT_SITE} ] && echo default-site;",
                f"stat -c 'keys-dir %U %a' {KEYS_DIR} 2>/dev/null;",
                f'for map in {KEYS_DIR}/*.conf; do [ -e "$map" ]'
                ' && echo "map-file $(basename "$map" .conf)"; done;',
                *checks,
                "true",
            ]
        )

    @staticmethod
    def default() -> dict:
        """What a box without nginx answers (and pyinfra gives for no output at all)."""
        return {
            "installed": False,
            "active": None,
            "enabled": None,
            "default_site": False,
            "keys_dir": None,
            "map_files": [],
            "key_maps": {},
        }

    def process(self, output: list[str]) -> dict:
        state = self.default()
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "package":
                state["installed"] = rest.startswith("ii")
            elif kind.startswith("ActiveState="):
                state["active"] = kind.partition("=")[2]
            elif kind.startswith("UnitFileState="):
                state["enabled"] = kind.partition("=")[2] or None
            elif kind == "default-site":
                state["default_site"] = True
            elif kind == "keys-dir":
                state["keys_dir"] = rest
            elif kind == "map-file":
                state["map_files"].append(rest)
            elif kind == "key-map":
                lane, _, verdict = rest.partition(" ")
                state["key_maps"][lane] = verdict
        return state


@operation()
def lanes_front(
    lanes: list[FrontLane],
    allow_networks: list[str],
    tls: tuple[str, str] | None = None,
    router: RouterPort | None = None,
):
    """
    Put nginx in front of the box's lanes: each lane's port served by nginx, every path asking
    the lane's key, the OpenAI paths (/v1/...) and /health forwarded to vLLM on 127.0.0.1, any
    other path answered 404; responses streamed as they come.

    + lanes: the box's lanes (see ``FrontLane``); a lane's key map is written from its key file
      on the box (made here when the lane has none yet), so the key never leaves the box
    + allow_networks: client networks admitted ("192.168.1.0/24"); empty: any
    + tls: (certificate, key) files on this machine: the lanes' ports speak HTTPS with them
    + router: the fleet router's port on a router box: its paths (the OpenAI ones, /health/ and
      LiteLLM's /metrics/) behind the fleet key, made where the box has none

    A change is applied by `nginx -t` and a reload, which keeps streams in flight.

    **Example:**

    .. code:: python

        front.lanes_front(
            name="Lanes behind their keys",
            lanes=[front.FrontLane("coder", 10101, 11101, key=True, timeout_s=3600)],
            allow_networks=[],
        )
    """
    keyed = keyed_lanes(lanes, router)
    state = answer(FrontState, lanes=keyed)
    changes: list[str] = []
    if not state["installed"]:
        changes.append(debpkg.apt_install(PACKAGE))
    if state["default_site"] or not state["installed"]:  # the package installs it
        changes.append(f"rm -f {DEFAULT_SITE}")
    if state["keys_dir"] != "root 700":
        changes.append(f"install -d -m 700 -o root -g root {KEYS_DIR}")
    for lane in keyed:
        if state["key_maps"].get(lane) != "same":
            path = f"{KEYS_DIR}/{lane}.conf"
            changes.append(
                f"install -d -m 700 -o root -g root {SECRETS_DIR} && {key_made(lane)}"
                f" && ( umask 077; {key_map(lane)} > {path}.new && mv {path}.new {path} )"
            )
    changes += [f"rm -f {KEYS_DIR}/{name}.conf" for name in state["map_files"] if name not in keyed]
    if tls:
        changes += files.directory._inner(path=TLS_DIR, user="root", group="root", mode="700")
        for src, dest, mode in ((tls[0], TLS_CERTIFICATE, "644"), (tls[1], TLS_KEY, "600")):
            changes += files.put._inner(src=src, dest=dest, user="root", group="root", mode=mode)
    changes += util.template(
        "nginx-spark-lanes.conf.j2",
        SITE,
        lanes=lanes,
        router=router,
        allow_networks=allow_networks,
        tls=bool(tls),
        keys_dir=KEYS_DIR,
        key_variables={lane: key_variable(lane) for lane in keyed},
        certificate=TLS_CERTIFICATE,
        certificate_key=TLS_KEY,
    )
    yield from changes
    running = state["active"] == "active"
    yield from util.unit_started(
        UNIT,
        unit_changed=False,
        enabled=state["enabled"],
        running=running,
        changed=bool(changes),
        # A configuration nginx refuses says why (nginx -t) and leaves the running one serving;
        # a reload keeps the streams in flight; a stopped nginx is started.
        restart=f"nginx -t -q && systemctl reload-or-restart {UNIT}",
    )
    if running and not changes:
        host.noop(f"nginx asks the key on every path of {len(lanes)} lane(s)")


def keyed_lanes(lanes: list[FrontLane], router: RouterPort | None = None) -> tuple[str, ...]:
    """The lanes whose every path asks a key, and the router (its key map's name) where there
    is one."""
    return tuple(lane.name for lane in lanes if lane.key) + ((ROUTER,) if router else ())


def questions(lanes: list[FrontLane], router: RouterPort | None = None) -> list[Question]:
    """What ``lanes_front`` reads (operations/asked.py)."""
    return [
        question(FrontState, lanes=keyed_lanes(lanes, router)),
        question(util.RootFiles, paths=(SITE,)),
    ]

"""The box's metrics endpoint (issue 28): the distribution's Prometheus node exporter on
loopback, the box's own figures added through its textfile collector by files/spark_metrics.py
on a timer, and nginx in front asking the box's metrics key on every path.

The exporter's own web configuration (exporter-toolkit: TLS and basic auth) needs a bcrypt hash
made on the box; the front already holds keys as root-only files and maps them for nginx, so the
metrics key is kept as a lane's is (made on the box, never leaving it unless its owner copies it).
"""

from __future__ import annotations

import json
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import debpkg, util
from operations.asked import Question, answer, question
from operations.front import TLS_CERTIFICATE, TLS_KEY, printed_with_key
from operations.lanes import FRONT, key_made
from spark.box_paths import SECRETS_DIR, key_path

PACKAGE = "prometheus-node-exporter"
EXPORTER = f"{PACKAGE}.service"
# The package's unit reads its arguments from here ($ARGS; Debian's prometheus-node-exporter).
DEFAULTS = f"/etc/default/{PACKAGE}"
# The package's textfile directory (its README.textfile), where the exporter reads *.prom.
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
OUT = f"{TEXTFILE_DIR}/spark.prom"
COLLECTOR_SOURCE = Path(__file__).parents[1] / "files" / "spark_metrics.py"
COLLECTOR = "/usr/local/lib/spark/spark_metrics.py"
# The twins' readings the collector shares with the deploy and compliance, beside it, where the
# collector imports it (a script's own directory is the first on its sys.path: Python's docs,
# sys.path).
TWIN_SOURCE = Path(__file__).parents[1] / "spark" / "twin.py"
TWIN = "/usr/local/lib/spark/spark_twin.py"
EXPECTED = "/etc/spark/metrics/expected.json"  # root 0600: the plan's values for this box
SERVICE = "spark-metrics.service"
TIMER = "spark-metrics.timer"
UNIT_DIR = "/etc/systemd/system"
SITE = "/etc/nginx/conf.d/spark-metrics.conf"  # Debian's nginx.conf includes conf.d/*.conf
KEY_MAP_DIR = "/etc/nginx/spark-metrics"  # root 0700, apart from the lanes' maps the front owns
KEY_MAP = f"{KEY_MAP_DIR}/key.conf"
# Not a lane's name (a lane's is a slug, without '_'): no lane's key file is this one.
KEY_NAME = "_metrics"
KEY_PATH = key_path(KEY_NAME)
KEY_VARIABLE = "$spark_metrics_key"
# What key_made writes: URL-safe base64 without padding. Only these are taken into the map's
# regular expression, where none of them means anything but itself.
KEY_CHARACTERS = "A-Za-z0-9_-"
RELOAD_FRONT = f"nginx -t -q && systemctl reload-or-restart {FRONT}.service"


def lane_key_variable(lane: str) -> str:
    """The nginx variable holding "Bearer <the lane's key>", sent to the lane's server with a
    scrape of its metrics (a slug's '-' is not a variable character; slugs have no '_')."""
    return "$spark_lane_auth_" + lane.replace("-", "_")


def key_map(keyed: tuple[str, ...] = ()) -> str:
    """Shell printing the metrics key's map for nginx, read from its key file (through printf,
    a shell builtin: the key is in no process's argv). A regular expression entry, which nginx
    keeps out of the map's hash: no map_hash_bucket_size needed beside the front's own. Then,
    for each of the ``keyed`` lanes, a map giving its lane_key_variable for every request."""
    template = (
        f"map $http_authorization {KEY_VARIABLE} {{\\n    default 0;\\n"
        '    "~^Bearer %s$" 1;\\n}\\n'
    )
    metrics_key = (
        f"key=$(cat {KEY_PATH}) && case $key in (''|*[!{KEY_CHARACTERS}]*)"
        f" echo '{KEY_PATH}: not a key the deploy made ({KEY_CHARACTERS})' >&2; false;;"
        f' esac && printf {shlex.quote(template)} "$key"'
    )
    lanes = [
        printed_with_key(
            lane, f'map $host {lane_key_variable(lane)} {{\\n    default "Bearer %s";\\n}}\\n'
        )
        for lane in keyed
    ]
    # One group: a redirection after it takes every map, not the last command's alone.
    return f"{{ {' && '.join([metrics_key, *lanes])}; }}"


class MetricsState(FactBase):
    """The exporter's package, its unit's and the timer's state, the textfile directory,
    whether the metrics key's map is what its key file gives, root 0600 ("same") or not
    ("differs"; no key file yet, too), and which of ``ports`` something listens on (a run cut
    off after writing a file, before the reload or restart it needed, leaves one unserved).
    Never the key: the shell compares.

    .. code:: python

        {
            "installed": True,
            "units": {"prometheus-node-exporter.service": {"ActiveState": "active",
                      "UnitFileState": "enabled"}, "spark-metrics.timer": {...}},
            "textfile_dir": True,
            "key_map": "same",
            "listening": [9100, 9101],
        }
    """

    def command(self, ports: tuple[int, ...] = (), keyed: tuple[str, ...] = ()) -> str:
        # ss(8) filter: a listening TCP socket on that local port (iproute2, on every box).
        listening = [
            f"ss -Hltn 'sport = :{port}' 2>/dev/null | grep -q . && echo 'listening {port}';"
            for port in ports
        ]
        return " ".join(
            [
                *listening,
                f"{debpkg.query([PACKAGE])} 2>/dev/null | sed 's/^/package /';",
                f"systemctl show {EXPORTER} {TIMER} -p Id -p ActiveState -p UnitFileState"
                " 2>/dev/null;",
                f"[ -d {TEXTFILE_DIR} ] && echo textfile-dir;",
                f"if [ \"$(stat -c '%U %a' {KEY_MAP} 2>/dev/null)\" = 'root 600' ]"
                f' && [ "$(cat {KEY_MAP})" = "$({key_map(keyed)} 2>/dev/null)" ];'
                " then echo 'key-map same'; else echo 'key-map differs'; fi",
            ]
        )

    @staticmethod
    def default() -> dict:
        return {
            "installed": False,
            "units": {},
            "textfile_dir": False,
            "key_map": "differs",
            "listening": [],
        }

    def process(self, output: list[str]) -> dict:
        state = self.default()
        unit: dict[str, str] = {}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "package":
                state["installed"] = rest.startswith("ii")
            elif kind.startswith("Id="):
                unit = state["units"].setdefault(kind.partition("=")[2], {})
            elif "=" in kind and not rest:
                name, _, value = kind.partition("=")
                unit[name] = value
            elif kind == "textfile-dir":
                state["textfile_dir"] = True
            elif kind == "key-map":
                state["key_map"] = rest
            elif kind == "listening":
                state["listening"].append(int(rest))
        return state


@operation()
def endpoint(
    port: int,
    exporter_port: int,
    interval_s: int,
    allow_networks: list[str],
    tls: bool,
    expected: dict,
    lanes: list[dict],
):
    """
    The box's metrics endpoint: prometheus-node-exporter from the distribution on
    127.0.0.1:``exporter_port``, files/spark_metrics.py every ``interval_s`` s writing the box's
    figures and its drift from ``expected`` (the plan's values, root 0600) for the exporter's
    textfile collector, and nginx on ``port`` asking the metrics key on every path.

    + allow_networks: scraper networks admitted ("192.168.1.0/24"); empty: any (with the key)
    + tls: serve it with the front's certificate (operations/front.py puts it there)
    + lanes: each lane's own /metrics served at its ``path`` from its ``backend_port``, with
      the lane's key where it has one (``key``)

    Runs after the front: nginx is installed and its secrets directory made.
    """
    keyed = keyed_lanes(lanes)
    state = answer(MetricsState, ports=(port, exporter_port), keyed=keyed)
    units = state["units"]
    commands: list[str] = []
    if not state["installed"]:
        commands.append(debpkg.apt_install(PACKAGE))
    if not state["textfile_dir"]:
        commands.append(f"install -d -m 755 -o root -g root {TEXTFILE_DIR}")
    service, timer = f"{UNIT_DIR}/{SERVICE}", f"{UNIT_DIR}/{TIMER}"
    found = util.on_box(*endpoint_files())
    arguments = util.template(
        "prometheus-node-exporter.default.j2",
        DEFAULTS,
        found=found,
        port=port,
        exporter_port=exporter_port,
        textfile_dir=TEXTFILE_DIR,
    )
    collector = [
        *util.put(str(TWIN_SOURCE), TWIN, "644", found),
        *util.put(str(COLLECTOR_SOURCE), COLLECTOR, "755", found),
        *util.put(StringIO(json.dumps(expected, indent=1) + "\n"), EXPECTED, "600", found),
    ]
    unit_files = [
        *util.template(
            "spark-metrics.service.j2",
            service,
            found=found,
            collector=COLLECTOR,
            expected=EXPECTED,
            out=OUT,
        ),
        *util.template("spark-metrics.timer.j2", timer, found=found, interval_s=interval_s),
    ]
    front = []
    if state["key_map"] != "same":
        front.append(
            f"install -d -m 700 -o root -g root {SECRETS_DIR} {KEY_MAP_DIR} && {key_made(KEY_NAME)}"
            f" && ( umask 077; {key_map(keyed)} > {KEY_MAP}.new && mv {KEY_MAP}.new {KEY_MAP} )"
        )
    front += util.template(
        "nginx-spark-metrics.conf.j2",
        SITE,
        found=found,
        port=port,
        exporter_port=exporter_port,
        allow_networks=allow_networks,
        tls=tls,
        certificate=TLS_CERTIFICATE,
        certificate_key=TLS_KEY,
        key_map=KEY_MAP,
        key_variable=KEY_VARIABLE,
        lanes=[lane | {"auth": lane_key_variable(lane["name"])} for lane in lanes],
    )
    # Its arguments first: the package's first start then listens on loopback already (dpkg
    # keeps a conffile that is there: debpkg.apt_install's --force-confold).
    yield from arguments + commands + collector + unit_files + front
    exporter = units.get(EXPORTER, {})
    yield from util.unit_started(
        EXPORTER,
        unit_changed=False,
        enabled=exporter.get("UnitFileState"),
        running=exporter.get("ActiveState") == "active",
        changed=bool(arguments) or exporter_port not in state["listening"],
    )
    timing = units.get(TIMER, {})
    yield from util.unit_started(
        TIMER,
        unit_changed=bool(unit_files),
        enabled=timing.get("UnitFileState"),
        running=timing.get("ActiveState") == "active",
        changed=bool(unit_files),
    )
    if collector or unit_files or commands:  # the figures now, not one interval later
        yield f"systemctl start {SERVICE}"
    if front or port not in state["listening"]:
        yield RELOAD_FRONT
    if (
        not (commands or arguments or collector or unit_files or front)
        and all(units.get(unit, {}).get("ActiveState") == "active" for unit in (EXPORTER, TIMER))
        and {port, exporter_port} <= set(state["listening"])
    ):
        host.noop(f"the metrics endpoint asks its key on port {port}")


def endpoint_files() -> tuple[str, ...]:
    """The files ``endpoint`` writes."""
    return (
        DEFAULTS,
        TWIN,
        COLLECTOR,
        EXPECTED,
        f"{UNIT_DIR}/{SERVICE}",
        f"{UNIT_DIR}/{TIMER}",
        SITE,
    )


def keyed_lanes(lanes: list[dict]) -> tuple[str, ...]:
    return tuple(lane["name"] for lane in lanes if lane["key"])


def questions(port: int, exporter_port: int, lanes: list[dict]) -> list[Question]:
    """What ``endpoint`` reads (operations/asked.py)."""
    return [
        question(MetricsState, ports=(port, exporter_port), keyed=keyed_lanes(lanes)),
        question(util.RootFiles, paths=endpoint_files()),
    ]

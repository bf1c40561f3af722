"""Lanes on demand: a lane started by its first request and stopped when idle, with systemd's
own parts (docs/on-demand.md). The pattern of systemd-socket-proxyd(8)'s example: a socket on the
loopback port the front forwards to, a proxy service it starts, which requires the lane's unit
and is ordered after it, and exits after the idle time; the lane's unit (StopWhenUnneeded=, not
enabled, Conflicts= with the lanes it cannot fit beside) is written by operations/lanes.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import util
from operations.asked import Question, answer, question
from spark.plan import OnDemand

UNIT_DIR = "/etc/systemd/system"
PREFIX = "spark-ondemand-"  # of each on-demand lane's socket and proxy (not spark-lane-: a lane's)
# systemd-socket-proxyd(8): "/usr/lib/systemd/systemd-socket-proxyd"; in the systemd package of
# DGX OS 7 (Ubuntu 24.04) and Debian 12, both merged-/usr (so /lib/systemd/ is the same file).
PROXYD = "/usr/lib/systemd/systemd-socket-proxyd"


def socket_name(lane: str) -> str:
    return f"{PREFIX}{lane}.socket"


def proxy_name(lane: str) -> str:
    return f"{PREFIX}{lane}.service"


def unit_files(lane: str) -> tuple[str, str]:
    """The socket's and the proxy's unit files."""
    return f"{UNIT_DIR}/{socket_name(lane)}", f"{UNIT_DIR}/{proxy_name(lane)}"


class OnDemandSockets(FactBase):
    """The on-demand lanes' sockets on the box and their states (`systemctl show`).

    .. code:: python

        {"fast": {"ActiveState": "active", "UnitFileState": "enabled"}}
    """

    default = dict  # no socket: no output, and pyinfra gives the default

    def command(self) -> str:
        return (
            f"( cd {UNIT_DIR} 2>/dev/null && for unit in {PREFIX}*.socket; do"
            ' [ -e "$unit" ] && systemctl show -p Id,ActiveState,UnitFileState -- "$unit"; done );'
            " true"
        )

    def process(self, output: list[str]) -> dict[str, dict[str, str]]:
        sockets: dict[str, dict[str, str]] = {}
        current: dict[str, str] = {}
        for line in output:
            field, _, value = line.partition("=")
            if field == "Id":
                current = sockets.setdefault(value.removeprefix(PREFIX).removesuffix(".socket"), {})
            elif field in ("ActiveState", "UnitFileState"):
                current[field] = value
        return sockets


def lane_unit_variables(
    lane: str, on_demand: OnDemand | None, unit_of: Callable[[str], str]
) -> dict:
    """What the lane's own unit (templates/vllm-lane.service.j2) adds on demand: the proxy and
    socket that start it, the units of the lanes it conflicts with (``unit_of``: a lane's)."""
    if on_demand is None:
        return {"on_demand": None}
    return {
        "on_demand": {
            "proxy": proxy_name(lane),
            "socket": socket_name(lane),
            "conflicts": [unit_of(other) for other in on_demand.conflicts],
        }
    }


def activated(
    lane: str,
    lane_unit: str,
    on_demand: OnDemand,
    *,
    lane_state: dict[str, str],
    lane_changed: bool,
    reload: bool,
    check_start: str,
) -> Iterator[str]:
    """The commands that put a lane on demand after its own unit was written: its socket and
    proxy written, the lane's unit not enabled (a resident lane before: stopped, its port is the
    socket's now), the socket enabled and listening; where the lane's unit, environment or key
    changed, the lane started once by ``check_start`` (its health wait and answer canary), which
    systemd stops again right after unless a request holds it (StopWhenUnneeded=).

    + lane_state: the lane unit's ActiveState and UnitFileState (lanes.LaneUnits)
    + reload: the lane's unit file changed (daemon-reload)
    """
    socket, proxy = unit_files(lane)
    found = util.on_box(socket, proxy)
    variables = {
        "lane": lane,
        "lane_unit": lane_unit,
        "socket": socket_name(lane),
        "proxy": proxy_name(lane),
        "socket_port": on_demand.socket_port,
        "server_port": on_demand.server_port,
        "idle_s": on_demand.idle_s,
        "proxyd": PROXYD,
    }
    socket_changes = util.template("spark-ondemand.socket.j2", socket, found=found, **variables)
    yield from socket_changes
    proxy_changes = util.template("spark-ondemand.service.j2", proxy, found=found, **variables)
    yield from proxy_changes
    if reload or socket_changes or proxy_changes:
        yield "systemctl daemon-reload"
    state = answer(OnDemandSockets).get(lane, {})
    listening = state.get("ActiveState") == "active"
    if lane_state.get("UnitFileState") == "enabled":
        yield f"systemctl disable {lane_unit}"
    if not listening and lane_state.get("ActiveState") in ("active", "activating"):
        yield f"systemctl stop {lane_unit}"  # resident before: its server holds the socket's port
    if lane_changed:
        yield check_start
    if state.get("UnitFileState") != "enabled":
        yield f"systemctl enable {socket_name(lane)}"
    if socket_changes:
        yield f"systemctl restart {socket_name(lane)}"
    elif not listening:
        yield f"systemctl start {socket_name(lane)}"
    elif not (lane_changed or proxy_changes):
        host.noop(
            f"lane {lane} on demand: listening on 127.0.0.1:{on_demand.socket_port}, stopped"
            f" after {on_demand.idle_s} s idle"
        )


def questions() -> list[Question]:
    return [question(OnDemandSockets)]


def activation_questions(lane: str) -> list[Question]:
    """What ``activated`` reads for this lane (operations/asked.py)."""
    return [question(util.RootFiles, paths=unit_files(lane)), question(OnDemandSockets)]


@operation()
def on_demand_removed(keep: list[str]):
    """
    Stop, disable and remove the socket and proxy of every lane no longer on demand.

    + keep: the box's lanes on demand

    Before the lanes are served: a lane made resident again takes back the socket's port.

    **Example:**

    .. code:: python

        on_demand.on_demand_removed(name="Sockets of lanes no longer on demand", keep=["fast"])
    """
    stale = sorted(set(answer(OnDemandSockets)) - set(keep))
    for lane in stale:
        yield f"systemctl disable --now {socket_name(lane)}"
        yield f"systemctl stop {proxy_name(lane)}"
        yield "rm -f " + " ".join(unit_files(lane))
    if stale:
        yield "systemctl daemon-reload"
    else:
        host.noop("no socket of a lane no longer on demand")

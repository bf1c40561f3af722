"""The fleet's keys and one OpenCode configuration for the whole fleet, on this machine.

    .venv/bin/python -m stages.clients [--inventory inventories/lab.py] [--dir DIR]
        [--metrics-keys-dir KEYS] [--per-lane]

`make clients` runs it (DIR: OpenCode's ~/.config/opencode unless given). Each box is reached
over the SSH connection pyinfra opens for it (as compliance does); each key is read with
`sudo -n cat` (sudo without a password: README, step 2) into memory, never into a command line
or a log, and written mode 0600 from the start. DIR/opencode.json gets one provider, the
fleet's router (spark-fleet: its URL through its box's front, every served name of the fleet),
its fleet key read from /etc/spark/secrets/_fleet.key on the router's box into
DIR/<box>-_fleet.key; with a failover router, a second provider (spark-fleet-failover), its key
from its own box, since OpenCode takes one baseURL a provider. With --per-lane (`make clients
PER_LANE=1`) it gets one provider per lane of every box instead (endpoints.opencode_config),
each lane's key in DIR/<box>-<lane>.key. The owner's other settings and providers are kept, and
never an empty provider is written. DIR/spark-clients.json lists what this command wrote: a
provider or key file written before whose lane or box the inventory no longer has, or of the
other choice of providers, is removed. Each box's metrics key is read the same way into
KEYS/<box>.key (spark/prometheus.py KEYS_DIR unless given), and each router box's fleet key
into KEYS/fleet/<box>.key, where `make status` and the generated prometheus.yml read them. A box
that cannot be reached keeps what it had; with none reached nothing is written; any problem
makes the command exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import paramiko
from pyinfra.api import Config, State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host

from endpoints import (
    FLEET_KEY_NAME,
    OPENCODE_DIR,
    Endpoint,
    RouterEndpoint,
    endpoints_of,
    key_file,
    opencode_config,
    router_provider,
    routers_of,
    served_models,
)
from operations.metrics import KEY_NAME as METRICS_KEY
from spark import prometheus
from spark.box_paths import key_path
from stages.settings import COLLECTION, InventoryRefused, load, plan, read_inventory

CONFIG = "opencode.json"
MANIFEST = "spark-clients.json"  # what this command wrote (OpenCode reads no such file)


class Keys(NamedTuple):
    """What reading a box's keys gave: the keys by lane, and why others could not be read."""

    keys: dict[str, str]
    problems: list[str]


# A box's name and the lanes whose keys to read -> its keys, or why it could not be reached.
KeyReader = Callable[[str, list[str]], Keys | str]


class Router(NamedTuple):
    """The fleet's router (spark/fleet.py) for the client: its boxes as clients reach them (the
    first, then the failover's), every served name it lists, and whether the owner asked for
    the per-lane providers instead of its own (`make clients PER_LANE=1`)."""

    boxes: list[RouterEndpoint]
    models: list[Endpoint]
    per_lane: bool = False


class MetricsKeys(NamedTuple):
    """The boxes whose metrics key to copy, and where: <directory>/<box>.key, which `make status`
    and the generated prometheus.yml read (spark/prometheus.py KEYS_DIR)."""

    boxes: frozenset[str]
    directory: Path


def read_keys(host: Host, lanes: Iterable[str]) -> Keys | str:
    """The lanes' keys from a box (root 0600 there), read over pyinfra's SSH connection to it
    with sudo when the inventory sets `_sudo`; a message when the box cannot be reached."""
    try:
        host.connector.connect()
    except (PyinfraError, paramiko.SSHException, OSError, EOFError) as error:
        return f"cannot connect: {error}"
    # -n: a sudo that wants a password fails at once instead of waiting for one.
    sudo = "sudo -n " if host.data.get("_sudo") else ""
    found = Keys({}, [])
    for lane in lanes:
        _, stdout, stderr = host.connector.client.exec_command(
            f"{sudo}cat {shlex.quote(key_path(lane))}"
        )
        key = stdout.read().decode().strip()
        if stdout.channel.recv_exit_status() == 0 and key:
            found.keys[lane] = key
        else:
            found.problems.append(f"{lane}: no key read ({stderr.read().decode().strip()})")
    return found


def write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, readable by its owner only from the first byte, replaced whole."""
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write(text)
    os.replace(partial, path)


def read_json(path: Path) -> dict:
    """A JSON object file's content, {} when it is absent; ValueError when it is no JSON object
    (OpenCode also reads JSON with comments, which this command does not rewrite)."""
    if not path.exists():
        return {}
    content = json.loads(path.read_text())
    if not isinstance(content, dict):
        raise ValueError("not a JSON object")
    return content


def update_clients(
    fleet: dict[str, list[Endpoint]],
    read: KeyReader,
    directory: Path,
    keys_dir: str,
    metrics: MetricsKeys | None = None,
    router: Router | None = None,
) -> list[str]:
    """Write the router's provider, its fleet key (from each router box) and the merged
    configuration into ``directory`` (which ``keys_dir`` names in the configuration); or, with
    no router or the per-lane providers asked for, every lane's provider and key. Each router
    box's fleet key also into ``metrics``' directory (FLEET_KEYS/<box>.key), beside the metrics
    key of each of its boxes; remove what an earlier run wrote for lanes and boxes no longer in
    ``fleet``, or for the other choice of providers; the problems, one line each. Where no box
    could be read, nothing is written: the configuration would have lost no provider, and
    gained none."""
    config_path, manifest_path = directory / CONFIG, directory / MANIFEST
    try:
        config, before = read_json(config_path), read_json(manifest_path)
    except ValueError as error:
        return [f"{config_path} or {manifest_path}: {error}; nothing written (merge by hand)"]
    metrics = metrics or MetricsKeys(frozenset(), directory)
    routers = {one.box: one for one in router.boxes} if router else {}
    per_lane = router is None or router.per_lane
    asked = {
        box: [endpoint.lane for endpoint in endpoints if endpoint.api_key and per_lane]
        + ([METRICS_KEY] if box in metrics.boxes else [])
        + ([FLEET_KEY_NAME] if box in routers else [])
        for box, endpoints in fleet.items()
    }
    found_by_box = {
        box: read(box, lanes) if lanes else Keys({}, []) for box, lanes in asked.items()
    }
    unreached = {box: found for box, found in found_by_box.items() if isinstance(found, str)}
    if unreached and len(unreached) == len([box for box in asked if asked[box]]):
        return [f"{box}: {why}" for box, why in unreached.items()] + [
            f"no box was reached ({', '.join(unreached)}); nothing written in {directory}: make"
            " clients again once they answer over SSH"
        ]
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    problems: list[str] = []
    written: dict[str, dict[str, list[str]]] = {}
    providers: dict[str, dict] = {}
    for box, endpoints in fleet.items():
        found = found_by_box[box]
        if isinstance(found, str):  # unreachable: what it had stays
            problems.append(f"{box}: {found}; its providers and keys are kept as they were")
            if box in before:
                written[box] = before[box]
            continue
        problems += [f"{box}: {problem}" for problem in found.problems]
        if METRICS_KEY in found.keys:
            metrics.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_private(metrics.directory / f"{box}.key", found.keys.pop(METRICS_KEY) + "\n")
        if FLEET_KEY_NAME in found.keys:
            fleet_key = Path(prometheus.fleet_key_file(str(metrics.directory), box))
            fleet_key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_private(fleet_key, found.keys[FLEET_KEY_NAME] + "\n")
            if per_lane:  # no provider of the router's: its key stays out of OpenCode's
                del found.keys[FLEET_KEY_NAME]
        for lane, key in found.keys.items():
            write_private(directory / key_file(box, lane), key + "\n")
        own: dict[str, dict] = {}
        if per_lane:
            served = [e for e in endpoints if not e.api_key or e.lane in found.keys]
            own = opencode_config(box, served, keys_dir)["provider"]
        elif router is not None and FLEET_KEY_NAME in found.keys:
            failover = routers[box] != router.boxes[0]
            own = router_provider(routers[box], failover, router.models, keys_dir)
        providers |= own
        written[box] = {
            "providers": sorted(own),
            "keys": sorted(key_file(box, lane) for lane in found.keys),
        }
    kept_providers = {name for entry in written.values() for name in entry["providers"]}
    kept_keys = {name for entry in written.values() for name in entry["keys"]}
    stale = {name for entry in before.values() for name in entry["providers"]} - kept_providers
    for name in {name for entry in before.values() for name in entry["keys"]} - kept_keys:
        (directory / name).unlink(missing_ok=True)
    # The fleet key of a box that no longer runs the router: no scrape and no status reads it.
    for path in (metrics.directory / prometheus.FLEET_KEYS).glob("*.key"):
        if path.name.removesuffix(".key") not in routers:
            path.unlink()
    config.setdefault("$schema", "https://opencode.ai/config.json")
    config["provider"] = {
        name: provider
        for name, provider in config.get("provider", {}).items()
        if name not in stale and name not in providers
    } | providers
    if not config["provider"]:
        del config["provider"]  # no empty provider: every lane gone, or none with its key yet
    write_private(config_path, json.dumps(config, indent=2) + "\n")
    write_private(manifest_path, json.dumps(written, indent=2, sort_keys=True) + "\n")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make clients", description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default="inventories/lab.py")
    parser.add_argument("--dir", default=OPENCODE_DIR, help="OpenCode's configuration directory")
    parser.add_argument(
        "--metrics-keys-dir", default=prometheus.KEYS_DIR, help="where each box's metrics key goes"
    )
    parser.add_argument(
        "--per-lane",
        action="store_true",
        help="a provider per lane of every box, each with its lane's key, instead of the"
        " router's one provider (e.g. to reach a lane past the router)",
    )
    args = parser.parse_args(argv)
    state = State()
    state.cwd = str(COLLECTION)  # relative ssh_key paths resolve as for the deploy
    try:
        inventory = read_inventory(args.inventory, state)
        spark, planned = load(inventory), plan(inventory)
    except InventoryRefused as error:
        print(error, file=sys.stderr)
        return 2
    state.init(inventory, Config())  # gives each host its SSH connector
    hosts = {host.name: host for host in inventory}
    fleet = {box.name: endpoints_of(spark.host(box.name), box.address) for box in planned.boxes}
    directory = Path(args.dir).expanduser().resolve()
    # OpenCode reads a relative {file:...} from the configuration's directory, ~ from home
    # (https://opencode.ai/docs/config/#variables): an absolute path, or ~ as given.
    keys_dir = args.dir if args.dir.startswith("~") else str(directory)
    metrics = MetricsKeys(
        frozenset(box.name for box in planned.boxes if box.metrics is not None),
        Path(args.metrics_keys_dir).expanduser(),
    )
    routers = routers_of(planned)
    # No router (fleet_router False): the lanes' own providers are the only ones there are.
    router = Router(routers, served_models(fleet), args.per_lane or not routers)
    try:
        problems = update_clients(
            fleet,
            lambda box, lanes: read_keys(hosts[box], lanes),
            directory,
            keys_dir,
            metrics,
            router,
        )
    finally:
        for host in hosts.values():
            host.disconnect()
    for problem in problems:
        print(problem, file=sys.stderr)
    if (directory / CONFIG).exists() and args.per_lane:
        lanes = sum(len(endpoints) for endpoints in fleet.values())
        print(f"{directory / CONFIG}: {lanes} lanes of {len(fleet)} boxes in the inventory")
    elif (directory / CONFIG).exists():
        print(
            f"{directory / CONFIG}: the router, {router.boxes[0].url}, with the"
            f" {len(router.models)} served names of {len(fleet)} boxes"
            + "".join(f"; its failover {failover.url}" for failover in router.boxes[1:])
        )
    if any(metrics.directory.glob("*.key")):
        print(f"{metrics.directory}: the metrics keys (<box>.key), read by make status")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

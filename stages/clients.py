"""Every lane's key and one OpenCode configuration for the whole fleet, on this machine.

    .venv/bin/python -m stages.clients [--inventory inventories/lab.py] [--dir DIR]
        [--metrics-keys-dir KEYS]

`make clients` runs it (DIR: OpenCode's ~/.config/opencode unless given). Each box is reached
over the SSH connection pyinfra opens for it (as compliance does); each lane's key is read with
`sudo -n cat` (sudo without a password: README, Quick start) into memory, never into a command line
or a log, and written to DIR/<box>-<lane>.key, mode 0600 from the start. DIR/opencode.json then
gets one provider per lane of every box (endpoints.opencode_config), the owner's other settings
and providers kept, and never an empty provider. DIR/spark-clients.json lists what this command
wrote: a provider or key file written before whose lane or box the inventory no longer has is
removed. Each box's metrics key is read the same way into KEYS/<box>.key (spark/prometheus.py
KEYS_DIR unless given), where `make status` and the generated prometheus.yml read it. A box
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

from endpoints import OPENCODE_DIR, Endpoint, endpoints_of, key_file, opencode_config
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
) -> list[str]:
    """Write every lane's key and the merged configuration into ``directory`` (which
    ``keys_dir`` names in the configuration), and the metrics key of each of ``metrics``' boxes
    into its directory; remove what an earlier run wrote for lanes and boxes no longer in
    ``fleet``; the problems, one line each. Where no box could be read, nothing is written: the
    configuration would have lost no provider, and gained none."""
    config_path, manifest_path = directory / CONFIG, directory / MANIFEST
    try:
        config, before = read_json(config_path), read_json(manifest_path)
    except ValueError as error:
        return [f"{config_path} or {manifest_path}: {error}; nothing written (merge by hand)"]
    metrics = metrics or MetricsKeys(frozenset(), directory)
    asked = {
        box: [endpoint.lane for endpoint in endpoints if endpoint.api_key]
        + ([METRICS_KEY] if box in metrics.boxes else [])
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
        for lane, key in found.keys.items():
            write_private(directory / key_file(box, lane), key + "\n")
        served = [e for e in endpoints if not e.api_key or e.lane in found.keys]
        own = opencode_config(box, served, keys_dir)["provider"]
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
    try:
        problems = update_clients(
            fleet, lambda box, lanes: read_keys(hosts[box], lanes), directory, keys_dir, metrics
        )
    finally:
        for host in hosts.values():
            host.disconnect()
    for problem in problems:
        print(problem, file=sys.stderr)
    if (directory / CONFIG).exists():
        lanes = sum(len(endpoints) for endpoints in fleet.values())
        print(f"{directory / CONFIG}: {lanes} lanes of {len(fleet)} boxes in the inventory")
    if any(metrics.directory.glob("*.key")):
        print(f"{metrics.directory}: the metrics keys (<box>.key), read by make status")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

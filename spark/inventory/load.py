"""The inventory's data validated before any box is contacted (load_from_dicts): every box's
keys on their own, then across the boxes, every problem at once, each in the owner's words
("<host>: <key>: <what>; <do>"), never a secret's value."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from spark import fleet, topology
from spark.catalog import ModelSpec
from spark.inventory import cluster, fabric
from spark.inventory.cluster import SparkConfig
from spark.inventory.hosts import ConfigError, HostConfig
from spark.inventory.settings import HostSettings
from spark.lane import SLUG, Lane, context_warnings
from spark.memory import box_budget

# host.data keys that pyinfra and its connectors read themselves: they pass unchecked and
# are never echoed (`_sudo_password`, `ssh_password` are secrets).
PYINFRA_KEY_PREFIXES = ("ssh_", "_", "docker_", "local_", "winrm_", "chroot_")
# What `--data` gives teardown.py for one run (stages/teardown.py options): no box's setting,
# so a box's checks pass them by, and the teardown checks their values.
TEARDOWN_KEYS = frozenset(
    {"teardown_confirm", "teardown_driver", "teardown_fabric", "teardown_weights"}
)
# Of those, the ones this collection connects with (pyinfra's SSH connector, its global
# arguments such as `_sudo`): a misspelt one (`ssh_usr`) would be ignored by pyinfra, which then
# logs in as someone else, so each must be a key pyinfra knows.
CHECKED_PYINFRA_PREFIXES = ("ssh_", "_")

# Keys whose value may be a secret: no message ever shows their value (a key pasted as api_key,
# a token pasted into hf_token_file). Keys of pyinfra's own are never shown either.
SECRET_KEYS = frozenset({"api_key", "hf_token_file", "front_tls_key_file"})


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _owner(loc: tuple[int | str, ...]) -> tuple[type[BaseModel], str]:
    """The model and the field an error location ends in: lanes nest Lane and ModelSpec."""
    if loc[0] == "lanes" and len(loc) > 2 and isinstance(loc[1], int):
        if loc[2] == "model_spec" and len(loc) > 3:
            return ModelSpec, str(loc[3])
        return Lane, str(loc[2])
    return HostSettings, str(loc[0])


def _lane_label(data: dict[str, Any], index: int) -> str:
    """A lane by its name where it has a usable one, else by its place (#1 is the first)."""
    lanes = data.get("lanes")
    lane = lanes[index] if isinstance(lanes, list | tuple) and index < len(lanes) else None
    name = lane.get("name") if isinstance(lane, dict) else None
    return name if isinstance(name, str) and SLUG.fullmatch(name) else f"#{index + 1}"


def _problems(
    name: str, error: ValidationError, data: dict[str, Any], pyinfra_keys: Iterable[str]
) -> list[str]:
    """pydantic's errors as "<host>: <key>: <what>; <allowed>" lines (values of unknown
    keys are never shown: a misspelt `_sudo_password` may hold a secret)."""
    problems = []
    for item in error.errors():
        loc = item["loc"]
        parts = [str(part) for part in loc]
        if len(loc) > 1 and loc[0] == "lanes" and isinstance(loc[1], int):
            parts[1] = _lane_label(data, loc[1])
        where = f"{name}: " + "".join(f"{part}: " for part in parts)
        model, field = _owner(loc)
        if item["type"] == "extra_forbidden":
            candidates = [*model.model_fields]
            if model is HostSettings:
                candidates += pyinfra_keys
            guess = difflib.get_close_matches(field, candidates, 1)
            known = ", ".join(model.model_fields)
            hint = f"did you mean {guess[0]}?" if guess else f"known keys: {known}"
            theirs = f" (keys starting with {', '.join(PYINFRA_KEY_PREFIXES)} are pyinfra's)"
            problems.append(f"{where}unknown key; {hint}{theirs if model is HostSettings else ''}")
        elif item["type"] == "value_error":
            problems += [where + line for line in str(item["ctx"]["error"]).splitlines()]
        elif item["type"] == "missing":
            allowed = model.model_fields[field].description
            place = "group_data/all.py" if model is HostSettings else "the lane"
            problems.append(f"{where}missing; set it in {place} ({allowed})")
        else:
            allowed = model.model_fields[field].description
            got = "not shown: it may be a secret" if field in SECRET_KEYS else _shown(item["input"])
            problems.append(f"{where}{item['msg']} (got {got}); allowed: {allowed}")
    return problems


def _ssh_port(value: object) -> int:
    """The port pyinfra connects to (its `ssh_port`, which pyinfra checks itself), else 22."""
    return int(value) if str(value).isdigit() else 22


def unknown_pyinfra_keys(name: str, data: dict[str, Any], pyinfra_keys: Iterable[str]) -> list[str]:
    """A problem for each key of ``data`` in pyinfra's SSH or global-argument namespace that
    pyinfra does not know, naming the nearest known one (its value never shown: a misspelt
    `_sudo_password` holds a secret)."""
    known = [key for key in pyinfra_keys if key.startswith(CHECKED_PYINFRA_PREFIXES)]
    return [
        f"{name}: {key}: unknown pyinfra key, which pyinfra would ignore;"
        f" did you mean {difflib.get_close_matches(key, known, 1, cutoff=0)[0]}?"
        for key in data
        if key.startswith(CHECKED_PYINFRA_PREFIXES) and key not in known
    ]


def ssh_key_problems(name: str, data: dict[str, Any], cwd: str | None) -> list[str]:
    """The box's `ssh_key` a file on this machine where pyinfra 3.10 looks for it (the path with
    ~ expanded, then under ``cwd``: pyinfra/connectors/ssh_util.py `_resolve_key_paths`); else
    pyinfra fails at connecting, with a traceback for every box. (Without ssh_key, pyinfra lets
    paramiko try the agent and ~/.ssh's keys: pyinfra/connectors/ssh.py `make_paramiko_kwargs`.)"""
    key = data.get("ssh_key")
    if not key:
        return []
    if isinstance(key, str):
        candidates = [Path(key).expanduser()]
        candidates += [Path(cwd) / Path(key).expanduser()] if cwd else []
        if any(path.is_file() for path in candidates):
            return []
    # A private key pasted in place of its path is never shown.
    shown = "(not shown: not a path)" if not isinstance(key, str) or "\n" in key else repr(key)
    return [
        f"{name}: ssh_key: no file {shown} on this machine"
        + (f" (nor under {cwd})" if cwd and isinstance(key, str) else "")
        + "; give the path of the private key that logs in to the box, e.g. ~/.ssh/id_ed25519"
        " (`ls ~/.ssh`), or leave ssh_key out: pyinfra then tries your SSH agent and ~/.ssh's keys"
    ]


def _mentions(problem: str, keys: Iterable[str]) -> bool:
    return any(re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", problem) for key in keys)


def _host_settings(
    name: str,
    data: dict[str, Any],
    pyinfra_keys: list[str],
    defaults: dict[str, Any],
) -> tuple[HostSettings | None, list[str], set[str]]:
    """A box's own settings and every problem of its own, and the keys set aside: where a key is
    refused, the box is validated again with it at its default (``defaults``, group_data's, else
    the model's), so that the checks of one key against another still run, and the box has a
    stand-in for the checks across boxes. What a later round says naming a key set aside is a
    consequence of that key, not news: left out. None: no stand-in validates."""
    own = {
        key: value
        for key, value in data.items()
        if not key.startswith(PYINFRA_KEY_PREFIXES) and key not in TEARDOWN_KEYS
    }
    context = {"ssh_port": _ssh_port(data.get("ssh_port"))}
    problems: list[str] = []
    aside: set[str] = set()
    values = own
    while True:
        try:
            return HostSettings.model_validate(values, context=context), problems, aside
        except ValidationError as error:
            found = _problems(name, error, data, pyinfra_keys)
            problems += [problem for problem in found if not _mentions(problem, aside)]
            refused_keys = {str(item["loc"][0]) for item in error.errors()}
            if refused_keys <= aside:  # the defaults themselves are refused
                return None, problems, aside
            aside |= refused_keys
            values = {key: value for key, value in own.items() if key not in aside} | {
                key: defaults[key]
                for key in aside
                if key in defaults and key in HostSettings.model_fields
            }


def _consequence(problem: str, aside: dict[str, set[str]]) -> bool:
    """A problem across boxes that names a box and one of its keys set aside (_host_settings)."""
    return any(
        _mentions(problem, [name]) and _mentions(problem, keys) for name, keys in aside.items()
    )


def load_from_dicts(
    hosts: dict[str, dict[str, Any]],
    pyinfra_keys: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
    cwd: str | None = None,
) -> SparkConfig:
    """Validate every host's data (as host.data.dict() gives it); raise ConfigError listing
    every problem; what is allowed but risky is in the result's warnings. ``pyinfra_keys``: the
    keys pyinfra itself reads, offered where a key is misspelt; given, a host's `ssh_` and `_`
    keys must be among them and its `ssh_key` a file (under ``cwd``, pyinfra's, when relative);
    without them, as for data no pyinfra reads, those pass. ``defaults``: group_data's values,
    which stand in for a box's refused keys, so that every independent problem is listed at
    once (_host_settings); the checks across boxes run over the stand-ins too."""
    pyinfra_keys = list(pyinfra_keys)
    problems: list[str] = []
    configs = []
    aside: dict[str, set[str]] = {}
    for name, data in hosts.items():
        if pyinfra_keys:
            problems += unknown_pyinfra_keys(name, data, pyinfra_keys)
            problems += ssh_key_problems(name, data, cwd)
        settings, found, aside[name] = _host_settings(name, data, pyinfra_keys, defaults or {})
        problems += found
        if settings is None:
            continue
        if len(hosts) > 1 and not settings.fabric_addresses:
            # None given: the topology's scheme, by the box's place in the inventory.
            addresses = topology.derived(
                settings.fabric_topology,
                list(hosts).index(name),
                len(hosts),
                tuple(settings.fabric_switch_ports),
            )
            settings = settings.model_copy(update={"fabric_addresses": addresses})
            # The derived twins need their RDMA devices as given ones do
            # (FabricKeys.fabric_problems).
            missing = fabric.device_problems(addresses, settings.fabric_hcas)
            if missing:
                problems += [f"{name}: fabric_hcas: {problem}" for problem in missing]
                continue
        # A lone box is the head, and so is each independent box.
        alone = len(hosts) == 1 or topology.SHAPES[settings.fabric_topology].independent
        role = settings.spark_role or ("head" if alone else None)
        if role is None:
            if "spark_role" not in aside[name]:  # else its own problem says it
                problems.append(
                    f"{name}: spark_role: missing in a cluster of {len(hosts)} hosts;"
                    " set 'head' on one host and 'worker' on the others"
                )
            aside[name].add("spark_role")
            role = "worker"  # a stand-in for the checks across boxes
        # Where pyinfra reaches the box (its ssh_hostname, else its name): clients reach the
        # lanes there, and its SSH port stays open through the cluster's firewall.
        reached = (str(data.get("ssh_hostname") or name), _ssh_port(data.get("ssh_port")))
        configs.append(HostConfig.from_settings(name, role, settings, reached))
    if not hosts:
        problems.append("inventory: hosts: empty; list at least one Spark")
    # A cluster lane takes its share of every box: the workers' totals count it too, and the
    # router's box its share.
    cluster_lane = next(
        (lane for host in configs if host.role == "head" for lane in host.lanes if lane.is_cluster),
        None,
    )
    if problems:
        if configs and len(configs) == len(hosts):
            across = cluster.problems(tuple(configs)) + fleet.problems(tuple(configs), cluster_lane)
            problems += [problem for problem in across if not _consequence(problem, aside)]
        raise ConfigError(problems)
    router = fleet.router(tuple(configs))
    warnings = tuple(
        f"{host.name}: lanes: {warning}"
        for host in configs
        for warning in box_budget(host, cluster_lane, router.memory_gib_on(host.name)).warnings()
        + context_warnings(host.lanes)
    ) + tuple(cluster.nccl_warnings(configs, cluster_lane))
    # The fleet endpoint's problems beside the cluster's: each stands on its own.
    problems = fleet.problems(tuple(configs), cluster_lane)
    try:
        spark = SparkConfig(hosts=tuple(configs), warnings=warnings)
    except ConfigError as error:
        raise ConfigError(error.problems + problems) from None
    if problems:
        raise ConfigError(problems)
    return spark

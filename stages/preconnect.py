"""Every box's data checked before pyinfra connects to any box.

pyinfra 3.10's CLI (pyinfra_cli/cli.py `_main`) reads the inventory file, then each file of
group_data/ with the inventory read so far as `inventory` (pyinfra_cli/inventory.py
`make_inventory_from_files`), then connects to every box (`connect_all`); deploy.py is loaded
only after that, and a state callback registered before `State.init` is dropped by it. So the
last project code to run before connecting is group_data/all.py: it calls ``check`` with its
own values, which are every box's defaults, and each box's data from the inventory file goes
over them as pyinfra merges them. A problem stops the run there, every problem of every box
listed, even when no box answers, with every `--limit` or `--exclude` that matches no box.
`--data` and the SSH options on the command line are not in that inventory yet (pyinfra hands
them to the real inventory only): they are read from the command being run and go over
everything, as pyinfra applies them. deploy.py validates the whole data again once it is
loaded, for runs through pyinfra's API.
"""

from __future__ import annotations

import fnmatch
from types import ModuleType
from typing import Any

import click
import pyinfra
from pyinfra.api import Inventory
from pyinfra.context import ctx_inventory
from pyinfra_cli.util import parse_cli_arg

from stages import settings

# The SSH options pyinfra 3.10's CLI puts over every box's data, by their parameter names
# (pyinfra_cli/cli.py `_set_override_data`: --user, --key, --key-password, --port, --password).
SSH_OPTIONS = ("ssh_user", "ssh_key", "ssh_key_password", "ssh_port", "ssh_password")


def command_line_data() -> dict[str, Any]:
    """The `--data key=value` overrides of the pyinfra command being run, and its SSH options,
    as pyinfra's CLI makes them before it reads the inventory (pyinfra_cli/cli.py
    `_set_override_data`: split at the first "=", values through pyinfra_cli/util.py
    `parse_cli_arg`, then each SSH option given); none outside it."""
    command = click.get_current_context(silent=True)
    params = command.params if command else {}
    given = params.get("data") or ()
    data = {key: parse_cli_arg(value) for key, value in (arg.split("=", 1) for arg in given)}
    return data | {key: params[key] for key in SSH_OPTIONS if params.get(key)}


def unmatched_patterns(inventory: Inventory) -> list[str]:
    """A problem for each `--limit` or `--exclude` pattern of the command being run that no box
    matches, as pyinfra matches them (pyinfra_cli/cli.py `_get_inventory_pattern_matches`: a
    group's name, else fnmatch on the box's name), naming the boxes and groups there are. pyinfra
    only warns and goes on: a misspelt --limit then deploys nothing, a misspelt --exclude
    everything."""
    command = click.get_current_context(silent=True)
    names = [host.name for host in inventory]
    groups = sorted(name for name, hosts in inventory.groups.items() if hosts)
    shown = ", ".join(group for group in groups if group != "all")  # every box's: no news
    problems = []
    for option in ("limit", "exclude"):
        for pattern in (command.params.get(option) or ()) if command else ():
            if pattern not in groups and not fnmatch.filter(names, pattern):
                problems.append(
                    f"--{option} {pattern}: no box or group of the inventory matches; the boxes:"
                    f" {', '.join(names)} (groups: {shown}); give one of them"
                )
    return problems


def box_data(defaults: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each box of the inventory being read, its data over ``defaults`` (a group_data file's
    names: no dunders and no modules, as pyinfra keeps them), and the command line's `--data`
    over both (a host's data reads the inventory's override data first: pyinfra/api/host.py
    `Host.__init__`)."""
    given = {
        key: value
        for key, value in defaults.items()
        if not key.startswith("__") and not isinstance(value, ModuleType)
    }
    overrides = command_line_data()
    return {host.name: given | host.data.dict() | overrides for host in ctx_inventory.get()}


def check(defaults: dict[str, Any]) -> None:
    """Stop the pyinfra run now, before it connects, when the inventory over ``defaults``
    has problems, or a `--limit` or `--exclude` matches no box: each on its own line, named by
    box and key, and no traceback (a SystemExit passes pyinfra's file loader and its CLI, which
    catch Exception only: pyinfra_cli/util.py `exec_file`, pyinfra_cli/cli.py `cli`). Outside
    pyinfra's command line (a test, `make plan`, compliance reading the inventory; each
    validates it itself) it does nothing."""
    if not (pyinfra.is_cli and ctx_inventory.isset()):
        return
    reasons = unmatched_patterns(ctx_inventory.get())
    reasons += [reason] if (reason := settings.refusal(box_data(defaults), defaults)) else []
    if reasons:
        for reason in reasons:
            click.echo(click.style(f"--> {reason}", "red"), err=True)
        click.echo("--> No box was contacted.", err=True)
        raise SystemExit(1)

"""Every box's data checked before pyinfra connects to any box.

pyinfra 3.10's CLI (pyinfra_cli/cli.py `_main`) reads the inventory file, then each file of
group_data/ with the inventory read so far as `inventory` (pyinfra_cli/inventory.py
`make_inventory_from_files`: the files in the directory's listing order, each one whole), builds
the inventory from them and the command line's `--data` and SSH options, then connects to every
box (`connect_all`). pyinfra 3 has no hook between the two, and a state callback registered
before `State.init` is dropped by it; deploy.py is loaded only after connecting. So group_data/
all.py calls ``check`` while pyinfra reads it, and ``check`` reads the inventory again as pyinfra
is reading it, with pyinfra's own `make_inventory` and the command's own arguments: every line
of every group_data file counts (a value written below the call too, a group's own file read
after all.py), the command line's data over everything, as each box will have it. Its own
call, in that second reading, does nothing. A problem stops the run there, every problem of
every box listed, even when no box answers, with every `--limit` or `--exclude` that matches
no box. deploy.py validates the whole data again once it is loaded, for runs through
pyinfra's API.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import click
import pyinfra
from pyinfra import state
from pyinfra.api import Inventory
from pyinfra.context import ctx_inventory
from pyinfra_cli.inventory import make_inventory
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


class Rereading:
    """Whether ``check`` is reading the inventory again: its own call then does nothing."""

    now = False


def as_pyinfra_reads_it() -> Inventory:
    """The inventory of the pyinfra command being run, read again as its CLI reads it
    (pyinfra_cli/cli.py `_main`: `make_inventory` of the command's inventory argument, its
    `--group-data` directories, the directory it runs in, the command line's data over all)."""
    params = click.get_current_context().params
    Rereading.now = True
    try:
        return make_inventory(
            params["inventory"],
            override_data=command_line_data(),
            cwd=state.cwd,
            group_data_directories=params.get("group_data"),
        )
    finally:
        Rereading.now = False


def box_data(inventory: Inventory) -> dict[str, dict[str, Any]]:
    """Each box's data as pyinfra gives it to the box (pyinfra/api/host.py ``HostData``: the
    command line's data, the box's own, its groups', the group "all"'s), in the inventory's
    order (it derives addresses)."""
    return {host.name: host.data.dict() for host in inventory}


def check() -> None:
    """Stop the pyinfra run now, before it connects, when the inventory as pyinfra reads it has
    problems, or a `--limit` or `--exclude` matches no box: each on its own line, named by box
    and key, and no traceback (a SystemExit passes pyinfra's file loader and its CLI, which
    catch Exception only: pyinfra_cli/util.py `exec_file`, pyinfra_cli/cli.py `cli`). Outside
    pyinfra's command line (a test, `make plan`, compliance reading the inventory; each
    validates it itself) it does nothing."""
    if not (pyinfra.is_cli and ctx_inventory.isset()) or Rereading.now:
        return
    inventory = as_pyinfra_reads_it()
    reasons = unmatched_patterns(inventory)
    # group "all"'s data: group_data/all.py's names (pyinfra_cli/inventory.py), as settings.load
    refused = settings.refusal(box_data(inventory), inventory.get_data())
    reasons += [refused] if refused else []
    if reasons:
        for reason in reasons:
            click.echo(click.style(f"--> {reason}", "red"), err=True)
        click.echo("--> No box was contacted.", err=True)
        raise SystemExit(1)

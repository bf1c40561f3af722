"""The validated inventory of this pyinfra run: spark.inventory's model over pyinfra's hosts."""

from __future__ import annotations

import functools
import sys
import weakref
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.arguments import all_argument_meta
from pyinfra.api.connectors import get_all_connectors
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.context import ctx_state

from spark.inventory import ConfigError, SparkConfig, load_from_dicts
from spark.plan import Plan
from spark.plan import plan as spark_plan

COLLECTION = Path(__file__).resolve().parents[1]  # where pyinfra starts: group_data/ is there


class InventoryRefused(PyinfraError):
    """The inventory's problems, shown by pyinfra as its own error (no traceback)."""


def read_inventory(path: str, state: State | None = None) -> Inventory:
    """The inventory as `pyinfra <path> ...` run from the collection builds it (group_data/
    included), without connecting to any host; InventoryRefused when it cannot be read."""
    # pyinfra's CLI reads inventory files; imported here only, as its own tools do.
    from pyinfra_cli.exceptions import UnexpectedExternalError
    from pyinfra_cli.inventory import make_inventory

    if not Path(path).is_file():
        raise InventoryRefused(f"{path}: no such inventory file")
    try:
        with ctx_state.use(state or State()):  # pyinfra reads inventory files under a state
            return make_inventory(path, cwd=str(COLLECTION))
    except SystemExit as error:  # inventories/sim.py exits when no lab is up
        raise InventoryRefused(f"{path}: {error}") from None
    except UnexpectedExternalError as error:
        raise InventoryRefused(f"{error.filename}: {error.get_exception().strip()}") from None


@functools.cache  # pyinfra lists its connectors from every package's entry points: once a run
def pyinfra_keys() -> tuple[str, ...]:
    """Keys pyinfra documents (global arguments, connector data): a misspelt
    `sudo_password` gets "did you mean _sudo_password?"."""
    connectors = get_all_connectors().values()
    return (*all_argument_meta, *(key for connector in connectors for key in connector.data_meta))


def refusal(hosts: dict[str, dict[str, Any]], defaults: dict[str, Any]) -> str | None:
    """Every problem of these boxes' data (as host.data.dict() gives it) over ``defaults``
    (group_data's), None without any: the deploy's own validation, for the inventory read
    before pyinfra connects (stages/preconnect.py)."""
    try:
        load_from_dicts(hosts, pyinfra_keys(), defaults, str(COLLECTION))
    except ConfigError as error:
        return str(error)
    return None


# One result per inventory, the error included: every host's connect and deploy.py ask.
_loaded: weakref.WeakKeyDictionary[Inventory, SparkConfig | ConfigError] = (
    weakref.WeakKeyDictionary()
)


def load(inventory: Inventory) -> SparkConfig:
    """The validated configuration of a pyinfra inventory, validated once and cached (data
    changed afterwards is not seen); its warnings logged once."""
    if inventory not in _loaded:
        try:
            result = load_from_dicts(
                {host.name: host.data.dict() for host in inventory},
                pyinfra_keys(),
                inventory.get_data(),  # group_data's: pyinfra_cli/inventory.py, group "all"
                str(COLLECTION),  # where pyinfra resolves a relative ssh_key (its state's cwd)
            )
        except ConfigError as error:
            _loaded[inventory] = error
        else:
            for warning in result.warnings:
                logger.warning(warning)  # allowed but risky: yellow, before the operations
            _loaded[inventory] = result
    result = _loaded[inventory]
    if isinstance(result, ConfigError):
        raise InventoryRefused(str(result))  # a fresh one: no traceback piled up per host
    return result


_planned: weakref.WeakKeyDictionary[Inventory, Plan] = weakref.WeakKeyDictionary()


def plan(inventory: Inventory) -> Plan:
    """Every box's plan (spark/plan.py) for a pyinfra inventory, computed once."""
    if inventory not in _planned:
        _planned[inventory] = spark_plan(load(inventory))
    return _planned[inventory]


def plan_or_say_why(path: str) -> Plan | None:
    """The plan of the inventory file at ``path``, read without connecting; None after printing
    why it is refused (on stderr): what the commands that only read an inventory start with."""
    try:
        return plan(read_inventory(path))
    except InventoryRefused as error:
        print(error, file=sys.stderr)
        return None

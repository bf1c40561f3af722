"""Validate the inventory's host data before any host is contacted.

A box's keys by concern, each module holding its keys, their checks, and the checks across the
boxes beside the keys they check: fabric.py (the cabling, the twins, the MTU), box.py (kernel,
driver, GPU clock, container toolkit), cluster.py (the role, the NCCL test, Ray; the whole
inventory, SparkConfig), lanes.py (the lanes, their memory and weights), front.py, metrics.py;
the router's keys are spark/fleet.py's. settings.py assembles them (HostSettings), hosts.py holds
a box's validated configuration (HostConfig), load.py checks an inventory (load_from_dicts).
Callers import from here.
"""

from spark.inventory.cluster import SparkConfig
from spark.inventory.hosts import (
    ConfigError,
    Driver,
    FabricLink,
    HostConfig,
    NcclTest,
    Toolkit,
)
from spark.inventory.load import TEARDOWN_KEYS, load_from_dicts, unknown_pyinfra_keys
from spark.inventory.settings import HostSettings

__all__ = [
    "TEARDOWN_KEYS",
    "ConfigError",
    "Driver",
    "FabricLink",
    "HostConfig",
    "HostSettings",
    "NcclTest",
    "SparkConfig",
    "Toolkit",
    "load_from_dicts",
    "unknown_pyinfra_keys",
]

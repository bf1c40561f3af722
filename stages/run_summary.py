"""After a run: one line per box, "converged" or where it stopped and why, then the endpoints of
every box whose own lanes serve and its client configuration. Reporting only: nothing here
touches a host.

A problem found on one box stops that box alone (operations/util.py: ``refused``), and pyinfra
goes on with the others; with four boxes its output interleaves them. This table says, once
the run is over, which boxes are done and which are not, each with the operation it stopped at
(its stage first, where it ran in one: "Stage | operation") and the first line it printed.
pyinfra exits 1 when a box failed (pyinfra_cli/cli.py: _exit).
"""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path

import click
from pyinfra.api import State
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, StateStage

from endpoints import (
    FLEET_KEY_NAME,
    OPENCODE_DIR,
    Endpoint,
    agent_note,
    endpoints_of,
    endpoints_table,
    key_file,
    opencode_config,
)
from operations.util import failed_operation, stopped_at
from spark.box_paths import FLEET_KEY, SECRETS_DIR
from spark.inventory import HostConfig
from stages.cluster import STAGE as CLUSTER

CONVERGED = "converged"
# A box stopped in the cluster stage: the stages before it (its host layer, fabric, own lanes
# and front) converged; what stopped it is the cluster (often another box it waits for).
ON_ITS_OWN = "converged on its own"


def serving(run: State, box: Host) -> bool:
    """Whether ``box``'s own lanes and front are up after this run: it converged, or stopped
    only in the cluster stage, which comes after them (deploy.py)."""
    if box not in run.failed_hosts:
        return box in run.activated_hosts
    failed = failed_operation(run, box)
    return failed is not None and failed[0].startswith(f"{CLUSTER} | ")


def outcomes(run: State, done: str = CONVERGED) -> dict[str, str]:
    """Each box of the run (those the run connected to or tried to), in inventory order:
    ``done`` ("converged" for a deploy), or "stopped at <operation>: <why>", "converged on its
    own" first where it stopped in the cluster stage."""
    failed = set(run.failed_hosts)
    rows = {}
    for box in run.inventory:
        if box in failed:
            own = f"{ON_ITS_OWN}; " if serving(run, box) else ""
            rows[box.name] = f"{own}stopped at {stopped_at(run, box)}"
        elif box in run.activated_hosts:
            rows[box.name] = done
    return rows


def table(rows: dict[str, str]) -> str:
    """The outcome of every box, one line each, the boxes' names aligned."""
    width = max(len(box) for box in rows)
    return "\n".join(f"    {box:{width}}  {outcome}" for box, outcome in rows.items())


class RunSummary(BaseStateCallback):
    """Once the operations ran (pyinfra's results printed, or every box failed): the table.
    A --dry run runs none: its refusals are logged as the deploy is prepared instead."""

    def __init__(self, done: str = CONVERGED) -> None:
        self.said = done
        self.done = False

    def host_disconnect(self, state: State, host: Host) -> None:
        # Disconnect: after the results; Execute: pyinfra stopped the run ("No hosts
        # remaining!") and disconnects from there (pyinfra_cli/cli.py: cli's finally).
        if self.done or state.current_stage not in (StateStage.Execute, StateStage.Disconnect):
            return
        self.done = True
        rows = outcomes(state, self.said)
        if rows:
            click.echo("--> Boxes:", err=True)
            click.echo(table(rows), err=True)


def register(state: State, done: str = CONVERGED) -> None:
    """Print the table after the run, ``done`` for a box that went through (call from deploy.py
    or teardown.py; once per run is kept)."""
    if not any(isinstance(handler, RunSummary) for handler in state.callback_handlers):
        state.add_callback_handler(RunSummary(done))


class EndpointsReport(BaseStateCallback):
    """Once the run is over (pyinfra's results printed, hosts disconnecting): the endpoints of
    every box whose own lanes serve (``serving``: its deploy succeeded, or stopped only in the
    cluster stage), and clients/<box>.json for each (endpoints.py)."""

    def __init__(self) -> None:
        self.endpoints: dict[str, list[Endpoint]] = {}
        self.done = False

    def host_disconnect(self, state: State, host: Host) -> None:
        # Disconnect: after the results (never with --dry); Execute: pyinfra stopped the run,
        # every box failed ("No hosts remaining!"), and disconnects from there.
        if self.done or state.current_stage not in (StateStage.Execute, StateStage.Disconnect):
            return
        self.done = True
        # In the inventory's order (the boxes report in the order their deploys were loaded).
        up = [box.name for box in state.inventory if serving(state, box)]
        served = {box: self.endpoints[box] for box in up if self.endpoints.get(box)}
        if not served:
            return
        # clients/ beside the deploy, or SPARK_CLIENTS_DIR: the test suite gives each simulated
        # lab its own, as the boxes of its labs share their names.
        clients = Path(os.environ.get("SPARK_CLIENTS_DIR") or Path(state.cwd or ".") / "clients")
        clients.mkdir(parents=True, exist_ok=True)
        for box, endpoints in served.items():
            text = json.dumps(opencode_config(box, endpoints), indent=2) + "\n"
            (clients / f"{box}.json").write_text(text)
        click.echo("--> Lanes serving:", err=True)
        click.echo(endpoints_table(served), err=True)
        box, lanes = next(iter(served.items()))
        click.echo(
            f"    OpenCode: `make clients` writes one provider into {OPENCODE_DIR}/opencode.json,"
            " the fleet's router with every served name, and copies the fleet key"
            f" ({FLEET_KEY} on the router's box) to {OPENCODE_DIR}/<box>-{FLEET_KEY_NAME}.key."
            " `make clients PER_LANE=1` (or with fleet_router False) instead copies each lane's"
            f" key ({SECRETS_DIR}/<lane>.key) to {OPENCODE_DIR}/<box>-<lane>.key"
            f" ({box} {lanes[0].lane}: {key_file(box, lanes[0].lane)}) and merges every box's"
            f" providers (clients/<box>.json) into {OPENCODE_DIR}/opencode.json.",
            err=True,
        )
        click.echo(
            "    Any OpenAI-style client, vLLM and llama.cpp lanes alike: base URL = the URL,"
            " model = the served name, API key = the lane's key (Authorization: Bearer).",
            err=True,
        )
        for box, endpoints in served.items():
            for endpoint in endpoints:
                if note := agent_note(endpoint):
                    click.echo(f"    {box} {endpoint.lane}: {note}", err=True)


_reports: weakref.WeakKeyDictionary[State, EndpointsReport] = weakref.WeakKeyDictionary()


def report_endpoints(state: State, box: HostConfig, address: str) -> None:
    """Print this box's endpoints after the run (call from deploy.py, once per box); clients
    reach it at ``address``."""
    if state not in _reports:
        _reports[state] = EndpointsReport()
        state.add_callback_handler(_reports[state])
    _reports[state].endpoints[box.name] = endpoints_of(box, address)

"""The lanes' endpoints of a box as its clients see them: the table printed after a run and an
OpenCode client configuration per box (clients/<box>.json), from the validated configuration
alone. stages/run_summary.py prints and writes them after the run; stages/clients.py merges
them on this machine. Nothing here touches a host or reads a run."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from spark.box_paths import key_path
from spark.inventory import HostConfig
from spark.lane import AGENT_CONTEXT
from spark.plan import Plan


class Endpoint(NamedTuple):
    """One lane as its clients see it."""

    lane: str
    engine: str  # vllm or llama.cpp
    served_name: str
    url: str  # the OpenAI base URL, ending in /v1
    memory_fraction: float
    max_model_len: int
    api_key: bool


def endpoints_of(box: HostConfig, address: str) -> list[Endpoint]:
    """The endpoints of a box's lanes, reached at ``address`` (where the inventory connects),
    through the box's front: HTTPS when it has the user's certificate."""
    scheme = "https" if box.front_tls else "http"
    return [
        Endpoint(
            lane=lane.name,
            engine=lane.engine,
            served_name=lane.served_name,
            url=f"{scheme}://{address}:{lane.port}/v1",
            memory_fraction=lane.memory_fraction,
            max_model_len=lane.max_model_len,
            api_key=lane.api_key,
        )
        for lane in box.lanes
    ]


def agent_note(endpoint: Endpoint) -> str:
    """What a lane too short for agent clients says in its client configuration; "" if none."""
    if endpoint.max_model_len >= AGENT_CONTEXT:
        return ""
    return (
        f"max_model_len {endpoint.max_model_len} is below {AGENT_CONTEXT}: agent clients"
        " refuse it (Hermes Agent needs 64K, seed 003)"
    )


# OpenCode's global configuration directory, where `make clients` copies the keys
# (https://opencode.ai/docs/config/#global: ~/.config/opencode/opencode.json).
OPENCODE_DIR = "~/.config/opencode"


def client_slug(box: str) -> str:
    """A box's name as its providers and key files spell it: lower case, every run of
    characters other than a-z, 0-9 and - made one - (spark-1.local: spark-1-local)."""
    return re.sub(r"[^a-z0-9-]+", "-", box.lower())


def key_file(box: str, lane: str) -> str:
    """The name of a lane's key file on the client, in its configuration directory."""
    return f"{client_slug(box)}-{lane}.key"


def model_entry(endpoint: Endpoint) -> dict:
    """A served name as an OpenCode provider lists it: its context and output limits, and the
    name the client shows when picking a model, saying where it is too short for agents."""
    limit = {
        "context": endpoint.max_model_len,
        # Seed 002 leaves 16K of its 128K context for output; never more than a quarter.
        "output": min(16384, endpoint.max_model_len // 4),
    }
    note = agent_note(endpoint)
    name = f"{endpoint.served_name} ({note})" if note else endpoint.served_name
    return {"name": name, "limit": limit}


def opencode_config(box: str, endpoints: Sequence[Endpoint], keys_dir: str = OPENCODE_DIR) -> dict:
    """An OpenCode configuration (as in seed 002) with one provider per lane of the box. The key
    is read from a file on the client in ``keys_dir`` ({file:...}), never written here."""
    slug = client_slug(box)
    providers = {}
    for endpoint in endpoints:
        options = {"baseURL": endpoint.url}
        if endpoint.api_key:
            options["apiKey"] = f"{{file:{keys_dir}/{key_file(box, endpoint.lane)}}}"
        providers[f"{slug}-{endpoint.lane}"] = {
            "npm": "@ai-sdk/openai-compatible",
            "name": f"{box} {endpoint.lane}",
            "options": options,
            "models": {endpoint.served_name: model_entry(endpoint)},
        }
    return {"$schema": "https://opencode.ai/config.json", "provider": providers}


# The fleet key as `make clients` reads it from a router's box, as it reads a lane's key: the
# name of /etc/spark/secrets/_fleet.key (spark/box_paths.py FLEET_KEY).
FLEET_KEY_NAME = "_fleet"
# The router's provider, and the failover router's: OpenCode takes one baseURL a provider
# (https://opencode.ai/docs/providers/#custom-provider: options.baseURL), so a second router
# is a second provider listing the same models, which the owner picks when the first is down.
FLEET_PROVIDERS = ("spark-fleet", "spark-fleet-failover")


class RouterEndpoint(NamedTuple):
    """One box of the fleet's router as clients see it."""

    box: str
    url: str  # the OpenAI base URL, ending in /v1


def routers_of(plan: Plan) -> list[RouterEndpoint]:
    """The router's boxes (the first, then the failover's) at the address the inventory connects
    to, on router_port of the box's front: HTTPS where the front has the user's certificate."""
    found = []
    for router in plan.fleet.boxes:
        scheme = "https" if plan.box(router.name).front.tls else "http"
        found.append(
            RouterEndpoint(router.name, f"{scheme}://{router.address}:{plan.fleet.port}/v1")
        )
    return found


def served_models(fleet: dict[str, Sequence[Endpoint]]) -> list[Endpoint]:
    """One endpoint per served name of the fleet, its first in the inventory's order: replicas
    share max_model_len (spark/fleet.py REPLICA_FIELDS), so any one gives the limits."""
    first: dict[str, Endpoint] = {}
    for endpoints in fleet.values():
        for endpoint in endpoints:
            first.setdefault(endpoint.served_name, endpoint)
    return list(first.values())


def router_provider(
    router: RouterEndpoint, failover: bool, models: Sequence[Endpoint], keys_dir: str = OPENCODE_DIR
) -> dict[str, dict]:
    """The OpenCode provider of one router box (FLEET_PROVIDERS: the first's, or the
    failover's), listing every served name of the fleet, its fleet key read from a file in
    ``keys_dir``; none without a model (OpenCode would list an empty provider)."""
    if not models:
        return {}
    name = FLEET_PROVIDERS[failover]
    shown = "fleet, failover" if failover else "fleet"
    return {
        name: {
            "npm": "@ai-sdk/openai-compatible",
            "name": f"{shown} (router on {router.box})",
            "options": {
                "baseURL": router.url,
                "apiKey": f"{{file:{keys_dir}/{key_file(router.box, FLEET_KEY_NAME)}}}",
            },
            "models": {model.served_name: model_entry(model) for model in models},
        }
    }


def endpoints_table(endpoints: dict[str, Sequence[Endpoint]]) -> str:
    """The lanes of every box, one line each, and where their keys are."""
    rows = [("box", "lane", "engine", "served name", "URL", "memory", "API key")]
    rows += [
        (
            box,
            e.lane,
            e.engine,
            e.served_name,
            e.url,
            f"{e.memory_fraction:.2f}",
            key_path(e.lane) if e.api_key else "none",
        )
        for box, lanes in endpoints.items()
        for e in lanes
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "    " + "  ".join(f"{c:{w}}" for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )

"""The fleet as one endpoint: the router's keys, where it runs, the replicas of a served name and
the route table, checked across the boxes before any is contacted.

One router (and optionally a second, for failover) serves every lane of every box under one
URL and one fleet key: a request goes to a lane serving its model; the lanes of one served_name
on several boxes are replicas, load-balanced and skipped when down, so they must answer alike.
Which router runs it, and how, follows in operations/; this is the model it renders. The
router's share of its box's memory is spark/memory.py's (Budget.router_gib).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict

from spark.lane import listeners
from spark.memory import box_budget
from spark.options import option
from spark.ports import metrics_exporter_port, port_owners
from spark.trust import front_problems

if TYPE_CHECKING:
    from collections.abc import Iterable

    from spark.inventory import HostConfig
    from spark.lane import Lane

# The router listens on 127.0.0.1 behind the box's front, which owns router_port (its TLS, its
# allow-list), as a lane's server does: there loopback_port defaults to port + 1000.
LOOPBACK_OFFSET = 1000

# The router's keys (group_data/all.py gives their defaults), declared once in RouterKeys, which
# a box's keys (spark/inventory/settings.py HostSettings) inherit.
FleetRouter = Annotated[
    bool,
    option(
        "True or False",
        why="One router serves every lane of every box under one URL and one fleet key (issue"
        " 38). It costs its box 119 pinned packages (744 MB installed, spark/router.py) and"
        " 357-362 MiB of unified memory; False leaves each lane's own endpoint alone (`make"
        " clients` then writes a provider per lane).",
        scope="fleet",
    ),
]
RouterBox = Annotated[
    str | None,
    option(
        "None (the head; of independent boxes, the first), or the name of a box of the inventory",
        why="One router serves every lane of every box under one URL and one fleet key (issue"
        " 38); by default where clients already go.",
        scope="fleet",
    ),
]
FailoverBox = Annotated[
    str | None,
    option(
        "None (no failover), or the name of another box of the inventory",
        why="A second router, so that the fleet's URL outlives its first box.",
        scope="fleet",
    ),
]
RouterPort = Annotated[
    int,
    option(
        f"an integer 1024..{65535 - LOOPBACK_OFFSET}: clients reach the router there,"
        f" through the box's front; the router itself listens on 127.0.0.1 at port +"
        f" {LOOPBACK_OFFSET} (10100)",
        why="Beside the lanes' ports (10101, 10102: seed 003), outside Ray's and the"
        " back-end's (spark/ports.py); behind the front, as a lane's server is.",
        scope="fleet",
        ge=1024,
        le=65535 - LOOPBACK_OFFSET,
    ),
]
HealthInterval = Annotated[
    int,
    option(
        "seconds between two health checks of each lane, 1..300: a lane down is"
        " skipped within one (10)",
        why="10 s is Kubernetes' own for its probes (periodSeconds, \"Configure Liveness,"
        " Readiness and Startup Probes\"), what seed 000's swap behind a Kubernetes service got.",
        scope="fleet",
        ge=1,
        le=300,
    ),
]
RouterMemory = Annotated[
    float,
    option(
        "GiB of unified memory the router takes on its box (1.0)",
        why="Counted in its box's budget beside the lanes. LiteLLM's proxy measured 357-362 MiB"
        " resident, idle and at 16 streams (`python -m bench.router`, loopback, this project's"
        " 2-core machine); 1.0 GiB holds two workers with room for a longer model list.",
        scope="fleet",
        gt=0,
    ),
]
PipIndex = Annotated[
    str | None,
    option(
        "None (pip's own default index), or the URL of a PEP 503 simple index holding the"
        " router's pinned wheels, e.g. 'https://mirror.example.internal/simple/'",
        why="The router box installs LiteLLM's whole resolved set (spark/router.py,"
        " spark/data/) with pip; boxes that reach no public index name a mirror of it (PEP 503).",
        scope="fleet",
        pattern=r"^https?://[^\s/]+(/\S*)?$",
    ),
]


class RouterKeys(BaseModel):
    """The router's keys as one box's data gives them: the same on every box."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    fleet_router: FleetRouter
    router_box: RouterBox
    router_failover_box: FailoverBox
    router_port: RouterPort
    router_health_interval_s: HealthInterval
    router_memory_gib: RouterMemory
    router_pip_index: PipIndex

    @classmethod
    def of(cls, settings: BaseModel) -> RouterKeys:
        """These keys of a box's validated settings."""
        return cls(**{key: getattr(settings, key) for key in cls.model_fields})


class Router(BaseModel):
    """Where the router runs (its box, then the failover's) and how, the defaults resolved."""

    model_config = ConfigDict(frozen=True)

    boxes: tuple[str, ...]
    port: int
    health_interval_s: int
    memory_gib: float
    pip_index: str | None

    @property
    def loopback_port(self) -> int:
        return self.port + LOOPBACK_OFFSET

    def memory_gib_on(self, box: str) -> float:
        """The router's share of ``box``: its memory where it runs, else none."""
        return self.memory_gib if box in self.boxes else 0.0


def reference(hosts: tuple[HostConfig, ...]) -> HostConfig:
    """The box whose keys count (the others must agree): the head, of independent boxes (each
    its own head) the first; the first box where none is the head."""
    return next((host for host in hosts if host.role == "head"), hosts[0])


def router(hosts: tuple[HostConfig, ...]) -> Router:
    """The router as the reference box's keys give it: on router_box, else on the reference
    box, then on router_failover_box where one is named; on no box with fleet_router False."""
    keys = reference(hosts).router
    first = keys.router_box or reference(hosts).name
    failover = keys.router_failover_box
    boxes = (first, failover) if failover else (first,)
    return Router(
        boxes=boxes if keys.fleet_router else (),
        port=keys.router_port,
        health_interval_s=keys.router_health_interval_s,
        memory_gib=keys.router_memory_gib,
        pip_index=keys.router_pip_index,
    )


def problems(hosts: tuple[HostConfig, ...], cluster: Lane | None) -> list[str]:
    """Every problem of the fleet endpoint, each "<boxes>: <key>: <what>; <do>": the router's
    keys that differ between boxes, a router box not in the inventory, its port taken on its
    box, its memory share that does not fit there (``cluster``: the cluster lane, whose rank a
    worker holds), a served name whose replicas differ, a TLS front the router cannot verify."""
    found = key_problems(hosts)
    names = [host.name for host in hosts]
    endpoint = router(hosts)
    if not endpoint.boxes:  # fleet_router False: no router, nothing of it to check
        return found
    found += [
        f"{', '.join(names)}: {key}: {box!r} is no box of the inventory ({', '.join(names)});"
        f" name one of them, or None ({none})"
        for key, box, none in (
            ("router_box", endpoint.boxes[0], "the head"),
            ("router_failover_box", reference(hosts).router.router_failover_box, "no failover"),
        )
        if box is not None and box not in names
    ]
    if len(endpoint.boxes) > 1 and endpoint.boxes[0] == endpoint.boxes[1]:
        found.append(
            f"{endpoint.boxes[0]}: router_failover_box: {endpoint.boxes[0]!r} is the router's own"
            " box; name another box, or None (no failover)"
        )
    for host in hosts:
        if host.name in endpoint.boxes:
            found += port_problems(host, endpoint)
            found += memory_problems(host, cluster, endpoint.memory_gib)
    return found + replica_problems(hosts) + tls_problems(hosts)


def tls_fronts(hosts: Iterable[HostConfig]) -> list[HostConfig]:
    """The boxes whose front the router reaches over TLS: a certificate, and lanes behind it
    (the head's holding the cluster lane), in the inventory's order."""
    return [host for host in hosts if host.front_tls and host.lanes]


def tls_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """Each TLS front serving lanes as the router reaches it: its certificate verified against
    what the router's bundle holds of it (front_tls_ca_file, else the certificate file itself),
    its subjectAltName covering the box's address (spark/trust.py)."""
    return [
        problem
        for host in tls_fronts(hosts)
        for problem in front_problems(host.name, host.address, host.front_tls[0], host.front_tls_ca)
    ]


def key_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """The router's keys of each box against the reference box's: one router for the fleet."""
    first = reference(hosts)
    return [
        f"{host.name}: {key}: {getattr(host.router, key)!r} differs from {first.name}'s"
        f" {getattr(first.router, key)!r}; set the router's keys once, in group_data, for every"
        " box"
        for host in hosts
        for key in RouterKeys.model_fields
        if getattr(host.router, key) != getattr(first.router, key)
    ]


def port_problems(host: HostConfig, endpoint: Router) -> list[str]:
    """The router's two ports (the front's and its own on loopback) against every port the box
    holds: its lanes' (front, loopback, an on-demand lane's server), the metrics endpoint's and
    its exporter's, Ray's, the distributed back-end's, the ephemeral range, SSH's
    (spark/ports.py)."""
    owners = port_owners(host.ray.port, host.ssh_port)
    owners += [
        (port, port, f"the {key} of lane {lane.name} (lanes)")
        for lane in host.lanes
        for key, port in listeners(lane)
    ]
    if host.metrics:
        exporter = metrics_exporter_port(host.metrics_port)
        owners.append(
            (host.metrics_port, host.metrics_port, "the metrics endpoint's (metrics_port)")
        )
        owners.append((exporter, exporter, "the node exporter's (metrics_port + 1)"))
    ours = {
        endpoint.port: "the router's",
        endpoint.loopback_port: f"the router's own, on 127.0.0.1 (router_port + {LOOPBACK_OFFSET})",
    }
    return [
        f"{host.name}: router_port: {port} ({whose}) is {owner}; give router_port another port"
        for port, whose in ours.items()
        for low, high, owner in owners
        if low <= port <= high
    ]


def memory_problems(host: HostConfig, cluster: Lane | None, router_gib: float) -> list[str]:
    """The box with the router's share, where the router's share is what tips it over (without
    it the box was checked already: spark/inventory/)."""
    alone = box_budget(host, cluster)
    if alone.problems() or alone.guard_problems(host.memory_guard_min_available_gib):
        return []
    box = box_budget(host, cluster, router_gib)
    return [f"{host.name}: lanes: {problem}" for problem in box.problems()] + [
        f"{host.name}: memory_guard_min_available_gib: {problem}"
        for problem in box.guard_problems(host.memory_guard_min_available_gib)
    ]


# What replicas of one served name must share: the router sends a request to either, so they
# answer alike, and why each field changes the answer. Free to differ: the lane's name, ports,
# memory_fraction (room for requests at once, not their answers), priority, its key, its
# tensor_parallel_size (a TP=2 replica serves what a TP=1 one does) and whether it is on demand.
REPLICA_FIELDS = {
    "engine": "vLLM and llama.cpp apply the model's chat template and sampling by their own code",
    "model": "another model gives other answers",
    "gguf_file": "another GGUF file is another quantization of the weights",
    "image": "another release applies the chat template, generation config and parsers by its"
    " own code",
    "max_model_len": "a request one replica takes, the other refuses",
    "slots": "llama.cpp splits max_model_len between its slots: the longest request differs",
    "kv_cache_dtype": "the cache's precision changes answers (FP8 KV turned Qwen3.5's hybrid"
    " attention into gibberish: ig1/Qwen3.5-35B-A3B-NVFP4's model card)",
    "tool_call_parser": "tool calls come back in one and not the other",
    "extra_args": "vLLM's options change answers (--quantization, --reasoning-parser,"
    " --chat-template, --generation-config) and no list says which do not",
    "environment": "variables choose kernels and samplers (VLLM_NVFP4_GEMM_BACKEND)",
}


def served(hosts: Iterable[HostConfig]) -> dict[str, list[tuple[HostConfig, Lane]]]:
    """Each served name and the lanes serving it, in the inventory's order: every box's own
    lanes, the head's holding the cluster lane (its ranks on the workers serve nothing)."""
    found: dict[str, list[tuple[HostConfig, Lane]]] = {}
    for host in hosts:
        for lane in host.lanes:
            found.setdefault(lane.served_name, []).append((host, lane))
    return found


def replica_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """Each lane of a served name against its first: every field of REPLICA_FIELDS equal."""
    found = []
    for name, lanes in served(hosts).items():
        (first_box, first), *others = lanes
        for box, lane in others:
            boxes = ", ".join(dict.fromkeys((first_box.name, box.name)))
            found += [
                f"{boxes}: lanes: {first.name} ({first_box.name}) and {lane.name} ({box.name})"
                f" both serve {name}, but their {key} differs ({_shown(getattr(first, key))} and"
                f" {_shown(getattr(lane, key))}): {why}; set the same {key} on both, or give one"
                " its own served_name"
                for key, why in REPLICA_FIELDS.items()
                if getattr(first, key) != getattr(lane, key)
            ]
    return found


def _shown(value: Any) -> str:
    """A value in a message, cut where long (a model's id shown whole)."""
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:97]}..."

"""Each box's plan, computed once from the validated inventory: what the deploy will make of
the box, every figure by one function, no pyinfra and no box contacted.

The deploy's stages (stages/) execute a box's plan, compliance reads its expected values from
it, and ``make plan`` prints it (stages/show_plan.py) for a person to review before a run. The
plan holds no state of the box: facts read that (the box is the state, as pyinfra means it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from spark import fleet
from spark import kernel as kernel_rules
from spark import router as litellm
from spark.box_paths import (
    FLEET_KEY,
    GPU_CLOCK_UNIT,
    HF_CACHE_IN_CONTAINER,
    HF_TOKEN,
    HF_TOKEN_IN_CONTAINER,
    MODELS_DIR,
    NCCL_VERDICT,
    NVIDIA_SMI,
    RAY_TOKEN_IN_CONTAINER,
    WEIGHTS_PORT,
    fetch_unit,
)
from spark.engines.record import ModelAtStart
from spark.inventory import (
    Driver,
    FabricLink,
    HostConfig,
    SparkConfig,
    Toolkit,
)
from spark.lane import Lane, MpRank
from spark.memory import box_budget
from spark.ports import listen_ports, metrics_exporter_port


class Record(BaseModel):
    """A part of a box's plan: set once, printable, and its JSON reads back as the same plan."""

    model_config = ConfigDict(frozen=True)


class Kernel(Record):
    """What the deploy makes sure of the running kernel (operations/kernel.py)."""

    # Kexec handover kept off on a box of the fabric (spark/kernel.py): "grub" adds the boot
    # option, "refuse" stops the box with the fix; None on a box without the fabric.
    kho_fix: Literal["grub", "refuse"] | None
    kho_default_from: tuple[int, int]  # the first release that turns it on at boot
    boot_option: str
    grub_dropin: str
    # kernel_hold: these metapackages held and apt pinned to the running kernel's ABI; () off.
    hold: tuple[str, ...]


class GpuClockLock(Record):
    """The GPU's graphics clock locked at every boot (operations/gpuclock.py): the oneshot unit,
    the command it runs, and the range nvidia-smi's line in the unit's journal then names."""

    unit: str
    command: str
    min_mhz: int
    max_mhz: int


class Peer(Record):
    """Another box's address on the subnet of one of this box's twins."""

    ifname: str
    box: str
    address: str


class Fabric(Record):
    """The box's twins and what is checked of them. A lone box has none."""

    shape: str
    links: tuple[FabricLink, ...]  # the first carries the sockets
    ports: tuple[tuple[str, int | None], ...]  # (twin, its QSFP port): which cables it needs
    mtu: int
    link_speed_mbps: int
    link_speed_low: Literal["refuse", "warn"]
    gid_index: int  # where NVIDIA's design puts the RoCE v2 IPv4 entry; NCCL finds it anywhere
    peers: tuple[Peer, ...]
    take_over_netplan: bool  # netplan files naming a twin moved aside, else the box refused
    # A ring's rendezvous and sockets go over the management network: its address checked.
    management: tuple[str, str] | None

    @property
    def ifnames(self) -> list[str]:
        """The twins' interface names, in the links' order."""
        return [link.ifname for link in self.links]


class Environment(Record):
    """The cluster environment file: its variables and the source of each fabric setting."""

    path: str
    variables: dict[str, str]
    notes: dict[str, str]


class ModelOnBox(Record):
    """A lane's weights on the box before its unit starts: found, fetched, or the box stops."""

    model: str
    image: str  # where huggingface_hub's `hf` runs: a vLLM image (a llama.cpp image has none)
    files: tuple[str, ...]
    token_path: str | None
    fetch: bool  # a unit fetches it in the background (fetch_weights); False: checked only
    endpoint: str  # the hub (hf_endpoint)
    source: str | None  # another box's blobs of it over the fabric (fleet_copy_weights)
    catalog_bytes: int  # the room its fetch needs where the hub does not answer its size


class OnDemand(Record):
    """A lane on demand as systemd runs it (docs/on-demand.md): a socket on the loopback port the
    front forwards to, whose first connection starts systemd-socket-proxyd, which requires the
    lane's unit (active once it serves) and exits after ``idle_s`` without a connection; the
    lane's unit, not enabled, stops once the proxy is gone (StopWhenUnneeded=)."""

    idle_s: int
    socket_port: int  # the lane's loopback_port, the front's target
    server_port: int  # where its server listens (spark/ports.py on_demand_server_port)
    # The box's on-demand lanes earlier in its list that do not fit beside this one: its unit
    # conflicts with them and is ordered after them, so one stops before the other starts.
    conflicts: tuple[str, ...]


class UnitTimeouts(Record):
    """How long a lane's unit waits: the whole start (TimeoutStartSec), the health wait inside
    it, and a cluster lane's wait for every Ray node (half the start: a box away longer fails
    the start, and the restart waits again)."""

    start_s: int
    health_s: int
    nodes_wait_s: int


class ServedLane(Record):
    """A lane as this box runs it, every line operations/lanes.py renders: the server's command
    line, the container's environment, the unit's timeouts and the canary's causes."""

    name: str
    engine: str
    model: str
    served_name: str
    image: str
    port: int  # the front's, which clients reach
    backend_port: int  # the front's target on 127.0.0.1 (an on-demand lane's socket)
    server_port: int  # the server's own, on 127.0.0.1: backend_port, or an on-demand lane's
    memory_fraction: float
    # The server's command line in the container; never a key (see key_variable).
    argv: tuple[str, ...]
    # The server's own variable the lane's key is read into from its mounted file as the
    # container starts; None: the container gets no key (api_key off, or a headless rank).
    key_variable: str | None
    model_at_start: ModelAtStart | None  # a model path the container's shell reads as it starts
    replaces_entrypoint: bool  # the image's entrypoint is the server: the shell replaces it
    model_mount: str | None  # the owner's model directory, mounted read-only where it is
    variables: dict[str, str]  # the container's environment file: names and paths, no secret
    timeouts: UnitTimeouts
    health_path: str  # the unit's start waits for it to answer
    canary_causes: tuple[str, ...] | None  # None: no answer canary (the lane's canary off)
    after: str | None  # the lane that starts before this one
    hf_token: bool  # mount the Hugging Face token (its path is in variables)
    on_ray: bool  # a cluster lane on Ray: its ranks run on every box's Ray node
    ray_address: str | None  # a cluster lane on Ray: the head's GCS
    ray_token: bool
    nnodes: int  # the boxes a cluster lane spans (1: its own box)
    rank: MpRank | None  # a cluster lane on vLLM's own multi-node mode: this box's rank
    peers: tuple[str, ...]  # the addresses this box's rank meets (mp)
    peer_boxes: tuple[str, ...]  # their boxes' names, in the same order
    fetch_unit: str | None  # its model's fetch, which it starts after (fetch_weights)
    on_demand: OnDemand | None = None  # None: resident, enabled and started by the deploy

    @property
    def headless(self) -> bool:
        """A rank of a cluster lane (executor mp) on a box other than the head: no API."""
        return self.rank is not None and self.rank.headless

    @property
    def title(self) -> str:
        if self.rank is not None and self.rank.headless:
            return f"rank {self.rank.node_rank} of {self.served_name}, headless"
        return f"{self.served_name} on port {self.port}"


class OwnLane(Record):
    """One of the box's own lanes: its weights, then its unit."""

    weights: ModelOnBox
    served: ServedLane


class FrontLane(Record):
    """A lane as the nginx front serves it."""

    name: str
    port: int
    backend_port: int
    key: bool  # a lane without a key is forwarded to anyone the allow-list admits
    timeout_s: int  # nginx's wait for the lane between two reads and two writes (answer_wait_s)


class RouterFront(Record):
    """The router's port on a router box's front: nginx asks the fleet key on every path and
    forwards to the router on 127.0.0.1; clients' and scrapers' networks admitted."""

    port: int
    backend_port: int
    allow_networks: tuple[str, ...]  # empty: any
    key_from: str | None  # the fleet key made on this box (None), or copied from this router box
    timeout_s: int  # nginx's wait for the router: all its tries of its longest route


class Front(Record):
    lanes: tuple[FrontLane, ...]
    allow_networks: tuple[str, ...]
    tls: tuple[str, str] | None  # certificate and key files on the controller
    router: RouterFront | None  # on a router box


class Share(Record):
    """One lane's part of the box's unified memory (a cluster lane's: its rank here)."""

    lane: str
    rank: bool  # the rank of the cluster lane served from the head
    fraction: float
    share_gib: float
    needs_gib: float  # weights, one sequence's KV cache and vLLM's overhead (spark/memory.py)
    on_demand_idle_s: int | None  # on demand: stopped after this many idle seconds; None resident


class Memory(Record):
    unified_gib: float
    shares: tuple[Share, ...]
    router_gib: float  # the fleet's router, where it runs on the box
    # On-demand lanes that do not fit together beside the rest: never up together.
    conflicts: tuple[tuple[str, str], ...]
    largest_on_demand: tuple[str, ...]  # the on-demand lanes that may be up at once, the most
    free_gib: float  # what the box leaves with every resident lane and that set loaded


class MemoryGuard(Record):
    """The guard stops the lowest priority lane below ``floor_gib`` of MemAvailable."""

    floor_gib: float
    lanes: tuple[tuple[str, int], ...]  # (unit's lane, priority) of every lane unit on the box


class Firewall(Record):
    """The cluster's ports accept connections only on the fabric, from its subnets."""

    fabric: dict[str, str]  # twin -> its subnet
    ports: tuple[tuple[int, int], ...]  # Ray's (the back-end's and the ephemeral range are added)
    open_ports: tuple[int, ...]  # SSH's and the lanes': never closed


class RayNode(Record):
    role: Literal["head", "worker"]
    node_ip: str
    head: str  # the head's name: a worker whose head stopped waits for it
    head_ip: str
    image: str
    environment: dict[str, str]
    env_file: str
    port: int
    auth: bool
    models: tuple[tuple[str, str], ...]  # (on the box, in the container): the rank's weights


class NcclRun(Record):
    """One rank of the fabric's NCCL test; every box runs one at once."""

    rank: int
    world: int
    image: str
    env_names: tuple[str, ...]
    env_file: str
    hcas: tuple[str, ...]
    min_busbw_gbs: float
    max_bytes: int
    boxes: tuple[str, ...]
    # The cluster lane's model where fetch units bring it: the test runs once every box has it.
    waits_for: str | None


class ClusterLane(Record):
    """The cluster lane's part on this box: its weights here (a fetch unit's, from the head over
    the fabric on a worker), the image every box agrees on, and this box's unit (the head's on
    Ray; every box's rank on mp)."""

    name: str
    weights: ModelOnBox
    image: str
    served: ServedLane | None  # None: a worker on Ray, whose Ray node holds the rank


class Cluster(Record):
    """What this box does with the other boxes. Every operation here needs them."""

    members: tuple[str, ...]
    executor: Literal["ray", "mp"] | None  # the cluster lane's; None without one
    firewall: Firewall | None  # None where no address reaches every box (a ring)
    ray: RayNode | None  # None on mp, or where Ray cannot run (a ring)
    ray_removed: bool  # a cluster lane on mp: no Ray node left behind
    nccl_image: str | None  # pulled here for the test where Ray does not pull it (a ring)
    nccl_test: NcclRun | None
    lane: ClusterLane | None


class MetricsLane(Record):
    """A lane unit on the box as the collector watches it (no backend port: a headless rank)."""

    name: str
    engine: str
    served_name: str
    image: str
    port: int
    backend_port: int | None  # where its server answers /health (an on-demand lane's own port)
    on_demand: bool = False  # inactive while idle, by design


class MetricsTwin(Record):
    ifname: str
    hca: str
    address: str


class Expected(Record):
    """What the collector compares the box with (files/spark_metrics.py reads it as JSON)."""

    floor_gib: float
    mtu: int
    rate_mbps: int
    rate_low: Literal["refuse", "warn"]  # a slower twin: red, or a warning (spark/twin.py)
    gid_index: int
    driver_branch: int
    gpu_clock_lock: GpuClockLock | None
    twins: tuple[MetricsTwin, ...]
    lanes: tuple[MetricsLane, ...]
    nccl: bool
    nccl_verdict: str


class ScrapedLane(Record):
    """A lane's own /metrics (vLLM's; llama-server's with --metrics) as the metrics endpoint
    serves it on ``path``, from the lane's server on loopback, with the lane's key where it has
    one (llama-server asks it on every path but its health; vLLM's key guards /v1 alone)."""

    name: str
    path: str
    backend_port: int
    key: bool


class Metrics(Record):
    """The box's metrics endpoint: the node exporter on loopback, nginx asking the metrics key
    on ``port``, the collector every ``interval_s`` against ``expected``, and each lane's own
    metrics behind the same key."""

    port: int
    exporter_port: int
    interval_s: int
    allow_networks: tuple[str, ...]
    tls: bool  # the front's certificate, where it has one
    expected: Expected
    lanes: tuple[ScrapedLane, ...]


class Backend(Record):
    """A lane as the router reaches it: through its box's front, with the lane's own key."""

    box: str
    address: str  # where clients reach the box
    port: int  # the lane's port on the front
    lane: str
    key: bool  # the router sends the lane's key
    tls: bool  # the front speaks HTTPS (front_tls_certificate_file)
    on_demand: bool  # started by a request, stopped when idle
    # The router's environment variable holding the lane's key (spark/router.py); None: no key.
    key_variable: str | None
    timeout_s: int  # the router's wait for the lane between two reads (answer_wait_s)

    @property
    def url(self) -> str:
        """The lane's OpenAI base URL, through its box's front."""
        return f"{'https' if self.tls else 'http'}://{self.address}:{self.port}/v1"


class Route(Record):
    """A served name and every lane serving it: more than one are its replicas."""

    served_name: str
    backends: tuple[Backend, ...]


class RouterBox(Record):
    name: str
    address: str  # where clients reach the router


class FleetEndpoint(Record):
    """The fleet as one endpoint (spark/fleet.py): the router on its box (then the failover's),
    asking the fleet key, and the route table it serves from."""

    boxes: tuple[RouterBox, ...]
    port: int  # on the box's front
    loopback_port: int  # the router's own, on 127.0.0.1
    key_path: str  # the fleet key on each router box (root 0600)
    health_interval_s: int
    memory_gib: float
    routes: tuple[Route, ...]
    # How each router box runs it (spark/router.py): LiteLLM's pinned set, installed into its
    # virtualenv by pip_command (from pip_index; None: pip's own default), the unit's command,
    # LiteLLM's configuration (litellm.yaml) and the environment variable of the fleet key.
    pip_index: str | None
    requirements: tuple[str, ...]
    pip_command: tuple[str, ...]
    unit_command: tuple[str, ...]
    config: dict
    fleet_key_variable: str
    # The router's trust of the TLS fronts: each TLS front's authority (front_tls_ca_file), else
    # its certificate file, on this machine, once each in the inventory's order; and the bundle
    # of them on each router box (its litellm_settings.ssl_verify). None: no front speaks TLS.
    ca_files: tuple[str, ...]
    ca_bundle: str | None


class BoxPlan(Record):
    """Everything the deploy does to one box, in the order of its stages."""

    name: str
    role: Literal["head", "worker"]
    address: str  # where clients reach the box: where pyinfra connects
    # Its own server among the inventory's boxes (fabric_topology independent): planned as an
    # inventory of this box alone, so no fabric and no cluster.
    independent: bool
    # Host layer
    kernel: Kernel
    driver: Driver
    gpu_clock_lock: GpuClockLock | None  # None: no lock, no unit
    toolkit: Toolkit
    # Fabric
    fabric: Fabric | None
    environment: Environment
    # Lanes and front
    memory: Memory
    memory_guard: MemoryGuard
    hf_token_file: str | None  # on the controller
    lane_units: tuple[str, ...]  # every lane unit the box keeps (others are removed)
    images: tuple[str, ...]
    lanes: tuple[OwnLane, ...]
    weights_share: str | None  # its fabric address, where the boxes copying a model reach it
    models_in_use: tuple[str, ...]  # never removed, never offered for removal
    prune_unused: bool  # remove the cached models and images no lane uses
    front: Front
    # Cluster
    cluster: Cluster | None
    # Watching it between deploys
    metrics: Metrics | None


class Plan(Record):
    """Every box's plan, in the inventory's order."""

    boxes: tuple[BoxPlan, ...]
    fleet: FleetEndpoint
    warnings: tuple[str, ...]

    def box(self, name: str) -> BoxPlan:
        return next(box for box in self.boxes if box.name == name)


def peers(me: HostConfig, hosts: tuple[HostConfig, ...]) -> tuple[Peer, ...]:
    """Every other box's address on the subnet of each of this box's twins: the same twin on a
    pair or a switch, the twin at the cable's other end on a ring (its port 1 meets port 0)."""
    return tuple(
        Peer(ifname=link.ifname, box=other.name, address=str(theirs.address.ip))
        for link in me.fabric
        for other in hosts
        if other.name != me.name
        for theirs in other.fabric
        if theirs.address.network == link.address.network
    )


def fabric(me: HostConfig, spark: SparkConfig) -> Fabric | None:
    if not me.fabric:
        return None
    cluster = len(spark.hosts) > 1
    management = None
    if cluster and me.shape.neighbours_only and me.management_address is not None:
        management = (me.management_ifname, str(me.management_address))
    return Fabric(
        shape=me.topology,
        links=me.fabric,
        ports=tuple((link.ifname, link.port) for link in me.fabric),
        mtu=me.mtu,
        link_speed_mbps=me.link_speed_mbps,
        link_speed_low=me.link_speed_low,
        gid_index=me.gid_index,
        peers=peers(me, spark.hosts),
        take_over_netplan=me.take_over_netplan,
        management=management,
    )


def kernel(me: HostConfig) -> Kernel:
    """Kexec handover off where the fabric's RDMA runs: through GRUB where
    fabric_kernel_kho_off, else the box refused with the fix; the kernel held where
    kernel_hold."""
    fix = None
    if me.fabric:
        fix = "grub" if me.kernel_kho_off else "refuse"
    return Kernel(
        kho_fix=fix,
        kho_default_from=kernel_rules.KHO_DEFAULT_FROM,
        boot_option=kernel_rules.KHO_OFF,
        grub_dropin=kernel_rules.GRUB_DROPIN,
        hold=kernel_rules.KERNEL_METAPACKAGES if me.kernel_hold else (),
    )


def gpu_clock_lock(me: HostConfig) -> GpuClockLock | None:
    """The unit's `nvidia-smi -lgc min,max` where the box locks its GPU clock."""
    if me.gpu_clock_lock_mhz is None:
        return None
    low, high = me.gpu_clock_lock_mhz
    return GpuClockLock(
        unit=GPU_CLOCK_UNIT, command=f"{NVIDIA_SMI} -lgc {low},{high}", min_mhz=low, max_mhz=high
    )


def head_address(spark: SparkConfig) -> str:
    """The head's first twin: Ray's GCS, vLLM's --master-addr, where the workers copy a cluster
    lane's model from (a shape where one address reaches every box: spark/topology.py)."""
    return str(spark.head.fabric[0].address.ip)


def hf_image(me: HostConfig) -> str:
    """Where huggingface_hub's `hf` fetches a lane's weights: an image of the box's lanes that
    holds it (a vLLM one), else Ray's (group_data's NGC image); a llama.cpp image has none."""
    images = (lane.image for lane in me.lanes if lane.engine_record.holds_hf_cli)
    return next(images, me.ray.image)


def images(me: HostConfig) -> tuple[str, ...]:
    """The serving images the box's own lanes need (their fetches run on the host's python3,
    files/spark_fetch.py: no image of their own)."""
    return tuple(dict.fromkeys(lane.image for lane in me.lanes))


def models_in_use(me: HostConfig, spark: SparkConfig) -> tuple[str, ...]:
    """The Hugging Face models the box's lanes load from its cache: its own and the cluster
    lane's (each box of the cluster loads its share from its own copy: issue 14)."""
    cluster = spark.cluster_lane if not me.shape.independent else None
    lanes = (*me.lanes, *([cluster] if cluster else []))
    return tuple(dict.fromkeys(lane.model for lane in lanes if not lane.model.startswith("/")))


def fetching(spark: SparkConfig, model: str) -> list[HostConfig]:
    """The boxes whose fetch units bring ``model``: those whose own lanes load it, and every box
    of the cluster for the cluster lane's (each rank loads its share from its own disk: issue
    14), the head first (it fetches from the hub for the others); else in the inventory's
    order."""
    cluster = spark.cluster_lane
    if cluster is not None and cluster.model == model:
        return [box for box in spark.ranks if fetched_in_background(box, cluster)]
    return [
        box
        for box in spark.hosts
        if any(lane.model == model and fetched_in_background(box, lane) for lane in box.lanes)
    ]


def seeder(me: HostConfig, spark: SparkConfig, model: str) -> HostConfig | None:
    """The box that fetches ``model`` from the hub for the others (fleet_copy_weights): the
    first of ``fetching``, where another fetches it too and one fabric address reaches every
    box; None where each box fetches its own."""
    serving = fetching(spark, model)
    reachable = me.shape.one_address_for_all and all(box.fabric for box in serving)
    if not me.fleet_copy_weights or len(serving) < 2 or not reachable:
        return None
    return serving[0]


def blobs_url(box: HostConfig, model: str) -> str:
    """Where ``box`` serves its cache's blobs of ``model`` over the fabric (its first twin)."""
    return (
        f"http://{box.fabric[0].address.ip}:{WEIGHTS_PORT}/models--{model.replace('/', '--')}/blobs"
    )


def weights_share(me: HostConfig, spark: SparkConfig) -> str | None:
    """This box's first fabric address, where it serves its cache to the boxes that copy a model
    from it (it seeds one); None where it seeds none."""
    seeds = any(
        (first := seeder(me, spark, model)) is not None and first.name == me.name
        for model in models_in_use(me, spark)
    )
    return str(me.fabric[0].address.ip) if seeds else None


def weights(me: HostConfig, lane: Lane, spark: SparkConfig) -> ModelOnBox:
    background = fetched_in_background(me, lane)
    first = seeder(me, spark, lane.model) if background else None
    return ModelOnBox(
        model=lane.model,
        image=lane.image if lane.engine_record.holds_hf_cli else hf_image(me),
        files=lane.weight_files,
        token_path=HF_TOKEN if me.hf_token_file else None,
        fetch=background,
        endpoint=me.hf_endpoint,
        source=blobs_url(first, lane.model) if first and first.name != me.name else None,
        catalog_bytes=catalog_bytes(lane),
    )


def catalog_bytes(lane: Lane) -> int:
    """The bytes of the lane's weights by the catalog (weights_gib, GiB: spark/catalog.py), the
    room a fetch is checked against where the hub does not answer; 0 for a model it lacks."""
    spec = lane.spec
    return int(spec.weights_gib * 2**30) if spec else 0


def fetched_in_background(me: HostConfig, lane: Lane) -> bool:
    """A lane the box loads (its own, or its rank of the cluster lane) whose model, missing, a
    unit fetches while the deploy goes on (fetch_weights; a directory of the owner's is never
    fetched)."""
    return me.fetch_weights and not lane.model.startswith("/")


def served(
    me: HostConfig,
    spark: SparkConfig,
    lane: Lane,
    after: str | None,
    rank: MpRank | None = None,
    conflicts: tuple[tuple[str, str], ...] = (),
) -> ServedLane:
    on_ray = lane.cluster_executor == "ray"
    head_ip = head_address(spark) if lane.is_cluster else ""
    others = spark.ranks[1:] if me.role == "head" else (spark.head,)
    return served_lane(
        lane,
        environment=me.cluster_environment(spark.head),
        after=after,
        hf_token=bool(me.hf_token_file),
        start_timeout_s=me.lane_start_timeout_min * 60,
        ray_address=f"{head_ip}:{me.ray.port}" if on_ray else None,
        ray_token=on_ray and me.ray.auth,
        rank=rank,
        peers=tuple(str(box.fabric[0].address.ip) for box in others) if rank else (),
        peer_boxes=tuple(box.name for box in others) if rank else (),
        fetch_unit=fetch_unit(lane.model) if fetched_in_background(me, lane) else None,
        on_demand=on_demand(lane, conflicts),
    )


def on_demand(lane: Lane, conflicts: tuple[tuple[str, str], ...]) -> OnDemand | None:
    """How systemd runs a lane on demand, ``conflicts`` being its box's (Memory.conflicts: pairs
    in the box's order); None for a resident lane."""
    if lane.on_demand_idle_s is None:
        return None
    return OnDemand(
        idle_s=lane.on_demand_idle_s,
        socket_port=lane.backend_port,
        server_port=lane.server_port,
        conflicts=tuple(first for first, second in conflicts if second == lane.name),
    )


def served_lane(
    lane: Lane,
    *,
    environment: dict[str, str],
    after: str | None = None,
    hf_token: bool = False,
    start_timeout_s: int,
    ray_address: str | None = None,
    ray_token: bool = False,
    rank: MpRank | None = None,
    peers: tuple[str, ...] = (),
    peer_boxes: tuple[str, ...] = (),
    fetch_unit: str | None = None,
    on_demand: OnDemand | None = None,
) -> ServedLane:
    """The lane's unit on a box, every value rendered: ``environment`` the cluster's (the
    lane's own and its engine's are added), ``start_timeout_s`` the whole start's."""
    engine = lane.engine_record
    headless = rank is not None and rank.headless
    on_ray = lane.cluster_executor == "ray"
    # The weights are on the box before a lane starts (preflight.model_present): a lane never
    # downloads inside its start window (huggingface_hub's HF_HUB_OFFLINE: cached files only);
    # a lane's own environment may still say otherwise.
    variables = {"HF_HUB_OFFLINE": "1"} | environment | lane.container_env()
    if on_ray and not ray_address:
        raise ValueError(f"lane {lane.name}: a cluster lane needs ray_address (host:port)")
    if on_ray:
        variables["RAY_ADDRESS"] = ray_address
        if ray_token:  # Ray's token authentication (operations/ray.py mounts the token)
            variables |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": RAY_TOKEN_IN_CONTAINER}
    if hf_token:  # the path only: huggingface_hub reads the token from there
        variables["HF_TOKEN_PATH"] = HF_TOKEN_IN_CONTAINER
    return ServedLane(
        name=lane.name,
        engine=lane.engine,
        model=lane.model,
        served_name=lane.served_name,
        image=lane.image,
        port=lane.port,
        backend_port=lane.backend_port,
        server_port=lane.server_port,
        memory_fraction=lane.memory_fraction,
        argv=tuple(lane.argv(rank)),
        key_variable=engine.key_variable if lane.api_key and not headless else None,
        model_at_start=engine.model_at_start(lane),
        replaces_entrypoint=engine.replaces_entrypoint,
        model_mount=lane.model if lane.model.startswith("/") else None,
        variables=variables,
        timeouts=UnitTimeouts(
            start_s=start_timeout_s,
            health_s=max(start_timeout_s - 30, 30),
            nodes_wait_s=max(start_timeout_s // 2, 30),
        ),
        health_path=engine.health_path,
        canary_causes=tuple(engine.canary_causes(lane)) if lane.canary else None,
        after=after,
        hf_token=hf_token,
        on_ray=on_ray,
        ray_address=ray_address,
        ray_token=ray_token,
        nnodes=lane.tensor_parallel_size,
        rank=rank,
        peers=peers,
        peer_boxes=peer_boxes,
        fetch_unit=fetch_unit,
        on_demand=on_demand,
    )


def own_lanes(
    me: HostConfig, spark: SparkConfig, conflicts: tuple[tuple[str, str], ...]
) -> tuple[OwnLane, ...]:
    """The box's own lanes in start order, each after the one before it (one loads at a time:
    simultaneous starts contend, seed 003); ``conflicts``: its on-demand lanes never up
    together (Memory.conflicts)."""
    result, after = [], None
    for lane in me.lanes:
        if lane.is_cluster:
            continue
        served_lane = served(me, spark, lane, after, conflicts=conflicts)
        result.append(OwnLane(weights=weights(me, lane, spark), served=served_lane))
        after = lane.name
    return tuple(result)


# How long a request may wait for a resident lane between two reads of its answer: a long
# prompt's prefill before the first token, a long generation. nginx's default, 60 s, is too short
# (ngx_http_proxy_module: proxy_read_timeout); LiteLLM's own, 6000 s, is longer than the front
# in front of the lane waits (litellm/constants.py DEFAULT_REQUEST_TIMEOUT_SECONDS).
ANSWER_WAIT_S = 3600


def answer_wait_s(lane: Lane, start_timeout_s: int) -> int:
    """How long the front and the router wait for ``lane`` between two reads of an answer. An
    on-demand lane's first request waits for the lane's load too, which its unit bounds by
    ``start_timeout_s`` (TimeoutStartSec=): the connection waits in the socket's queue until the
    lane serves (docs/on-demand.md), and no byte of the answer comes before."""
    return ANSWER_WAIT_S + (start_timeout_s if lane.on_demand_idle_s is not None else 0)


def front(me: HostConfig, router: fleet.Router, router_timeout_s: int) -> Front:
    """Clients reach every lane of the box, the cluster lane's too, through nginx, which asks
    the lane's key on every path; the servers listen on loopback only. On a router box the
    router's port too, admitting the clients' networks and the scrapers' (its /metrics/),
    waiting ``router_timeout_s`` for the router (router.front_timeout_s of its longest route)."""
    allow = me.front_allow_networks
    if allow and me.metrics_allow_networks:
        allow = tuple(dict.fromkeys((*allow, *me.metrics_allow_networks)))
    return Front(
        lanes=tuple(
            FrontLane(
                name=lane.name,
                port=lane.port,
                backend_port=lane.backend_port,
                key=lane.api_key,
                timeout_s=answer_wait_s(lane, me.lane_start_timeout_min * 60),
            )
            for lane in me.lanes
        ),
        allow_networks=me.front_allow_networks,
        tls=me.front_tls,
        router=(
            RouterFront(
                port=router.port,
                backend_port=router.loopback_port,
                allow_networks=allow,
                key_from=None if me.name == router.boxes[0] else router.boxes[0],
                timeout_s=router_timeout_s,
            )
            if me.name in router.boxes
            else None
        ),
    )


def nccl_test(me: HostConfig, spark: SparkConfig, image: str) -> NcclRun | None:
    if me.nccl_test is None:
        return None
    return NcclRun(
        rank=spark.node_rank(me.name),
        world=len(spark.hosts),
        image=image,
        env_names=tuple(sorted(me.cluster_environment(spark.head))),
        env_file=me.env_file,
        hcas=tuple(link.hca for link in me.fabric),
        min_busbw_gbs=me.nccl_test.min_busbw_gbs,
        max_bytes=me.nccl_test.max_bytes,
        boxes=tuple(box.name for box in spark.hosts),
        waits_for=nccl_waits_for(me, spark),
    )


def nccl_waits_for(me: HostConfig, spark: SparkConfig) -> str | None:
    """The cluster lane's model where fetch units bring it: while a box lacks it the lane the
    test proves cannot start, and its copy over the fabric shares the links the test measures;
    the test waits for it (a later deploy runs it). None: nothing to wait for."""
    lane = spark.cluster_lane
    return lane.model if lane is not None and fetched_in_background(me, lane) else None


def cluster_lane(me: HostConfig, spark: SparkConfig, after: str | None) -> ClusterLane | None:
    lane = spark.cluster_lane
    if lane is None:
        return None
    address = head_address(spark)
    if lane.cluster_executor == "mp":
        unit = served(me, spark, lane, after, MpRank(spark.node_rank(me.name), address))
    else:  # on Ray: the head's unit only; every box's Ray node holds a rank
        unit = served(me, spark, lane, after) if me.role == "head" else None
    return ClusterLane(
        name=lane.name,
        weights=weights(me, lane, spark),
        image=lane.image,
        served=unit,
    )


def cluster(
    me: HostConfig, spark: SparkConfig, after: str | None, router_port: int | None = None
) -> Cluster | None:
    """A box among several: the firewall and Ray where one address reaches every box, the
    NCCL test, the cluster lane. Everything here waits for the other boxes."""
    if len(spark.hosts) < 2:
        return None
    lane = spark.cluster_lane
    executor = lane.cluster_executor if lane else None
    reachable = me.shape.one_address_for_all
    head_ip = head_address(spark)
    environment = me.cluster_environment(spark.head)
    firewall = None
    ray = None
    if reachable:
        firewall = Firewall(
            fabric={link.ifname: str(link.address.network) for link in me.fabric},
            ports=tuple(listen_ports(me.ray.port)),
            open_ports=(
                me.ssh_port,
                *(own.port for own in me.lanes),
                *([router_port] if router_port is not None else []),
            ),
        )
    if reachable and executor != "mp":
        # Where the cluster lane's workers on this box read its weights.
        models = ((MODELS_DIR, HF_CACHE_IN_CONTAINER),)
        if lane and lane.model.startswith("/"):
            models += ((lane.model, lane.model),)
        ray = RayNode(
            role=me.role,
            node_ip=str(me.fabric[0].address.ip),
            head=spark.head.name,
            head_ip=head_ip,
            image=me.ray.image,
            environment=environment,
            env_file=me.env_file,
            port=me.ray.port,
            auth=me.ray.auth,
            models=models,
        )
    # The test runs in the cluster lane's image before the lane starts (it proves the fabric
    # the lane uses), else in Ray's: pulled by the Ray node, or here where there is none.
    test_image = lane.image if lane else me.ray.image
    return Cluster(
        members=tuple(box.name for box in spark.hosts),
        executor=executor,
        firewall=firewall,
        ray=ray,
        ray_removed=reachable and executor == "mp",
        nccl_image=None if (ray or lane) else me.ray.image,
        nccl_test=nccl_test(me, spark, test_image),
        lane=cluster_lane(me, spark, after),
    )


def memory(me: HostConfig, spark: SparkConfig, router_gib: float) -> Memory:
    """The box's shares, the router's where it runs here (``router_gib``), and its on-demand
    lanes: which conflict, which may be up at once."""
    budget = box_budget(me, spark.cluster_lane, router_gib)
    return Memory(
        unified_gib=budget.unified_memory_gib,
        shares=tuple(
            Share(
                lane=share.lane.name,
                rank=share.rank,
                fraction=share.lane.memory_fraction,
                share_gib=round(share.estimate.share_gib, 2),
                needs_gib=round(share.estimate.total_gib, 2),
                on_demand_idle_s=share.lane.on_demand_idle_s if share.on_demand else None,
            )
            for share in budget.shares
        ),
        router_gib=router_gib,
        conflicts=budget.conflicts,
        largest_on_demand=tuple(share.lane.name for share in budget.largest_set),
        free_gib=round(budget.free_gib, 2),
    )


def metrics(me: HostConfig, spark: SparkConfig) -> Metrics | None:
    """The collector's expected values are the plan's own: the fabric's MTU, rate and GID index,
    the driver branch, the GPU clock's lock, the guard's floor, every lane unit the box keeps (a
    cluster lane's rank too; a headless one answers no /health), and the NCCL test where it
    runs."""
    if not me.metrics:
        return None
    units, scraped = [], []
    for lane in spark.units(me.name):
        headless = lane.is_cluster and lane.cluster_executor == "mp" and me.role != "head"
        if not headless:
            scraped.append(scraped_lane(lane))
        units.append(
            MetricsLane(
                name=lane.name,
                engine=lane.engine,
                served_name=lane.served_name,
                image=lane.image,
                port=lane.port,
                backend_port=None if headless else lane.server_port,
                on_demand=lane.on_demand_idle_s is not None,
            )
        )
    return Metrics(
        port=me.metrics_port,
        exporter_port=metrics_exporter_port(me.metrics_port),
        interval_s=me.metrics_interval_s,
        allow_networks=me.metrics_allow_networks,
        tls=me.front_tls is not None,
        expected=Expected(
            floor_gib=me.memory_guard_min_available_gib,
            mtu=me.mtu,
            rate_mbps=me.link_speed_mbps,
            rate_low=me.link_speed_low,
            gid_index=me.gid_index,
            driver_branch=me.driver.branch,
            gpu_clock_lock=gpu_clock_lock(me),
            twins=tuple(
                MetricsTwin(ifname=link.ifname, hca=link.hca, address=str(link.address.ip))
                for link in me.fabric
            ),
            lanes=tuple(units),
            nccl=len(spark.hosts) > 1 and me.nccl_test is not None,
            nccl_verdict=NCCL_VERDICT,
        ),
        lanes=tuple(scraped),
    )


def lane_metrics_path(lane: str) -> str:
    """Where the metrics endpoint serves a lane's own /metrics (a lane's name is a slug)."""
    return f"/lanes/{lane}/metrics"


def scraped_lane(lane: Lane) -> ScrapedLane:
    """A lane unit with a server on the box (a headless rank serves nothing)."""
    return ScrapedLane(
        name=lane.name,
        path=lane_metrics_path(lane.name),
        backend_port=lane.server_port,  # never an on-demand lane's socket: a scrape wakes it
        key=lane.api_key,
    )


def fleet_endpoint(spark: SparkConfig) -> FleetEndpoint:
    """The router of the whole inventory (independent boxes' too) and its route table: every
    served name of every box, its replicas together, in the inventory's order; each keyed lane's
    key in its own variable of the router's environment, numbered in that order."""
    router = fleet.router(spark.hosts)
    keyed = [
        (box.name, lane.name)
        for lanes in fleet.served(spark.hosts).values()
        for box, lane in lanes
        if lane.api_key
    ]
    routes = tuple(
        Route(
            served_name=name,
            backends=tuple(
                Backend(
                    box=box.name,
                    address=box.address,
                    port=lane.port,
                    lane=lane.name,
                    key=lane.api_key,
                    tls=box.front_tls is not None,
                    on_demand=lane.on_demand_idle_s is not None,
                    key_variable=(
                        litellm.key_variable(keyed.index((box.name, lane.name)) + 1)
                        if lane.api_key
                        else None
                    ),
                    timeout_s=answer_wait_s(lane, box.lane_start_timeout_min * 60),
                )
                for box, lane in lanes
            ),
        )
        for name, lanes in fleet.served(spark.hosts).items()
    )
    ca_files = tuple(
        dict.fromkeys(box.front_tls_ca or box.front_tls[0] for box in fleet.tls_fronts(spark.hosts))
    )
    ca_bundle = litellm.CA_BUNDLE if ca_files else None
    deployments = [
        litellm.Deployment(
            route.served_name,
            backend.url,
            backend.key_variable,
            backend.on_demand,
            backend.timeout_s,
        )
        for route in routes
        for backend in route.backends
    ]
    return FleetEndpoint(
        boxes=tuple(RouterBox(name=box, address=spark.host(box).address) for box in router.boxes),
        port=router.port,
        loopback_port=router.loopback_port,
        key_path=FLEET_KEY,
        health_interval_s=router.health_interval_s,
        memory_gib=router.memory_gib,
        routes=routes,
        pip_index=router.pip_index,
        requirements=litellm.requirements(),
        pip_command=litellm.pip_command(router.pip_index),
        unit_command=litellm.server_command(router.loopback_port),
        config=litellm.litellm_config(deployments, router.health_interval_s, ca_bundle),
        fleet_key_variable=litellm.FLEET_KEY_VARIABLE,
        ca_files=ca_files,
        ca_bundle=ca_bundle,
    )


def box_plan(
    me: HostConfig, spark: SparkConfig, router: fleet.Router, router_timeout_s: int
) -> BoxPlan:
    """``router_timeout_s``: the router's front's wait for the router (plan)."""
    shares = memory(me, spark, router.memory_gib_on(me.name))
    lanes = own_lanes(me, spark, shares.conflicts)
    units = spark.units(me.name)
    return BoxPlan(
        name=me.name,
        role=me.role,
        address=me.address,
        kernel=kernel(me),
        independent=me.shape.independent,
        driver=me.driver,
        gpu_clock_lock=gpu_clock_lock(me),
        toolkit=me.toolkit,
        fabric=fabric(me, spark),
        environment=Environment(
            path=me.env_file,
            variables=me.cluster_environment(spark.head),
            notes=me.environment_notes(),
        ),
        memory=shares,
        memory_guard=MemoryGuard(
            floor_gib=me.memory_guard_min_available_gib,
            lanes=tuple((lane.name, lane.priority or 0) for lane in units),
        ),
        hf_token_file=me.hf_token_file,
        lane_units=tuple(lane.name for lane in units),
        images=images(me),
        lanes=lanes,
        weights_share=weights_share(me, spark),
        models_in_use=models_in_use(me, spark),
        prune_unused=me.prune_unused,
        front=front(me, router, router_timeout_s),
        cluster=cluster(
            me,
            spark,
            lanes[-1].served.name if lanes else None,
            router.port if me.name in router.boxes else None,
        ),
        metrics=metrics(me, spark),
    )


def plan(spark: SparkConfig) -> Plan:
    """Every box's plan, an independent box's as if the inventory held it alone; the fleet's
    endpoint over them all."""
    router = fleet.router(spark.hosts)
    endpoint = fleet_endpoint(spark)
    # Over every box's lanes, an independent box's router too: the router's front waits for
    # every try LiteLLM may make of the longest route.
    router_timeout_s = litellm.front_timeout_s(
        max(
            (backend.timeout_s for route in endpoint.routes for backend in route.backends),
            default=ANSWER_WAIT_S,
        )
    )
    return Plan(
        boxes=tuple(
            box_plan(
                me,
                spark.alone(me.name) if spark.independent else spark,
                router,
                router_timeout_s,
            )
            for me in spark.hosts
        ),
        fleet=endpoint,
        warnings=spark.warnings,
    )

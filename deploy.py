"""Turn a freshly imaged DGX Spark (or several) into an LLM server host.

    pyinfra inventories/lab.py deploy.py [--dry] [--limit HOST]

The order matters: what an interrupted run left dpkg in the middle of is finished first (apt
installs nothing until it is); then the driver check, so that a box on the wrong branch is
refused before anything else changes; the fabric comes up before its GID entries and its peers
are checked; docker is restarted whenever the running daemon lacks the nvidia runtime. Then this
box's own lanes: the memory guard first, so it watches while they load, then each lane once the
one before it serves. The cluster (Ray, its firewall, the cluster lane) comes last: it needs
every box, and stops when one is missing, after each box has done what it can alone.

Every box's data is validated before anything else (operations/config.py): a bad value stops
the run, naming the box and the key, before any operation or fact reaches a box.
"""

# ruff: noqa: E402 - the check below must run before this collection's own modules are imported
from pathlib import Path

from pyinfra import host, inventory, logger, state
from pyinfra.api.exceptions import PyinfraError

# pyinfra reads config.py and group_data/ from the directory it starts in, and imports this
# collection's modules from there: started anywhere else, the deploy would run on defaults
# nobody checked, so it refuses.
COLLECTION = Path(__file__).resolve().parent
if Path.cwd().resolve() != COLLECTION:
    raise PyinfraError(
        f"start pyinfra in {COLLECTION} (cd there, or add --chdir {COLLECTION}): it reads"
        " config.py and group_data/ from the directory it starts in, and without them the"
        " deploy would run on defaults nobody checked"
    )

import endpoints
from operations import (
    debpkg,
    driver,
    environment,
    firewall,
    front,
    hygiene,
    lanes,
    memguard,
    nccl,
    nmcli,
    preflight,
    ray,
    roce,
    toolkit,
    weights,
)
from spark.lanes import Lane, MpRank
from spark.ports import listen_ports
from stages import runmode, settings

spark = settings.load(inventory)  # validated once for the whole inventory, then cached
runmode.check(state)  # --serial, --no-wait, a small --parallel: refused for several boxes
me = spark.host(host.name)
# A cluster lane (on the head) runs a rank on every box: on vLLM's own multi-node mode
# (executor mp) each box has a unit for it; on Ray the box's Ray node holds it.
cluster_lane = spark.cluster_lane
on_mp = cluster_lane is not None and cluster_lane.cluster_executor == "mp"

debpkg.completed(name="dpkg: nothing left half installed")
driver.branch_held(
    name=f"Driver branch {me.driver.branch}: installed, held, apt pinned",
    branch=me.driver.branch,
    package=me.driver.package,
)
driver.running(name=f"nvidia-smi reports a {me.driver.branch} driver", branch=me.driver.branch)

preflight.fabric_ports_cabled(
    name=f"Fabric ports of {me.topology} cabled: every twin there",
    twins=[(link.ifname, link.port) for link in me.fabric],
)
for link in me.fabric:
    nmcli.ethernet(
        name=f"Fabric {link.ifname}: static IPv4, MTU {me.mtu}",
        con_name=f"fabric-{link.ifname}",
        ifname=link.ifname,
        address=str(link.address),
        mtu=me.mtu,
    )
# After the profiles: a twin NetworkManager just brought up may report its rate only now.
preflight.link_speeds(
    name=f"Fabric twins link at {me.link_speed_mbps} Mb/s",
    ifnames=[link.ifname for link in me.fabric],
    expected_mbps=me.link_speed_mbps,
    low=me.link_speed_low,
)
for link in me.fabric:
    roce.roce_v2_entry(
        name=f"RoCE v2 IPv4 GID of {link.hca} (NCCL selects it; expected at {me.gid_index})",
        ifname=link.ifname,
        address=str(link.address),
        expected_index=me.gid_index,
    )
preflight.fabric_peers(
    name=f"Fabric twins reach the other boxes' twins ({me.mtu}-byte frames)",
    peers=preflight.peers_of(me, spark.hosts),
    mtu=me.mtu,
)

environment.cluster_env(
    name=f"Cluster environment in {me.env_file}",
    variables=me.cluster_environment(spark.head),
    notes=me.environment_notes(),
    path=me.env_file,
)

toolkit.repository(
    name="NVIDIA container toolkit apt repository",
    url=me.toolkit.repo_url,
    key_url=me.toolkit.key_url,
)
toolkit.installed(name=f"NVIDIA container toolkit {me.toolkit.version}", version=me.toolkit.version)
toolkit.docker_runtime(name="docker's nvidia runtime (nvidia-ctk), in the running daemon")

hygiene.logind_keep_ipc(name="logind keeps IPC of logged-out users (RemoveIPC=no)")
hygiene.sshd_oom_protected(name="sshd's listener out of the OOM killer's reach (-1000)")

# --- this box's lanes: vLLM servers under systemd --------------------------------------------

memguard.memory_guard(
    name=f"Memory guard: a lane stopped below {me.memory_guard_min_available_gib:g} GiB available",
    lanes=[(lane.name, lane.priority) for lane in spark.units(me.name)],
    min_available_gib=me.memory_guard_min_available_gib,
)
if me.hf_token_file:
    lanes.hf_token(name="Hugging Face token (root 0600)", src=me.hf_token_file)
lanes.lanes_removed(
    name="Lanes no longer configured: removed", keep=[lane.name for lane in spark.units(me.name)]
)
# huggingface_hub's `hf` fetches a lane's weights in the lane's image; a llama.cpp image has
# none, so a GGUF is fetched in a vLLM image of this box's lanes, else Ray's (group_data's NGC).
hf_image = next((lane.image for lane in me.lanes if lane.engine == "vllm"), me.ray.image)
needs_hf_image = me.fetch_weights and any(lane.engine == "llama.cpp" for lane in me.lanes)
for image in dict.fromkeys([*(lane.image for lane in me.lanes), *[hf_image] * needs_hf_image]):
    lanes.image_present(name=f"Serving image {image}", image=image)


def serve(lane: Lane, after: str | None, rank: MpRank | None = None) -> None:
    on_ray = lane.cluster_executor == "ray"
    head_ip = str(spark.head.fabric[0].address.ip) if lane.is_cluster else ""
    others = spark.ranks[1:] if me.role == "head" else [spark.head]
    lanes.serving(
        name=(
            f"Lane {lane.name}: rank {rank.node_rank} of {lane.served_name}, headless"
            if rank and rank.headless
            else f"Lane {lane.name}: {lane.served_name} on port {lane.port}"
        ),
        unit=lanes.LaneUnit(
            lane=lane,
            environment=me.cluster_environment(spark.head),
            after=after,
            hf_token=bool(me.hf_token_file),
            start_timeout_s=me.lane_start_timeout_min * 60,
            ray_address=f"{head_ip}:{me.ray.port}" if on_ray else None,
            ray_token=on_ray and me.ray.auth,
            rank=rank,
            peers=tuple(str(box.fabric[0].address.ip) for box in others) if rank else (),
        ),
    )


def model_on_box(lane: Lane, what: str) -> None:
    preflight.model_present(
        name=f"{what}: {lane.model} on this box",
        model=lane.model,
        image=hf_image if lane.engine == "llama.cpp" else lane.image,
        models_dir=lanes.MODELS_DIR,
        token_path=lanes.HF_TOKEN if me.hf_token_file else None,
        fetch=me.fetch_weights,
        files=lane.weight_files,
    )


# This box's own lanes, each once the one before it serves, its weights on the box before it
# starts; they need nothing of the other boxes, so they come before the cluster stage, which
# stops when a box is missing.
previous = None
for lane in me.lanes:
    if not lane.is_cluster:
        model_on_box(lane, f"Lane {lane.name}")
        serve(lane, after=previous)
        previous = lane.name

# Clients reach every lane of this box, the cluster lane's too, through nginx, which asks the
# lane's key on every path; vLLM listens on loopback only.
front.lanes_front(
    name=f"Front: nginx asks the key on every path of {len(me.lanes)} lane(s)",
    lanes=[
        front.FrontLane(lane.name, lane.port, lane.backend_port, key=lane.api_key)
        for lane in me.lanes
    ],
    allow_networks=list(me.front_allow_networks),
    tls=me.front_tls,
)

# --- a cluster: Ray over the fabric, its ports closed to all but the fabric ----------------

if len(spark.hosts) > 1 and me.topology == "ring3":
    # Ray needs one address per box that every box reaches; on a ring each fabric address
    # reaches one neighbour (config.py refuses a cluster lane there): no Ray, so no ports for
    # the firewall to close either. The NCCL test runs (below), its rendezvous and NCCL's
    # bootstrap over the management network (config.py cluster_environment): this box's
    # management address must be where the inventory says.
    logger.warning(
        f"{host.name}: fabric_topology ring3: the fabric, NCCL's environment and the NCCL test"
        " are set up; Ray and its firewall are not (not done yet for rings: README, Fabric"
        " shapes)"
    )
    preflight.management_address(
        name=f"Management address {me.management_address} on {me.management_ifname}",
        ifname=me.management_ifname,
        address=str(me.management_address),
    )
    # Ray (which pulls its image elsewhere) is left out: the test's image is pulled here.
    lanes.image_present(name=f"NCCL test image {me.ray.image}", image=me.ray.image)
elif len(spark.hosts) > 1:
    preflight.cluster_whole(
        name="Every box of the cluster is in this run",
        members=[other.name for other in spark.hosts],
    )
    firewall.cluster_ports_fabric_only(
        name="Firewall: Ray's and the distributed back-end's ports from the fabric only",
        fabric={link.ifname: str(link.address.network) for link in me.fabric},
        ports=listen_ports(me.ray.port),
        open_ports=[host.data.get("ssh_port") or 22, *(lane.port for lane in me.lanes)],
    )
    # Where the cluster lane's workers on this box read its weights (copied or fetched below).
    ray_models = ((lanes.MODELS_DIR, preflight.HF_CACHE_IN_CONTAINER),)
    if cluster_lane and cluster_lane.model.startswith("/"):
        ray_models += ((cluster_lane.model, cluster_lane.model),)
    if on_mp:
        ray.node_removed(name=f"No {ray.UNIT}: the cluster lane runs on vLLM's own multi-node mode")
    else:
        ray.node(
            name=f"Ray ({ray.UNIT}): head on {spark.head.fabric[0].address.ip}, workers join it",
            role=me.role,
            node_ip=str(me.fabric[0].address.ip),
            head_ip=str(spark.head.fabric[0].address.ip),
            image=me.ray.image,
            environment=me.cluster_environment(spark.head),
            env_file=me.env_file,
            port=me.ray.port,
            token=ray.controller_token() if me.ray.auth else None,
            models=ray_models,
        )


def nccl_test(image: str) -> None:
    """The NCCL test (issue 13): a rank on every box at once, in ``image``, present by now."""
    if me.nccl_test is None:
        return
    nccl.prepared(
        name=f"NCCL test: {nccl.COMMAND}, rank {spark.node_rank(me.name)} of {len(spark.hosts)}",
        rank=spark.node_rank(me.name),
        world=len(spark.hosts),
        image=image,
        env_names=sorted(me.cluster_environment(spark.head)),
        env_file=me.env_file,
        hcas=[link.hca for link in me.fabric],
        min_busbw_gbs=me.nccl_test.min_busbw_gbs,
        max_bytes=me.nccl_test.max_bytes,
    )
    nccl.passed(
        name=(
            f"NCCL test: NET/IB on every twin, all_gather at {me.nccl_test.min_busbw_gbs:g} GB/s"
            f" or more at {me.nccl_test.max_bytes} B"
        ),
        boxes=[box.name for box in spark.hosts],
    )


# Without a cluster lane, the test runs in Ray's image (pulled by ray.node on every box, on a
# ring above).
if len(spark.hosts) > 1 and not cluster_lane:
    nccl_test(me.ray.image)

# A cluster lane (on the head) runs a rank on every box: each box checks what it needs before
# the head starts it; on Ray the Ray image is its image (config.py), present on every box by now.
if cluster_lane:
    if cluster_lane.model.startswith("/"):  # a directory of the user's, on every box
        model_on_box(cluster_lane, f"Cluster lane {cluster_lane.name}")
    else:  # from the internet once, onto the head; over the fabric to the other boxes
        copy = {"model": cluster_lane.model, "models_dir": lanes.MODELS_DIR}
        head_address = str(spark.head.fabric[0].address.ip)
        if me.role == "head":
            model_on_box(cluster_lane, f"Cluster lane {cluster_lane.name}")
            weights.shared(
                name=f"Cluster lane {cluster_lane.name}: the model served to the boxes lacking it",
                address=head_address,
                fetch=me.fetch_weights,
                boxes=[box.name for box in spark.hosts],
                **copy,
            )
        weights.copied(
            name=f"Cluster lane {cluster_lane.name}: the model copied from the head",
            image=cluster_lane.image,
            token_path=lanes.HF_TOKEN if me.hf_token_file else None,
            head=spark.head.name,
            address=head_address,
            fetch=me.fetch_weights,
            **copy,
        )
        if me.role == "head":
            weights.unshared(name="The model no longer served")
    preflight.image_agrees(
        name=f"Cluster lane image {cluster_lane.image}: the same on every box",
        image=cluster_lane.image,
        boxes=[box.name for box in spark.hosts],
    )
    nccl_test(cluster_lane.image)  # before the lane starts: it proves the fabric the lane uses
    if on_mp:
        # The headless ranks first, the head's last (as eugr/spark-vllm-docker's launcher does):
        # two calls, so that pyinfra runs the ranks' operation on every box before the head's.
        rank = MpRank(spark.node_rank(me.name), str(spark.head.fabric[0].address.ip))
        if rank.headless:
            serve(cluster_lane, after=previous, rank=rank)
        if not rank.headless:
            serve(cluster_lane, after=previous, rank=rank)
    elif me.role == "head":  # on Ray: the head's unit only, after its own lanes
        serve(cluster_lane, after=previous)

# Clients reach a box at the address the inventory connects to.
endpoints.report(state, me, address=host.data.get("ssh_hostname") or host.name)

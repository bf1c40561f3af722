"""The cluster: the firewall over the cluster's ports, Ray over the fabric (or vLLM's own
multi-node mode), the NCCL test, the cluster lane. Everything here needs every box, and comes
after each box has done what it can alone."""

from pyinfra import logger
from pyinfra.api import deploy

from operations import firewall, images, lanes, nccl, preflight, ray, weights
from operations.asked import Question
from spark.box_paths import MODELS_DIR
from spark.plan import BoxPlan, NcclRun
from stages.lanes_front import fetch, model_on_box, serve, weights_questions


def nccl_test(run: NcclRun | None) -> None:
    """A rank on every box at once, in the run's image, present by now."""
    if run is None:
        return
    nccl.prepared(
        name=f"NCCL test: {nccl.COMMAND}, rank {run.rank} of {run.world}",
        rank=run.rank,
        world=run.world,
        image=run.image,
        env_names=list(run.env_names),
        env_file=run.env_file,
        hcas=list(run.hcas),
        min_busbw_gbs=run.min_busbw_gbs,
        max_bytes=run.max_bytes,
    )
    nccl.passed(
        name=(
            f"NCCL test: NET/IB on every twin, all_gather at {run.min_busbw_gbs:g} GB/s"
            f" or more at {run.max_bytes} B"
        ),
        boxes=list(run.boxes),
        waits_for=run.waits_for,
        models_dir=MODELS_DIR,
    )


def questions(box: BoxPlan) -> list[Question]:
    """Everything the stage reads of the box, which deploy.py says ahead (operations/asked.py)."""
    plan = box.cluster
    if plan is None:
        return [*ray.questions(None), *firewall.removed_questions()]
    lane = plan.lane
    run = plan.nccl_test
    return [
        *(firewall.questions() if plan.firewall is not None else []),
        *(ray.questions(None) if plan.ray_removed else []),
        *(ray.questions(plan.ray.image) if plan.ray is not None else []),
        *(images.questions() if plan.nccl_image else []),
        *(weights_questions(lane.weights) if lane else []),
        *(weights.room_questions(MODELS_DIR) if lane and lane.weights.fetch else []),
        *(images.questions() if lane else []),
        *(preflight.image_questions(lane.image) if lane else []),
        *(nccl.questions(run.waits_for, MODELS_DIR) if run is not None else []),
        *(lanes.serving_questions(lane.served) if lane and lane.served else []),
    ]


# The stage's name: pyinfra names its operations "Cluster | ..."; a box stopped here has its own
# lanes serving (stages/run_summary.py).
STAGE = "Cluster"


@deploy(STAGE)
def cluster(box: BoxPlan) -> None:
    plan = box.cluster
    if plan is None:
        # A box that serves alone: what a cluster it has left would have left behind goes
        # (docs/reference.md: "A box leaves the cluster").
        ray.node_removed(name=f"No {ray.UNIT}: this box serves alone")
        firewall.removed(name=f"No {firewall.UNIT}: this box serves alone")
        return
    if plan.firewall is None:
        # No address reaches every box (a ring): Ray needs one, so no Ray and no ports for
        # the firewall to close; the NCCL test runs over the management network.
        logger.warning(
            f"{box.name}: fabric_topology {box.fabric and box.fabric.shape}: the fabric, NCCL's"
            " environment and the NCCL test are set up; Ray and its firewall are not (not done"
            " yet for rings: docs/reference.md, Fabric shapes)"
        )
    else:
        preflight.cluster_whole(
            name="Every box of the cluster is in this run", members=list(plan.members)
        )
        firewall.cluster_ports_fabric_only(
            name="Firewall: Ray's and the distributed back-end's ports from the fabric only",
            fabric=plan.firewall.fabric,
            ports=list(plan.firewall.ports),
            open_ports=list(plan.firewall.open_ports),
        )
    if plan.ray_removed:
        ray.node_removed(name=f"No {ray.UNIT}: the cluster lane runs on vLLM's own multi-node mode")
    if plan.ray is not None:
        node = plan.ray
        ray.node(
            name=f"Ray ({ray.UNIT}): head on {node.head_ip}, workers join it",
            role=node.role,
            node_ip=node.node_ip,
            head_ip=node.head_ip,
            image=node.image,
            environment=node.environment,
            env_file=node.env_file,
            port=node.port,
            token=ray.controller_token() if node.auth else None,
            models=node.models,
            head=node.head,
        )
    if plan.nccl_image is not None:  # Ray, which pulls its image elsewhere, is left out
        images.image_present(name=f"NCCL test image {plan.nccl_image}", image=plan.nccl_image)
    lane = plan.lane
    if lane is None:
        nccl_test(plan.nccl_test)
        return
    # The cluster lane: each box checks what it needs before the head starts it.
    what = f"Cluster lane {lane.name}"
    # Every box runs a rank of the lane in its image; a worker has no lane of its own that
    # pulled it (on the head it is present).
    images.image_present(name=f"{what}: its image {lane.image} on this box", image=lane.image)
    if lane.weights.fetch:
        # As a lane of the box's own: the head's from the hub, a worker's copied from the head
        # over the fabric as the head gets each file; the deploy goes on, the lane waits.
        fetch(lane.weights, what, list(box.models_in_use))
    else:
        model_on_box(lane.weights, what)
    preflight.image_agrees(
        name=f"Cluster lane image {lane.image}: the same on every box",
        image=lane.image,
        boxes=list(plan.members),
    )
    nccl_test(plan.nccl_test)  # before the lane starts: it proves the fabric the lane uses
    served = lane.served
    if served is None:
        return  # a worker on Ray: its Ray node holds the rank
    # The headless ranks first, the head's last (as eugr/spark-vllm-docker's launcher does):
    # separate calls, so that pyinfra runs the ranks' operation on every box before the head's.
    # A changed head is stopped before them: a new rank started while the old head serves joins
    # the old head's rendezvous, loses it as that head goes, and never joins the new one
    # (vllm-project/vllm#32136); the new head then waits for it until its watch gives up. Seen
    # deploying a cluster lane's new memory fraction over the serving one, on the lab.
    if served.rank is not None and not served.rank.headless:
        serve(served, held=True)
    if served.rank is not None and served.rank.headless:
        serve(served)
    if served.rank is None or not served.rank.headless:
        serve(served)

"""The box's own lanes and their front: the memory guard first, so it watches while they load,
then each lane once the one before it serves, its weights on the box before it starts; nginx
asks each lane's key on every path; then the box's metrics endpoint behind nginx too. None of
it needs another box."""

from pyinfra.api import deploy

from operations import front, images, lanes, memguard, metrics, preflight, router, weights
from operations import on_demand as demand
from operations.asked import Question
from spark.box_paths import MODELS_DIR, WEIGHTS_PORT
from spark.plan import BoxPlan, Metrics, ModelOnBox, ServedLane


def model_questions(weights: ModelOnBox) -> list[Question]:
    return preflight.model_questions(weights.model, MODELS_DIR, weights.files)


def weights_questions(model: ModelOnBox) -> list[Question]:
    """What the lane's model check reads: its fetch's where a unit fetches it (fetch_weights)."""
    if model.fetch:
        return weights.fetch_questions(model.model, MODELS_DIR, model.files)
    return model_questions(model)


def fetch(model: ModelOnBox, what: str, in_use: list[str]) -> None:
    """A missing model fetched in the background, once the box has room for it; the deploy goes
    on (its lane waits for it)."""
    weights.room_for(
        name=f"{what}: room for {model.model}",
        model=model.model,
        files=model.files,
        endpoint=model.endpoint,
        token_path=model.token_path,
        catalog_bytes=model.catalog_bytes,
        models_dir=MODELS_DIR,
        in_use=in_use,
    )
    weights.fetched(
        name=f"{what}: {model.model} fetched in the background",
        model=model.model,
        files=model.files,
        models_dir=MODELS_DIR,
        endpoint=model.endpoint,
        token_path=model.token_path,
        source=model.source,
    )


def model_on_box(weights: ModelOnBox, what: str) -> None:
    preflight.model_present(
        name=f"{what}: {weights.model} on this box",
        model=weights.model,
        image=weights.image,
        models_dir=MODELS_DIR,
        token_path=weights.token_path,
        files=weights.files,
    )


def serve(served: ServedLane, held: bool = False) -> None:
    title = "its files, the head stopped where they changed" if held else served.title
    lanes.serving(name=f"Lane {served.name}: {title}", unit=served, held=held)


def metrics_lanes(watch: Metrics) -> list[dict]:
    """The lanes the metrics endpoint serves, as its operation takes them."""
    return [lane.model_dump() for lane in watch.lanes]


def fronted_lanes(box: BoxPlan) -> list[front.FrontLane]:
    """The box's lanes as the front's operation takes them."""
    return [
        front.FrontLane(lane.name, lane.port, lane.backend_port, lane.key, lane.timeout_s)
        for lane in box.front.lanes
    ]


def router_port_of(box: BoxPlan) -> front.RouterPort | None:
    """The fleet router's port on the front, on the router's box (and the failover's)."""
    fleet = box.front.router
    if fleet is None:
        return None
    return front.RouterPort(fleet.port, fleet.backend_port, fleet.allow_networks, fleet.timeout_s)


def questions(box: BoxPlan) -> list[Question]:
    """Everything the stage reads of the box, which deploy.py says ahead (operations/asked.py)."""
    any_fetch = any(lane.weights.fetch for lane in box.lanes)
    return [
        *memguard.questions(),
        *lanes.questions(list(box.images), hf_token=bool(box.hf_token_file)),
        *demand.questions(),
        *(
            question
            for lane in box.lanes
            for question in [
                *weights_questions(lane.weights),
                *lanes.serving_questions(lane.served),
            ]
        ),
        *(weights.serve_questions() if box.weights_share else []),
        *(weights.room_questions(MODELS_DIR) if any_fetch or box.prune_unused else []),
        *front.questions(fronted_lanes(box), router_port_of(box)),
        *(router.key_questions() if box.front.router else []),
        *(
            metrics.questions(watch.port, watch.exporter_port, metrics_lanes(watch))
            if (watch := box.metrics)
            else []
        ),
    ]


@deploy("Lanes and front")
def lanes_and_front(box: BoxPlan) -> None:
    fleet = box.front.router
    guard = box.memory_guard
    memguard.memory_guard(
        name=f"Memory guard: a lane stopped below {guard.floor_gib:g} GiB available",
        lanes=list(guard.lanes),
        min_available_gib=guard.floor_gib,
    )
    if box.hf_token_file:
        lanes.hf_token(name="Hugging Face token (root 0600)", src=box.hf_token_file)
    lanes.lanes_removed(name="Lanes no longer configured: removed", keep=list(box.lane_units))
    demand.on_demand_removed(
        name="Sockets of lanes no longer on demand: removed",
        keep=[lane.served.name for lane in box.lanes if lane.served.on_demand],
    )
    if box.prune_unused:
        images.images_pruned(name="Images no lane uses: removed", keep=list(box.images))
        weights.models_pruned(
            name="Models no lane uses: removed",
            models_dir=MODELS_DIR,
            in_use=list(box.models_in_use),
        )
    for image in box.images:
        images.image_present(name=f"Serving image {image}", image=image)
    if box.weights_share:  # before the fetches of the boxes that copy from it
        weights.blobs_served(
            name="Weights served to the boxes copying them over the fabric",
            address=box.weights_share,
            port=WEIGHTS_PORT,
            models_dir=MODELS_DIR,
        )
    # Every fetch at once, before the first lane's start waits for its own.
    for lane in box.lanes:
        if lane.weights.fetch:
            fetch(lane.weights, f"Lane {lane.served.name}", list(box.models_in_use))
    for lane in box.lanes:
        if not lane.weights.fetch:
            model_on_box(lane.weights, f"Lane {lane.served.name}")
        serve(lane.served)
    if fleet:
        router.fleet_key(
            name="Fleet key (root 0600)"
            + (f", {fleet.key_from}'s" if fleet.key_from else ", made here"),
            source=fleet.key_from,
        )
    front.lanes_front(
        name=f"Front: nginx asks the key on every path of {len(box.front.lanes)} lane(s)"
        + (f" and of the router on port {fleet.port}" if fleet else ""),
        lanes=fronted_lanes(box),
        allow_networks=list(box.front.allow_networks),
        tls=box.front.tls,
        router=router_port_of(box),
    )
    if box.metrics:
        watch = box.metrics
        metrics.endpoint(
            name=f"Metrics: the node exporter behind the metrics key on port {watch.port}",
            port=watch.port,
            exporter_port=watch.exporter_port,
            interval_s=watch.interval_s,
            allow_networks=list(watch.allow_networks),
            tls=watch.tls,
            expected=watch.expected.model_dump(mode="json"),
            lanes=metrics_lanes(watch),
        )

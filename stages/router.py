"""The fleet's router on its box (and the failover's): LiteLLM's proxy, pinned, in a virtualenv
under systemd, holding every lane's key. After the cluster stage: pyinfra runs each operation on
every box before the next, so by now every lane's key, the cluster lane's too, is made on its
box (the front makes them), and this box reads them there. On every other box, no router: one
left from an earlier deploy (fleet_router turned off, router_box moved) is removed."""

from pyinfra.api import deploy

from operations import router
from operations.asked import Question
from spark.plan import BoxPlan, FleetEndpoint


def serves_router(box: BoxPlan, fleet: FleetEndpoint) -> bool:
    """Whether the box is the router's (or the failover's)."""
    return box.name in (router_box.name for router_box in fleet.boxes)


def questions(box: BoxPlan, fleet: FleetEndpoint) -> list[Question]:
    """Everything the stage reads of the box, which deploy.py says ahead (operations/asked.py)."""
    return router.questions() if serves_router(box, fleet) else router.removed_questions()


@deploy("Router")
def fleet_router(box: BoxPlan, fleet: FleetEndpoint) -> None:
    if not serves_router(box, fleet):
        # The virtualenv (the pinned LiteLLM, a four-minute install from the package index) is
        # a cache as the images and models are: kept for the router's return, removed where the
        # box prunes what it does not use (prune_unused).
        router.removed(
            name="Router: none on this box"
            + ("" if box.prune_unused else " (its virtualenv kept)"),
            keep_virtualenv=not box.prune_unused,
        )
        return
    router.serving(
        name=f"Router: LiteLLM's proxy on 127.0.0.1:{fleet.loopback_port},"
        f" {len(fleet.routes)} served name(s)",
        requirements=list(fleet.requirements),
        pip_command=list(fleet.pip_command),
        config=fleet.config,
        unit_command=list(fleet.unit_command),
        loopback_port=fleet.loopback_port,
        keys=[
            (backend.key_variable, backend.box, backend.lane)
            for route in fleet.routes
            for backend in route.backends
            if backend.key_variable
        ],
        ca_files=list(fleet.ca_files),
        ca_bundle=fleet.ca_bundle,
    )

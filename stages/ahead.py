"""Every stage's questions, in stage order: what deploy.py says before its first stage runs, so
that a box with nothing to change is asked them all in one command (operations/asked.py)."""

from __future__ import annotations

from operations.asked import Question
from spark.plan import BoxPlan, FleetEndpoint
from stages import cluster, fabric, host_layer, lanes_front, router


def every_stage(box: BoxPlan, fleet: FleetEndpoint) -> list[list[Question]]:
    """Each stage's ``questions``, in the order deploy.py runs the stages."""
    return [
        host_layer.questions(box),
        fabric.questions(box),
        lanes_front.questions(box),
        cluster.questions(box),
        router.questions(box, fleet),
    ]

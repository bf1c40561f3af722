"""Every stage's questions, in stage order: what deploy.py says before its first stage runs, so
that a box with nothing to change is asked them all in one command (operations/asked.py)."""

from __future__ import annotations

from operations import asked
from operations.asked import Question
from spark.plan import BoxPlan, FleetEndpoint
from stages import cluster, fabric, host_layer, lanes_front, router


def say_every_stage(box: BoxPlan, fleet: FleetEndpoint) -> list[list[Question]]:
    """Say each stage's ``questions`` ahead, in the order deploy.py runs the stages, and give
    them: the box's first read asks them all in one command."""
    stages = [
        host_layer.questions(box),
        fabric.questions(box),
        lanes_front.questions(box),
        cluster.questions(box),
        router.questions(box, fleet),
    ]
    for questions in stages:
        asked.ahead(questions)
    return stages

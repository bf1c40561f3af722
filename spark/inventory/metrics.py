"""The metrics endpoint's keys: each box's node exporter behind nginx, its port, period and
who may scrape it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from spark.inventory.front import Networks
from spark.lane import listeners
from spark.options import option
from spark.ports import metrics_exporter_port

if TYPE_CHECKING:
    from spark.lane import Lane


class MetricsKeys(BaseModel):
    """A box's keys for its metrics endpoint."""

    metrics: bool = option(
        "True or False (the metrics endpoint on every box)",
        why="Between deploys each box says what it is doing (issue 28): the distribution's"
        " Prometheus node exporter on 127.0.0.1, with the box's own figures from"
        " files/spark_metrics.py, behind nginx asking the box's metrics key.",
    )
    metrics_port: int = option(
        "an integer 1024..65534, the metrics endpoint's port (9100)",
        why="The node exporter's port in Prometheus' default port allocations; the exporter"
        " itself listens on 127.0.0.1 at the next port.",
        ge=1024,
        le=65534,
    )
    metrics_interval_s: int = option(
        "seconds between two collections, 5..3600 (30)",
        why="spark-metrics.timer's period; a fault is seen within one collection.",
        ge=5,
        le=3600,
    )
    metrics_allow_networks: Networks = option(
        'scraper networks the metrics endpoint admits, e.g. ["192.168.1.0/24"];'
        " [] admits any (the metrics key is still asked)",
        why="Narrows who may reach the metrics endpoint at all, beside its key.",
    )

    def metrics_problems(
        self, lanes: list[Lane], owners: list[tuple[int, int, str]]
    ) -> dict[str, list[str]]:
        """The endpoint's port and the exporter's against the ports the box's services and its
        ``lanes`` hold (``owners``: spark/ports.py port_owners); none with metrics off."""
        return {
            "metrics_port": _port_problems(self.metrics_port, lanes, owners) if self.metrics else []
        }


def _port_problems(
    metrics_port: int, lanes: list[Lane], owners: list[tuple[int, int, str]]
) -> list[str]:
    """Neither the metrics endpoint's port nor the exporter's among the ports a box's services
    hold (spark/ports.py port_owners), nor any lane's port (nginx's) or backend port (its
    server's, on loopback)."""
    taken = {metrics_port: "the metrics endpoint's", metrics_exporter_port(metrics_port): "the"
             " node exporter's (on 127.0.0.1)"}  # fmt: skip
    problems = [
        f"port {port} ({whose}) is {owner}; give metrics_port another port"
        for port, whose in taken.items()
        for low, high, owner in owners
        if low <= port <= high
    ]
    return problems + [
        f"lane {lane.name}: port {port} is {taken[port]}; give metrics_port another port"
        for lane in lanes
        for port in dict.fromkeys(port for _, port in listeners(lane))
        if port in taken
    ]

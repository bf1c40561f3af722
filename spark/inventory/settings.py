"""A box's keys, assembled from each concern's (spark/inventory/: cluster's Role, fabric, box,
cluster, lanes, front, metrics, spark/fleet.py's router), and the checks of one key against
another, every problem at once."""

from __future__ import annotations

from pydantic import ConfigDict, ValidationError, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails

from spark.fleet import RouterKeys
from spark.inventory.box import BoxKeys
from spark.inventory.cluster import ClusterKeys, Role
from spark.inventory.fabric import FabricKeys
from spark.inventory.front import FrontKeys
from spark.inventory.lanes import LaneKeys
from spark.inventory.metrics import MetricsKeys
from spark.ports import port_owners


# pydantic lists a model's fields base by base from the last one: the keys stand in this order
# (Role's first, the router's last) in docs/variables.md and in every list of problems.
class HostSettings(
    RouterKeys, MetricsKeys, FrontKeys, LaneKeys, ClusterKeys, BoxKeys, FabricKeys, Role
):
    """What one host's data may hold (inventory host data over group_data/all.py).

    Field names are the data keys, so every message names the key the user edits; a
    description says what is allowed and ends the messages pydantic itself writes.
    Each key is declared once, with spark.options.option: its allowed values, scope and why;
    its default lives in group_data/all.py (but for the per-host keys), and docs/variables.md
    is generated from both.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> HostSettings:
        """The checks of one field against another, once each is valid on its own; a problem
        is reported under the field the user edits. The context may give the host's SSH port
        (pyinfra's own `ssh_port`), which no lane may take."""
        ssh_port = (info.context or {}).get("ssh_port", 22)
        owners = port_owners(self.ray_port, ssh_port)
        problems = (
            self.fabric_problems()
            | self.lane_problems(owners)
            | self.metrics_problems(self.lanes, owners)
            | self.front_problems()
        )
        errors = [
            InitErrorDetails(
                type="value_error",
                loc=(field,),
                input=getattr(self, field),
                ctx={"error": ValueError("\n".join(lines))},
            )
            for field, lines in problems.items()
            if lines
        ]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

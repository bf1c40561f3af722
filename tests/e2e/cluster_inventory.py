"""The simulated lab as a cluster serving one model over both boxes: inventories/sim.py with
seed 004's cluster lane (cluster_lane.py) in the head's host data and no lanes of the workers'
own (the cluster lane takes its share of every box: next to the two default lanes it would not
fit).

    pyinfra tests/e2e/cluster_inventory.py deploy.py
"""

import runpy
from pathlib import Path

_here = Path(__file__).parent
_lane = runpy.run_path(str(_here / "cluster_lane.py"))["CLUSTER_LANE"]

spark = [
    (name, data | {"lanes": [_lane] if data["spark_role"] == "head" else []})
    for name, data in runpy.run_path(str(_here.parents[1] / "inventories" / "sim.py"))["spark"]
]

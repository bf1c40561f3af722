"""inventories/sim.py as independent servers (fabric_topology "independent"): no role and no
fabric addresses, group_data's first lane (coder) on the first box and its second (fast) on
the second, each box serving its own.

    pyinfra tests/e2e/independent_inventory.py deploy.py
"""

import runpy
from pathlib import Path

_repo = Path(__file__).parents[2]
_lanes = runpy.run_path(str(_repo / "group_data" / "all.py"))["lanes"]
_lab = runpy.run_path(str(_repo / "inventories" / "sim.py"))["spark"]

spark = [
    (
        name,
        {key: value for key, value in data.items() if key not in ("spark_role", "fabric_addresses")}
        | {"fabric_topology": "independent", "lanes": [lane]},
    )
    for (name, data), lane in zip(_lab, _lanes, strict=True)
]

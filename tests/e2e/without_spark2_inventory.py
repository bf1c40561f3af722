"""inventories/sim.py with its second box taken out: the cluster of two made one box, as an
owner's inventory is once a box leaves it (docs/reference.md: "A box leaves the cluster"); the box
serves the documented lane of a model outside the catalog (docs/reference.md, Lanes) in place
of group_data's second lane, and the container toolkit's older build the lab's repository holds
(1.18.0-1: group_data's 1.19.0-1 is then a newer toolkit to move to, README: Day to day).

    pyinfra tests/e2e/without_spark2_inventory.py deploy.py
"""

import runpy
from pathlib import Path

from tests.e2e.readme_lane import readme_lane  # pyinfra starts in the repository: importable

_repo = Path(__file__).parents[2]

_cluster = ("spark_role", "fabric_addresses")  # a lone box has neither (README: Quick start 3)
_lanes = runpy.run_path(str(_repo / "group_data" / "all.py"))["lanes"]
spark = [
    (
        name,
        {k: v for k, v in data.items() if k not in _cluster}
        | {"lanes": [_lanes[0], readme_lane()], "toolkit_version": "1.18.0-1"},
    )
    for name, data in runpy.run_path(str(_repo / "inventories" / "sim.py"))["spark"][:1]
]

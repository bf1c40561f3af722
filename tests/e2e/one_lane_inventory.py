"""inventories/sim.py with one lane per box, group_data's first (coder, port 10101): the least a
box needs to show its own lane and front going on while another box has stopped.

    pyinfra tests/e2e/one_lane_inventory.py deploy.py
"""

import runpy
from pathlib import Path

_repo = Path(__file__).parents[2]
_coder = runpy.run_path(str(_repo / "group_data" / "all.py"))["lanes"][0]

spark = [
    (name, data | {"lanes": [_coder]})
    for name, data in runpy.run_path(str(_repo / "inventories" / "sim.py"))["spark"]
]

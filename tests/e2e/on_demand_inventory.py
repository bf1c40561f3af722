"""inventories/sim.py with two lanes on demand beside group_data's coder lane: its fast lane and a
spare copy of it, each 0.3 of the box, started by their first request and stopped after 20 s
idle (short, for the test). With the coder's 0.45 and the router's share on the head (1 GiB of
121.69: 0.008) the room left is 0.442: each fits, both do not (0.6), so they are never up
together; the box holds 0.45 + 0.008 + 0.3 at most (spark/memory.py, `make plan`).

    pyinfra tests/e2e/on_demand_inventory.py deploy.py
"""

import runpy
from pathlib import Path

from tests.e2e.on_demand_lanes import CODER, FAST, SPARE

_repo = Path(__file__).parents[2]

spark = [
    (name, data | {"lanes": [CODER, FAST, SPARE]})
    for name, data in runpy.run_path(str(_repo / "inventories" / "sim.py"))["spark"]
]

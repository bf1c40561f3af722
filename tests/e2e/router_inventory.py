"""inventories/sim.py with the fleet's router on (fleet_router True: group_data's default, which
the lab's own inventory turns off for every other test): LiteLLM's proxy on the head, spark-1.

    pyinfra tests/e2e/router_inventory.py deploy.py
"""

import runpy
from pathlib import Path

_repo = Path(__file__).parents[2]

spark = [
    (name, data | {"fleet_router": True})
    for name, data in runpy.run_path(str(_repo / "inventories" / "sim.py"))["spark"]
]

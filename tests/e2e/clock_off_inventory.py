"""inventories/sim.py with spark-2's GPU clock lock turned off (gpu_clock_lock_mhz None), as an
owner sets it for one box in its host data.

    pyinfra tests/e2e/clock_off_inventory.py deploy.py
"""

import runpy
from pathlib import Path

_repo = Path(__file__).parents[2]

spark = [
    (name, data | {"gpu_clock_lock_mhz": None} if name == "spark-2" else data)
    for name, data in runpy.run_path(str(_repo / "inventories" / "sim.py"))["spark"]
]

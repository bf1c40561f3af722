"""The lanes of tests/e2e/on_demand_inventory.py: group_data's coder lane resident, its fast lane
and a spare copy of it on demand, each 0.3 of the box, stopped after 20 s idle (short, for the
test)."""

import runpy
from pathlib import Path

CODER, _fast = runpy.run_path(str(Path(__file__).parents[2] / "group_data" / "all.py"))["lanes"]
IDLE_S = 20
FAST = _fast | {"memory_fraction": 0.3, "on_demand_idle_s": IDLE_S}
SPARE = FAST | {"name": "spare", "served_name": "qwen3.6-35b-a3b-spare", "port": 10103}

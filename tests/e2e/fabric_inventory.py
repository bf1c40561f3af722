"""inventories/sim.py with no lanes: the fabric and the host layer only (driver, fabric, RoCE,
NCCL's environment, toolkit, hygiene; Ray on the shapes that have it), as the topology modules
deploy it; no model is fetched or served, so a deploy takes a fraction of the lanes' time.

    pyinfra tests/e2e/fabric_inventory.py deploy.py
"""

import runpy
from pathlib import Path

_sim = runpy.run_path(str(Path(__file__).parents[2] / "inventories" / "sim.py"))
spark = [(name, data | {"lanes": []}) for name, data in _sim["spark"]]

"""tests/e2e/fabric_inventory.py's first two boxes with port 0 alone in the lab's switch
(fabric_switch_ports [0]): a pair through a switch on the port next to the RJ-45, as
tests/e2e/test_switch.py leaves spark-1 and spark-2 once it has pulled their port 1 out.

    pyinfra tests/e2e/switch_port0_inventory.py deploy.py
"""

import runpy
from pathlib import Path

_fabric = runpy.run_path(str(Path(__file__).parent / "fabric_inventory.py"))
spark = [(name, data | {"fabric_switch_ports": [0]}) for name, data in _fabric["spark"][:2]]

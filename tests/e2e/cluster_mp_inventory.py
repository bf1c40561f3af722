"""cluster_inventory.py's cluster lane on NGC's 26.10 image (vLLM 0.31.0, no Ray): with no
executor given, it runs on vLLM's own multi-node mode (executor mp), a unit on each box.

    pyinfra tests/e2e/cluster_mp_inventory.py deploy.py
"""

import runpy
from pathlib import Path

IMAGE = "nvcr.io/nvidia/vllm:26.10-py3"

spark = [
    (name, data | {"lanes": [lane | {"image": IMAGE} for lane in data["lanes"]]})
    for name, data in runpy.run_path(str(Path(__file__).parent / "cluster_inventory.py"))["spark"]
]

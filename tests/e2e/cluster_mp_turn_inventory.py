"""cluster_mp_inventory.py's cluster lane on vLLM's own multi-node mode (executor mp), made
smaller so that the worker has a lane of its own beside its rank: group_data's lane fast (0.30)
on spark-2 and the cluster lane at 0.55 of each box (57.64 GiB of weights per rank, 9 GiB left
for its KV cache). Lanes start within 4 minutes here (lane_start_timeout_min), so every rank
joins the rendezvous within 120 s or its watch gives up, naming it (tests/e2e/test_mp_turn.py).

    pyinfra tests/e2e/cluster_mp_turn_inventory.py deploy.py
"""

import runpy
from pathlib import Path

_here = Path(__file__).parent
_fast = {
    "name": "fast",
    "image": "nvcr.io/nvidia/vllm:26.04-py3",
    "model": "inference-optimization/Qwen3.6-35B-A3B-NVFP4",
    "served_name": "qwen3.6-35b-a3b",
    "port": 10102,
    "memory_fraction": 0.30,
    "max_model_len": 65536,
    "tool_call_parser": "qwen3_coder",
}


def _lanes(data: dict) -> list[dict]:
    if data["spark_role"] == "head":
        return [lane | {"memory_fraction": 0.55} for lane in data["lanes"]]
    return [_fast]


spark = [
    (name, data | {"lanes": _lanes(data), "lane_start_timeout_min": 4})
    for name, data in runpy.run_path(str(_here / "cluster_mp_inventory.py"))["spark"]
]

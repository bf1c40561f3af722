"""inventories/sim.py with seed 002's llama.cpp lane in place of group_data's second lane: the
coding lane on vLLM and Qwen3-Coder-Next's UD-Q4_K_XL GGUF on llama.cpp, 131K in one slot.

    pyinfra tests/e2e/llama_inventory.py deploy.py
"""

import runpy
from pathlib import Path

_repo = Path(__file__).parents[2]
_coder = runpy.run_path(str(_repo / "group_data" / "all.py"))["lanes"][0]
GGUF_LANE = {
    "name": "gguf",
    "engine": "llama.cpp",
    "image": "ghcr.io/ardge-labs/llama-cpp-dgx-spark:server",  # seed 002
    "model": "unsloth/Qwen3-Coder-Next-GGUF",  # seed 002
    "gguf_file": "Qwen3-Coder-Next-UD-Q4_K_XL.gguf",
    "served_name": "qwen3-coder-next-gguf",
    "port": 10103,
    # With the coder's 0.45 and the fleet's router on the head (1 GiB of 121.69: 0.008):
    # 0.898, under the 0.90 the deploy admits; the GGUF's 46.2 GiB, its q8_0 cache of 131K
    # (1.6 GiB) and 4 GiB beside them take 51.8 of the 53.5 GiB this gives.
    "memory_fraction": 0.44,
    "max_model_len": 131072,  # seed 002
    # The lab serves it with llama.cpp's own llama-server and a tiny GGUF that answers nothing
    # sensible (tests/simlab/lab_gguf.py), as a base model would: the canary cannot judge it.
    "canary": False,
    # The deploy's --threads 10 is a Grace CPU's 10 performance cores; llama.cpp's threads wait
    # for each other spinning, and 10 of them on the lab machine's 2 busy cores decoded 0.92
    # tok/s (the lane bench's first request, lab 16), against thousands with 2: the lab's CPU
    # set, as an owner sets a machine's own.
    "extra_args": ["--threads", "2"],
}

spark = [
    (name, data | {"lanes": [_coder, GGUF_LANE]})
    for name, data in runpy.run_path(str(_repo / "inventories" / "sim.py"))["spark"]
]

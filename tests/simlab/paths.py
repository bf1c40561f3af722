"""Where the lab keeps its cache and its state, and how it reports progress."""

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Several labs can run side by side on one machine (say, a developer's and a test session's):
# each has its own id, which keeps its namespaces, links, subnet and state apart.
LAB_ID = int(os.environ.get("SIMLAB_ID", "0"))
PREFIX = f"simlab{LAB_ID}"
# Root filesystems and packages: large, slow to make, shared by every lab on this machine.
CACHE = Path(os.environ.get("SIMLAB_CACHE", "/var/cache/spark-simlab"))
# One running lab: keys, ssh_config, per-host overlays. The inventory reads it.
STATE = Path(
    os.environ.get("SIMLAB_STATE", REPO / (".simlab" if LAB_ID == 0 else f".simlab{LAB_ID}"))
)
HARDWARE_DIR = Path(__file__).parent / "hardware"

_START = time.monotonic()


def log(message: str) -> None:
    print(f"[simlab {time.monotonic() - _START:6.1f}s] {message}", file=sys.stderr, flush=True)

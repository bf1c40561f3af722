"""Where the lab keeps its cache and its state, and how it reports progress."""

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Root filesystems and packages: large, slow to make, shared by every lab on this machine.
CACHE = Path(os.environ.get("SIMLAB_CACHE", "/var/cache/spark-simlab"))
# One running lab: keys, ssh_config, per-host overlays. The inventory reads it.
STATE = Path(os.environ.get("SIMLAB_STATE", REPO / ".simlab"))
HARDWARE_DIR = Path(__file__).parent / "hardware"

_START = time.monotonic()


def log(message: str) -> None:
    print(f"[simlab {time.monotonic() - _START:6.1f}s] {message}", file=sys.stderr, flush=True)

"""The lab's PyTorch stand-in (serving/torch_standin.py) on this machine: two ranks of the NCCL
test over loopback, where no RDMA device is: NCCL's socket fallback, the bytes moved and the
values checked by files/nccl_check.py itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.simlab.paths import REPO
from tests.simlab.serving import torch_standin

CHECK = REPO / "files" / "nccl_check.py"


def test_nccls_list_syntax() -> None:
    names = ["roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    assert torch_standin._selected(names, "rocep1s0f1") == ["rocep1s0f1"]
    assert torch_standin._selected(names, "rocep1") == ["rocep1s0f0", "rocep1s0f1"]
    assert torch_standin._selected(names, "=rocep1s0f1:1,roceP2p1s0f1") == names[::2]
    assert torch_standin._selected(names, "^rocep1") == ["roceP2p1s0f1"]


def test_two_ranks_fall_back_to_sockets_and_move_correct_values(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    shutil.copy(torch_standin.__file__, site / "torch" / "__init__.py")
    env = dict(
        os.environ,
        PYTHONPATH=str(site),
        NCCL_SOCKET_IFNAME="lo",
        NCCL_IB_HCA="rocep1s0f1,roceP2p1s0f1",
    )
    out = tmp_path / "out"
    run = [sys.executable, str(CHECK), "local", "--ranks", "2", "--out", str(out)]
    subprocess.run([*run, "--max-bytes", str(4 << 20), "--port", "29577"], env=env, check=True,
                   timeout=120)  # fmt: skip
    judged = subprocess.run(
        [sys.executable, str(CHECK), "report", "--out", str(out), "--expect-hca", "rocep1s0f1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    verdict = json.loads((out / "verdict.json").read_text())
    assert judged.returncode == 1
    assert [row["wrong"] for row in verdict["rows"]] == [0, 0, 0, 0]
    assert {row["algorithm"] for row in verdict["rows"]} == {"RING/SIMPLE"}
    assert verdict["ranks"][0]["channels"] == {"NET/Socket/0": 2}
    assert any(
        "NCCL fell back to sockets (NET/Socket on lo): NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1"
        " found no device" in problem
        for problem in verdict["problems"]
    ), verdict["problems"]

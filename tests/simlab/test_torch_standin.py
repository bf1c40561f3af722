"""The lab's PyTorch stand-in (serving/torch_standin.py) on this machine: two ranks of the NCCL
test over loopback, where no RDMA device is: NCCL's socket fallback, the bytes moved and the
values checked by files/nccl_check.py itself."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_rank_whose_bootstrap_address_does_not_reach_the_next_fails_as_nccl_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Out-of-band interfaces that do not reach each other (sockets on a ring's twin): nothing
    # listens where the next rank's bootstrap address points, so the connect fails.
    monkeypatch.setattr(torch_standin, "BOOTSTRAP_TIMEOUT_S", 1)
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    group = object.__new__(torch_standin._Group)
    group.rank, group.world, group.log = 0, 2, torch_standin._Log()
    group.peers = [{"bootstrap": ["127.0.0.1", 0]}, {"bootstrap": ["127.0.0.1", port]}]
    with pytest.raises(RuntimeError, match="NCCL error: unhandled system error"):
        group._bootstrap_ring(socket.create_server(("127.0.0.1", 0)))
    assert f"NCCL WARN socketStartConnect: Connect to 127.0.0.1<{port}> failed :" in (
        capsys.readouterr().out
    )

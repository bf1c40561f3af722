"""The lab's PyTorch stand-in (serving/torch_standin.py) on this machine: two ranks of the NCCL
test over loopback, where no RDMA device is: NCCL's socket fallback, the bytes moved and the
values checked by files/nccl_check.py itself."""

from __future__ import annotations

import json
import os
import platform
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


def two_ranks(tmp_path: Path, nccl: str, port: int) -> Path:
    """The NCCL test's two ranks over loopback under the stand-in, as an image carrying NCCL
    ``nccl`` has it; their results' folder."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    shutil.copy(torch_standin.__file__, site / "torch" / "__init__.py")
    (site / "torch" / "nccl_version").write_text(nccl + "\n")  # as image_layers writes it
    env = dict(
        os.environ,
        PYTHONPATH=str(site),
        NCCL_SOCKET_IFNAME="lo",
        NCCL_IB_HCA="rocep1s0f1,roceP2p1s0f1",
    )
    out = tmp_path / "out"
    run = [sys.executable, str(CHECK), "local", "--ranks", "2", "--out", str(out)]
    subprocess.run([*run, "--max-bytes", str(4 << 20), "--port", str(port)], env=env, check=True,
                   timeout=120)  # fmt: skip
    return out


def report(out: Path) -> dict:
    subprocess.run(
        [sys.executable, str(CHECK), "report", "--out", str(out), "--expect-hca", "rocep1s0f1",
         "--image", "nvcr.io/nvidia/vllm:26.04-py3"],
        capture_output=True, check=False,
    )  # fmt: skip
    return json.loads((out / "verdict.json").read_text())


def test_two_ranks_fall_back_to_sockets_and_move_correct_values(tmp_path: Path) -> None:
    verdict = report(two_ranks(tmp_path, "2.29.7", 29577))
    assert verdict["passed"] is False
    assert [row["wrong"] for row in verdict["rows"]] == [0, 0, 0, 0]
    assert {row["algorithm"] for row in verdict["rows"]} == {"RING/SIMPLE"}
    assert verdict["ranks"][0]["channels"] == {"NET/Socket/0": 2}
    assert any(
        "NCCL fell back to sockets (NET/Socket on lo): NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1"
        " found no device" in problem
        for problem in verdict["problems"]
    ), verdict["problems"]


@pytest.mark.parametrize(("nccl", "port", "deadlocks"), [("2.28.9", 29578, True),
                                                         ("2.29.7", 29579, False)])  # fmt: skip
def test_the_images_nccl_is_logged_and_judged_on_a_sparks_architecture(
    tmp_path: Path, nccl: str, port: int, deadlocks: bool
) -> None:
    out = two_ranks(tmp_path, nccl, port)
    verdict = report(out)
    assert [rank["version"] for rank in verdict["ranks"]] == [f"{nccl}+simlab"] * 2
    # This machine's architecture, as the ranks read it: the rule is aarch64's alone.
    assert {rank["machine"] for rank in verdict["ranks"]} == {platform.machine()}
    assert not any("deadlocks" in problem for problem in verdict["problems"])
    # The same ranks as a Spark's write their rank files (the lab's machine is no aarch64).
    for rank_file in out.glob("rank.*.json"):
        rank_file.write_text('{"machine": "aarch64"}')
    said = [p for p in report(out)["problems"] if "deadlocks" in p]
    assert said == (
        [
            f"rank {rank} ({socket.gethostname()}): NCCL 2.28.9+simlab on aarch64 in"
            " nvcr.io/nvidia/vllm:26.04-py3: NCCL before 2.29.3 deadlocks silently on aarch64:"
            " a weak compare-exchange in its proxy-op pool leaks slots until a rank spins"
            " forever, no error, no timeout (NVIDIA/nccl#2353, marin-community/marin#7344;"
            " fixed in NCCL 2.29.3); use an image with NCCL 2.29.3 or later"
            for rank in (0, 1)
        ]
        if deadlocks
        else []
    )


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

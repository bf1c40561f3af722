"""The NCCL check's reading of NCCL's log, its bus-bandwidth arithmetic and its verdict.

Captures (tests/unit/captured/):
- real-h100-nccl-check-1rank-*.log and -default-timings.json: real. files/nccl_check.py itself
  (`local --ranks 1`), NCCL 2.28.9+cuda13.0 under PyTorch 2.11.0 on one NVIDIA H100 80GB HBM3
  (the project's accelerator machine, 2026-11-23; no RDMA device, one interface eth0):
  `default` as NCCL chooses; `missing-hca` with NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1, devices that
  are not there (NCCL says so and falls back to sockets without an error); `bad-ifname` with
  NCCL_SOCKET_IFNAME=enp1s0f1np1, an interface that is not there (bootstrap fails).
- real-h100x2-nccl-check-2rank-*: real. files/nccl_check.py (`local --ranks 2`, up to 64 MiB),
  NCCL 2.28.9+cuda13.0 under PyTorch 2.11.0 on two NVIDIA H100 80GB HBM3 of one host (the
  project's accelerator machine, 2026-11-25; no RDMA device, one interface eth0): `socket` with
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 and NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1 (the two ranks
  talk through the network, which is NCCL's socket fallback: real `via NET/Socket/0` channel
  lines and rank 0's TUNING lines), each rank's log and the timings; `p2p-rank1` as NCCL chose
  (NVLink: `via P2P/CUMEM`), rank 1's log.
- issue-*.log: real lines quoted in public issues (each file's first line names its issue):
  multi-rank channel lines (NET/Socket, NET/IB, SHM, P2P/IPC, P2P/direct pointer), which a
  one-GPU machine cannot produce.
- public-spark-rdma-plugin.log: a Spark rank's lines quoted in public notes (its first line names
  them): NCCL through an RDMA net plugin, its channels "via NET/NCCL RDMA Plugin v10/0".
- public-nccl-tests-spark-pair.txt: nccl-tests tables of Spark pairs quoted in
  NVIDIA/dgx-spark-playbooks issue 25 and pull request 103 (its first line names them).
- public-spark-pair-ray-hpcx.log: a Spark pair's vLLM worker under Ray, quoted in
  mark-ramsey-ri/vllm-dgx-spark issue 1: HPC-X's plugin, channels alternating between the twins.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.unit.harness import CAPTURED

_SPEC = importlib.util.spec_from_file_location(
    "nccl_check", Path(__file__).resolve().parents[2] / "files/nccl_check.py"
)
assert _SPEC and _SPEC.loader
nccl_check = importlib.util.module_from_spec(_SPEC)
sys.modules["nccl_check"] = nccl_check
_SPEC.loader.exec_module(nccl_check)

TWINS = ["rocep1s0f1", "roceP2p1s0f1"]


def log_of(name: str):
    return nccl_check.parse_log((CAPTURED / name).read_text())


def test_real_one_rank_log_read():
    log = log_of("real-h100-nccl-check-1rank-default.log")
    assert (log.host, log.rank, log.version) == ("vm", 0, "2.28.9+cuda13.0")
    assert (log.network, log.socket_ifaces, log.ib_devices) == ("Socket", ["eth0"], [])
    assert log.channels == {}  # one rank: no channel to another rank
    assert log.warnings == []


def test_real_missing_hca_is_a_silent_socket_fallback_named_by_the_verdict():
    log = log_of("real-h100-nccl-check-1rank-missing-hca.log")
    assert log.ib_hca_env == "rocep1s0f1,roceP2p1s0f1"
    assert log.network == "Socket"
    assert log.warnings == []  # NCCL did not complain: the fallback is silent
    problems = nccl_check.verdict([], [log], transport="NET/IB", expect_hcas=[], min_busbw=None)
    fallback = [p for p in problems if "fell back to sockets" in p]
    assert len(fallback) == 1
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1 found no device" in fallback[0]
    assert "NET/Socket on eth0" in fallback[0]


def test_real_bad_socket_interface_quotes_nccls_warning():
    log = log_of("real-h100-nccl-check-1rank-bad-ifname.log")
    assert log.warnings == ["Bootstrap : no socket interface found"]
    problems = nccl_check.verdict([], [log], transport=None, expect_hcas=[], min_busbw=None)
    assert problems == [
        "no timings: the collective did not complete"
        " (NCCL warned: Bootstrap : no socket interface found)"
    ]


def test_real_two_rank_socket_run_is_named_a_fallback_with_nccls_own_algorithm():
    logs = [log_of(f"real-h100x2-nccl-check-2rank-socket-rank{rank}.log") for rank in (0, 1)]
    assert [(log.rank, log.network, log.socket_ifaces) for log in logs] == [
        (0, "Socket", ["eth0"]),
        (1, "Socket", ["eth0"]),
    ]
    assert [log.channels for log in logs] == [{"NET/Socket/0": 4}] * 2  # 2 channels, each way
    assert logs[1].algorithms == {}  # NCCL logs the algorithm on rank 0 only
    timings = json.loads(
        (CAPTURED / "real-h100x2-nccl-check-2rank-socket-timings.json").read_text()
    )
    rows = nccl_check.rows_of(timings, logs)
    assert {row.algorithm for row in rows} == {"RING/SIMPLE"}  # from rank 0's TUNING lines
    largest = rows[3]
    assert (largest.op, largest.bytes) == ("all_gather", 1 << 26)
    assert largest.busbw == pytest.approx(largest.algbw / 2)  # (n-1)/n, n = 2
    assert 2 < largest.busbw < 3  # sockets: the field's "about 3 GB/s"
    problems = nccl_check.verdict(
        rows, logs, transport="NET/IB", expect_hcas=TWINS, min_busbw=21.875
    )
    assert problems == [
        f"rank {rank} (vm): {problem}"
        for rank in (0, 1)
        for problem in (
            "NCCL fell back to sockets (NET/Socket on eth0): NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1"
            " found no device; no usable RDMA device in the container (--device /dev/infiniband,"
            " NCCL_IB_HCA naming the box's devices, a RoCE v2 GID)",
            "NCCL does not use rocep1s0f1, roceP2p1s0f1 (NET/IB uses none)",
        )
    ] + [
        f"all_gather 67108864 B: bus bandwidth {largest.busbw:.2f} GB/s, under the pass mark"
        " 21.875 GB/s"
    ]


def test_real_nvlink_channels_on_a_socket_network_are_named_not_a_socket_fallback():
    # NCCL's network for the communicator is Socket (no RDMA device), yet NVLink carried every
    # channel: the verdict names P2P/CUMEM, not sockets.
    log = log_of("real-h100x2-nccl-check-2rank-p2p-rank1.log")
    assert (log.transports(), log.network) == ({"P2P"}, "Socket")
    problems = nccl_check.verdict([], [log], transport="NET/IB", expect_hcas=[], min_busbw=None)
    assert problems[1:] == [
        "rank 1 (vm): channels via P2P/CUMEM (GPU to GPU within one host), not NET/IB:"
        " no channel crossed the fabric"
    ]
    assert nccl_check.verdict([], [log], transport=None, expect_hcas=[], min_busbw=None)[1:] == []


def test_quoted_ipc_channels_beside_socket_ones_are_a_socket_fallback():
    log = log_of("issue-nccl-952-ipc-and-socket.log")
    assert log.channels == {"NET/Socket/3": 2, "P2P/IPC/read": 2}
    problem = nccl_check.transport_problem(log, "NET/IB")
    assert problem is not None and problem.startswith("NCCL fell back to sockets")


def test_quoted_direct_pointer_channels_beside_rdma_ones_are_named():
    log = log_of("issue-nccl-429-direct-pointer-and-ib.log")
    assert log.channels == {"P2P/direct pointer": 3, "NET/IB/0/GDRDMA": 1}
    assert log.transports() == {"P2P", "NET/IB"}
    assert nccl_check.transport_problem(log, "NET/IB") == (
        "channels via P2P/direct pointer (GPU to GPU within one host), not NET/IB"
    )


def test_shm_channels_named_with_what_they_use():
    # the via string as issue-nccl-1232-socket-fallback.log quotes it
    log = nccl_check.RankLog(host="node0", rank=2, channels={"SHM/direct/direct": 2})
    assert nccl_check.transport_problem(log, "NET/IB") == (
        "channels via SHM/direct/direct (shared memory within one host), not NET/IB:"
        " no channel crossed the fabric"
    )


def test_quoted_socket_channels_and_shm_lines():
    log = log_of("issue-nccl-1232-socket-fallback.log")
    assert log.host == "node0"  # the first line's: one rank's log per file in real runs
    assert log.channels == {"NET/Socket/0": 6, "SHM/direct/direct": 2}
    assert log.transports() == {"NET/Socket", "SHM"}


def test_quoted_roce_devices_and_ib_plugin_channels():
    roce = log_of("issue-nccl-tests-185-roce.log")
    assert (roce.network, roce.ib_devices) == ("IB", ["mlx5_10", "mlx5_11"])
    ibext = log_of("issue-nccl-1814-ibext.log")
    assert ibext.channels == {"NET/IBext_v8/1": 4}
    assert ibext.transports() == {"NET/IB"}


def test_a_sparks_rdma_plugin_channel_is_net_ib_with_its_one_twin_named():
    log = log_of("public-spark-rdma-plugin.log")
    assert log.channels == {"NET/NCCL RDMA Plugin v10/0": 1}
    assert log.transports() == {"NET/IB"}
    problems = nccl_check.verdict(
        [], [log], transport="NET/IB", expect_hcas=["rocep1s0f0", "roceP2p1s0f0"], min_busbw=None
    )
    assert problems[1:] == [
        "rank None (spark-3): NCCL does not use roceP2p1s0f0 (NET/IB uses rocep1s0f0)"
    ]


def test_a_spark_pairs_ray_worker_lines_read_through_rays_prefix():
    # Real lines of a Spark pair (HPC-X's plugin), each behind Ray's "(actor pid=N, ip=A) ":
    # before, the parser read none of them.
    log = log_of("public-spark-pair-ray-hpcx.log")
    assert log.host == "spark-3995"
    assert log.channels == {"NET/IBext_v10/1": 1, "NET/IBext_v10/0": 1}  # one on each twin
    assert log.transports() == {"NET/IB"}
    assert nccl_check.transport_problem(log, "NET/IB") is None


def test_devices_merged_into_virtual_ones_are_each_named():
    # Before, "[0]={[0] mlx5_2:1/RoCE, ...}" gave no device: a pass would have read as "NCCL
    # does not use" every one.
    log = log_of("issue-nccl-tests-373-merged-nics.log")
    assert (log.rank, log.network) == (2, "IBext_v8")
    assert log.ib_devices == ["mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1"]
    assert log.transports() == {"NET/IB"}


def test_a_device_with_its_rail_or_plane_is_named():
    # NVIDIA/nccl src/transport/net_ib/init.cc: " [%d]%s:%d", then ":%d" (rail) or ":", then
    # ":%d" (plane), then "/%s" (link layer).
    line = "h:1:1 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1:0/RoCE [1]mlx5_0:1::2/IB [RO]; OOB e"
    assert nccl_check.parse_log(line).ib_devices == ["rocep1s0f1", "mlx5_0"]


def test_transport_families():
    assert nccl_check.transport_family("NET/IB/0") == "NET/IB"
    assert nccl_check.transport_family("NET/IBext_v8/2") == "NET/IB"
    assert nccl_check.transport_family("NET/Socket/3") == "NET/Socket"
    assert nccl_check.transport_family("P2P/IPC/read") == "P2P"
    assert nccl_check.transport_family("NET/NCCL RDMA Plugin v10/0") == "NET/IB"


@pytest.mark.parametrize(
    ("op", "size", "seconds", "ranks", "algbw", "busbw"),
    [
        # by hand, nccl-tests doc/PERFORMANCE.md: algbw = S/t; all_gather x (n-1)/n,
        # all_reduce x 2(n-1)/n; GB = 1e9 bytes
        ("all_gather", 1 << 30, 0.045, 2, 23.860929, 11.930465),
        ("all_reduce", 1 << 30, 0.090, 2, 11.930465, 11.930465),
        ("all_gather", 1 << 28, 0.010, 3, 26.843546, 17.895697),
        ("all_reduce", 1 << 20, 0.001, 4, 1.048576, 1.572864),
    ],
)
def test_bus_bandwidth_by_ncc_tests_formulas(op, size, seconds, ranks, algbw, busbw):
    got = nccl_check.bus_bandwidth(op, size, seconds, ranks)
    assert got == pytest.approx((algbw, busbw), rel=1e-6)


def nccl_tests_rows(text: str) -> list[tuple[str, int, float, float, float]]:
    """(op, size, time in s, algbw, busbw) of every out-of-place and in-place result of an
    nccl-tests table (its columns: size count type redop root, then time algbw busbw #wrong
    twice), the op from its "Collective test starting: <op>_perf" line."""
    rows, op = [], ""
    for line in text.splitlines():
        if "Collective test starting:" in line:
            op = line.split()[-1].removesuffix("_perf")
        elif line.strip() and not line.startswith("#"):
            fields = line.split()
            for time_us, algbw, busbw in (fields[5:8], fields[9:12]):
                rows.append((op, int(fields[0]), float(time_us) / 1e6, float(algbw), float(busbw)))
    return rows


def test_bus_bandwidth_agrees_with_nccl_tests_on_real_spark_pairs():
    # nccl-tests' own algbw and busbw columns (printed to 2 decimals) from the time it printed.
    rows = nccl_tests_rows((CAPTURED / "public-nccl-tests-spark-pair.txt").read_text())
    assert len(rows) == 10 and {row[0] for row in rows} == {"all_gather", "all_reduce"}
    for op, size, seconds, algbw, busbw in rows:
        got = nccl_check.bus_bandwidth(op, size, seconds, 2)
        assert got == pytest.approx((algbw, busbw), abs=0.006), (op, size)


def test_real_timings_give_rows_with_zero_bus_bandwidth_for_one_rank():
    timings = json.loads((CAPTURED / "real-h100-nccl-check-1rank-default-timings.json").read_text())
    rows = nccl_check.rows_of(timings, [log_of("real-h100-nccl-check-1rank-default.log")])
    assert [row.bytes for row in rows if row.op == "all_gather"] == [
        1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30
    ]  # fmt: skip
    largest = rows[5]
    assert largest.algbw == pytest.approx(1073741824 / timings["rows"][5]["seconds"] / 1e9)
    assert {row.busbw for row in rows} == {0.0}  # one rank moves nothing between ranks
    assert {row.wrong for row in rows} == {0}


def rows(busbw: float, wrong: int = 0):
    return [nccl_check.Row("all_gather", 1 << 30, 0.04, 2 * busbw, busbw, wrong, "RING/SIMPLE")]


def ib_log(devices: list[str], via: str = "NET/IB/0"):
    return nccl_check.RankLog(
        host="spark-1", rank=0, network="IB", ib_devices=devices, channels={via: 4}
    )


def test_pass_over_both_twins_at_the_pair_mark():
    problems = nccl_check.verdict(
        rows(23.7), [ib_log(TWINS)], transport="NET/IB", expect_hcas=TWINS, min_busbw=21.875
    )
    assert problems == []


def test_missing_twin_named():
    problems = nccl_check.verdict(
        rows(23.7), [ib_log(["rocep1s0f1"])], transport="NET/IB", expect_hcas=TWINS,
        min_busbw=21.875,
    )  # fmt: skip
    assert problems == ["rank 0 (spark-1): NCCL does not use roceP2p1s0f1 (NET/IB uses rocep1s0f1)"]


def test_bandwidth_under_the_mark_named():
    problems = nccl_check.verdict(
        rows(12.0), [ib_log(TWINS)], transport="NET/IB", expect_hcas=TWINS, min_busbw=21.875
    )
    assert problems == [
        "all_gather 1073741824 B: bus bandwidth 12.00 GB/s, under the pass mark 21.875 GB/s"
    ]


def test_wrong_results_and_foreign_transport_named():
    problems = nccl_check.verdict(
        rows(23.7, wrong=3), [ib_log(TWINS, via="P2P/CUMEM")], transport="NET/IB",
        expect_hcas=[], min_busbw=None,
    )  # fmt: skip
    assert problems == [
        "rank 0 (spark-1): channels via P2P/CUMEM (GPU to GPU within one host), not NET/IB:"
        " no channel crossed the fabric",
        "all_gather 1073741824 B: 3 wrong elements",
    ]


def test_report_on_the_real_run_writes_its_verdict(tmp_path, capsys):
    shutil.copy(CAPTURED / "real-h100-nccl-check-1rank-default.log", tmp_path / "nccl.vm.456.log")
    shutil.copy(
        CAPTURED / "real-h100-nccl-check-1rank-default-timings.json", tmp_path / "timings.json"
    )
    assert nccl_check.main(["report", "--out", str(tmp_path), "--transport", "any"]) == 0
    assert "PASS" in capsys.readouterr().out
    strict = ["report", "--out", str(tmp_path), "--expect-hca", ",".join(TWINS)]
    assert nccl_check.main([*strict, "--min-busbw", "21.875"]) == 1
    saved = json.loads((tmp_path / "verdict.json").read_text())
    assert saved["passed"] is False
    assert saved["ranks"][0]["network"] == "Socket"
    assert len(saved["rows"]) == 12


class Gathered:
    """torch.distributed's all_gather_object as two ranks see it: rank 0's object (ours) and
    ``peer``'s, in rank order."""

    def __init__(self, peer: dict[str, str]) -> None:
        self.peer = peer
        self.sent: object = None

    def all_gather_object(self, objects: list, obj: object) -> None:
        self.sent = obj
        objects[:] = [obj, self.peer]


def test_every_rank_gets_every_ranks_log_and_rank_file(tmp_path):
    own = tmp_path / f"nccl.spark-1.{os.getpid()}.log"
    own.write_text("spark-1 lines\n")
    own_rank = tmp_path / f"rank.spark-1.{os.getpid()}.json"
    own_rank.write_text('{"machine": "aarch64"}')
    (tmp_path / "timings.json").write_text("{}")
    dist = Gathered(
        {"nccl.spark-2.77.log": "spark-2 lines\n", "rank.spark-2.77.json": '{"machine": "aarch64"}'}
    )
    nccl_check.share_logs(dist, tmp_path, 2)
    # this process's files only
    assert dist.sent == {own.name: "spark-1 lines\n", own_rank.name: '{"machine": "aarch64"}'}
    assert (tmp_path / "nccl.spark-2.77.log").read_text() == "spark-2 lines\n"
    assert (tmp_path / "rank.spark-2.77.json").read_text() == '{"machine": "aarch64"}'
    assert own.read_text() == "spark-1 lines\n"


def test_ranks_sharing_a_directory_leave_each_others_logs_as_they_are(tmp_path):
    # `local`: every rank writes into the same directory; the peer's log is there already
    # and growing, and is not overwritten with what the peer had when it handed it over.
    (tmp_path / "nccl.vm.77.log").write_text("vm:77 lines, and more since\n")
    nccl_check.share_logs(Gathered({"nccl.vm.77.log": "vm:77 lines\n"}), tmp_path, 2)
    assert (tmp_path / "nccl.vm.77.log").read_text() == "vm:77 lines, and more since\n"


def test_a_box_whose_own_rank_did_well_fails_when_a_peers_did_not(tmp_path, capsys):
    # Both ranks' logs in this box's directory (share_logs): rank 0's, NCCL on both RoCE
    # devices as NVIDIA/nccl-tests issue 185 quotes it; rank 1's, the same run's lines with its
    # second device left out (an edit of the quoted lines, as a box whose NCCL_IB_HCA names one);
    # the rank lines in the form of real-h100x2-nccl-check-2rank-socket-rank1.log's.
    quoted = (CAPTURED / "issue-nccl-tests-185-roce.log").read_text()
    init = " NCCL INFO ncclCommInitRankConfig comm 0x17191b90 rank {} nranks 2 cudaDev 0\n"
    (tmp_path / "nccl.dgxh100-4.460770.log").write_text(
        quoted + "dgxh100-4:460770:460842 [0]" + init.format(0)
    )
    peer = quoted.replace("dgxh100-4:460770", "dgxh100-5:1234").replace(" [1]mlx5_11:1/RoCE", "")
    (tmp_path / "nccl.dgxh100-5.1234.log").write_text(
        peer + "dgxh100-5:1234:1 [0]" + init.format(1)
    )
    args = ["report", "--out", str(tmp_path), "--expect-hca", "mlx5_10,mlx5_11"]
    assert nccl_check.main(args) == 1
    saved = json.loads((tmp_path / "verdict.json").read_text())
    assert [(rank["rank"], rank["ib_devices"]) for rank in saved["ranks"]] == [
        (0, ["mlx5_10", "mlx5_11"]),
        (1, ["mlx5_10"]),
    ]
    assert saved["problems"][1:] == [
        "rank 1 (dgxh100-5): NCCL does not use mlx5_11 (NET/IB uses mlx5_10)"
    ]
    assert "FAIL: rank 1 (dgxh100-5): NCCL does not use mlx5_11" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("version", "machine", "deadlocks"),
    [
        # marin-community/marin#7344's bisection on the aarch64 wheels: 2.28.9 and 2.29.2
        # deadlock, 2.29.3 and 2.30.7 do not; the bug is aarch64's alone.
        ("2.28.9+cuda13.0", "aarch64", True),
        ("2.29.2+cuda13.0", "aarch64", True),
        ("2.29.3+cuda13.0", "aarch64", False),
        ("2.30.7+cuda13.3", "aarch64", False),
        ("2.28.9+cuda13.0", "x86_64", False),
        ("2.28.9+cuda13.0", None, False),  # a rank that wrote no rank file
        (None, "aarch64", False),  # a log without NCCL's version line
    ],
)
def test_which_nccl_deadlocks_where(version, machine, deadlocks):
    assert nccl_check.deadlocks(version, machine) is deadlocks


def test_an_aarch64_rank_on_nccl_2_29_2_fails_naming_the_version_the_image_and_the_issue():
    log = ib_log(TWINS)
    log.version, log.machine = "2.29.2+cuda13.0", "aarch64"
    problems = nccl_check.verdict(
        rows(23.7), [log], transport="NET/IB", expect_hcas=TWINS, min_busbw=21.875,
        image="nvcr.io/nvidia/vllm:26.04-py3",
    )  # fmt: skip
    assert problems == [
        "rank 0 (spark-1): NCCL 2.29.2+cuda13.0 on aarch64 in nvcr.io/nvidia/vllm:26.04-py3:"
        " NCCL before 2.29.3 deadlocks silently on aarch64: a weak compare-exchange in its"
        " proxy-op pool leaks slots until a rank spins forever, no error, no timeout"
        " (NVIDIA/nccl#2353, marin-community/marin#7344; fixed in NCCL 2.29.3); use an image"
        " with NCCL 2.29.3 or later"
    ]
    log.version = "2.29.3+cuda13.0"
    assert (
        nccl_check.verdict(
            rows(23.7), [log], transport="NET/IB", expect_hcas=TWINS, min_busbw=21.875
        )
        == []
    )


def test_the_report_reads_each_ranks_architecture_from_its_rank_file(tmp_path, capsys):
    # The H100's real one-rank log (NCCL 2.28.9) with a rank file written as a Spark's rank
    # writes it (aarch64), and a second log of the same run with no rank file beside it.
    shutil.copy(CAPTURED / "real-h100-nccl-check-1rank-default.log", tmp_path / "nccl.vm.456.log")
    (tmp_path / "rank.vm.456.json").write_text('{"machine": "aarch64"}')
    shutil.copy(CAPTURED / "real-h100-nccl-check-1rank-default.log", tmp_path / "nccl.vm.457.log")
    shutil.copy(
        CAPTURED / "real-h100-nccl-check-1rank-default-timings.json", tmp_path / "timings.json"
    )
    args = ["report", "--out", str(tmp_path), "--transport", "any", "--image", "an-image"]
    assert nccl_check.main(args) == 1
    saved = json.loads((tmp_path / "verdict.json").read_text())
    assert [rank["machine"] for rank in saved["ranks"]] == ["aarch64", None]
    assert len(saved["problems"]) == 1
    assert saved["problems"][0].startswith(
        "rank 0 (vm): NCCL 2.28.9+cuda13.0 on aarch64 in an-image:"
    )
    assert "rank 0 (vm, aarch64, NCCL 2.28.9+cuda13.0)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("busbw", "mark", "said"),
    [
        # The 8-box bench's refusal read "0.05 GB/s, under the pass mark 0.05 GB/s" (issue 40):
        # the figure is shown to the decimal where it reads under the mark.
        (0.049, 0.05, "bus bandwidth 0.049 GB/s, under the pass mark 0.05 GB/s"),
        (0.0496, 0.05, "bus bandwidth 0.0496 GB/s, under the pass mark 0.05 GB/s"),
        (0.04, 0.05, "bus bandwidth 0.04 GB/s, under the pass mark 0.05 GB/s"),
        (21.8749, 21.875, "bus bandwidth 21.87 GB/s, under the pass mark 21.875 GB/s"),
        (2.571, 21.875, "bus bandwidth 2.57 GB/s, under the pass mark 21.875 GB/s"),
    ],
)
def test_a_bandwidth_under_the_mark_reads_under_it(busbw: float, mark: float, said: str) -> None:
    rows = [
        nccl_check.Row("all_gather", 1 << 20, 0.1, 0.0, 1.0, 0, "RING/SIMPLE"),
        nccl_check.Row("all_gather", 4 << 20, 0.1, 0.0, busbw, 0, "RING/SIMPLE"),  # the largest
    ]
    problems = nccl_check.verdict(rows, [], transport=None, expect_hcas=[], min_busbw=mark)
    assert problems == [f"all_gather 4194304 B: {said}"]


def test_a_bandwidth_at_the_mark_passes() -> None:
    row = nccl_check.Row("all_gather", 4 << 20, 0.1, 0.0, 0.05, 0, "RING/SIMPLE")
    assert nccl_check.verdict([row], [], transport=None, expect_hcas=[], min_busbw=0.05) == []

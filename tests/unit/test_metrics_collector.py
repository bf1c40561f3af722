"""The box's metrics collector (files/spark_metrics.py) on the real formats it reads, every line it
writes read back by the Prometheus text format parser (prometheus_client's).

Inputs:
- tests/unit/captured/lab-proc-meminfo.txt: the lab's /proc/meminfo (the kernel's format).
- sysfs trees built here in the kernel's formats (Documentation/ABI/stable/sysfs-class-net:
  carrier, speed, mtu; sysfs-class-infiniband: ports/N/state "4: ACTIVE", gids/N as the
  IPv6-mapped address, gid_attrs/types/N "RoCE v2"; hw_counters/<name> one decimal number),
  with the mlx5 counter names of drivers/infiniband/hw/mlx5/counters.c.
- nvidia-smi's CSV as `--format=csv,noheader,nounits` prints it (the real tool's layout:
  shared/data captures of driver 580.159.04), with the figures of a GB10's table in public
  issues (40C, P8, 4W, 0%: NVIDIA/k8s-device-plugin#1482) written by hand, and "[N/A]" where
  a GB10 does not report a field.
- files/nccl_check.py's verdict.json layout (its report()).
- tests/unit/captured/lab-systemctl-show-lane-canary-failed.txt: the collector's `systemctl
  show` of a lab lane whose canary failed its start (its model made to answer gibberish;
  tests/e2e/test_metrics.py), waiting to restart (Restart=on-failure: "activating").
- tests/unit/captured/lab-journal-gpu-clock-lock.txt: `journalctl -b -u
  spark-gpu-clock-lock.service -o cat` on the lab's spark-1 after a deploy: systemd's lines and
  the stand-in nvidia-smi's, whose lock line is the real tool's (Red Hat's OpenShift GPUDirect
  guide's example output; the GB10 journal line capetron/gb10-cluster-bench
  docs/power-offs-and-clock-lock.md quotes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from operations import lanes
from tests.unit.harness import captured

_SPEC = importlib.util.spec_from_file_location(
    "spark_metrics", Path(__file__).resolve().parents[2] / "files/spark_metrics.py"
)
assert _SPEC and _SPEC.loader
spark_metrics = importlib.util.module_from_spec(_SPEC)
sys.modules["spark_metrics"] = spark_metrics
_SPEC.loader.exec_module(spark_metrics)

GIB = 1024**3
EXPECTED = {
    "floor_gib": 8,
    "mtu": 9000,
    "rate_mbps": 200000,
    "rate_low": "refuse",
    "gid_index": 3,
    "driver_branch": 580,
    "gpu_clock_lock": {"unit": "spark-gpu-clock-lock.service",
                       "command": "/usr/bin/nvidia-smi -lgc 300,2200",
                       "min_mhz": 300, "max_mhz": 2200},
    "twins": [
        {"ifname": "enp1s0f1np1", "hca": "rocep1s0f1", "address": "192.168.100.10"},
        {"ifname": "enP2p1s0f1np1", "hca": "roceP2p1s0f1", "address": "192.168.101.10"},
    ],
    "lanes": [
        {"name": "coder", "engine": "vllm", "served_name": "qwen3-coder-next",
         "image": "nvcr.io/nvidia/vllm:26.04-py3", "port": 10101, "backend_port": 11101},
        {"name": "fast", "engine": "vllm", "served_name": "qwen3.6-35b-a3b",
         "image": "nvcr.io/nvidia/vllm:26.04-py3", "port": 10102, "backend_port": 11102},
    ],
    "nccl": True,
    "nccl_verdict": "",  # set per test
}  # fmt: skip


def twin(sys_fs: Path, ifname: str, hca: str, *, mtu: int, speed: int, gids: dict[int, tuple]):
    net = sys_fs / "class/net" / ifname
    net.mkdir(parents=True)
    (net / "carrier").write_text("1\n" if speed > 0 else "0\n")
    (net / "speed").write_text(f"{speed}\n")
    (net / "mtu").write_text(f"{mtu}\n")
    port = sys_fs / "class/infiniband" / hca / "ports/1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs", "hw_counters"):
        (port / sub).mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    for index in range(8):  # unused entries read as zeros (sysfs-class-infiniband)
        (port / "gids" / str(index)).write_text(spark_metrics.ZERO_GID + "\n")
    for index, (gid, kind) in gids.items():
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs/types" / str(index)).write_text(kind + "\n")
        (port / "gid_attrs/ndevs" / str(index)).write_text(ifname + "\n")
    (port / "hw_counters/out_of_sequence").write_text("12\n")
    (port / "hw_counters/np_cnp_sent").write_text("0\n")


def v4(last: str) -> str:
    return f"0000:0000:0000:0000:0000:ffff:{last}"


LINK_LOCAL = "fe80:0000:0000:0000:7447:e0ff:fe65:cf2e"


@pytest.fixture
def box(tmp_path: Path) -> dict:
    """A deployed box: both twins at 9000 and 200G, the RoCE v2 entries at 3; coder serving."""
    proc, sys_fs = tmp_path / "proc", tmp_path / "sys"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "meminfo").write_text(captured("lab-proc-meminfo.txt"))
    (proc / "uptime").write_text("1000.50 1800.00\n")
    (proc / "sys/kernel/osrelease").write_text("6.17.0-1032-nvidia\n")
    gids = {0: (LINK_LOCAL, "IB/RoCE v1"), 1: (LINK_LOCAL, "RoCE v2")}
    for ifname, hca, last in (
        ("enp1s0f1np1", "rocep1s0f1", "c0a8:640a"),
        ("enP2p1s0f1np1", "roceP2p1s0f1", "c0a8:650a"),
    ):
        mine = {2: (v4(last), "IB/RoCE v1"), 3: (v4(last), "RoCE v2")}
        twin(sys_fs, ifname, hca, mtu=9000, speed=200000, gids={**gids, **mine})
    cid = "a" * 64
    scope = sys_fs / f"fs/cgroup/system.slice/docker-{cid}.scope"
    scope.mkdir(parents=True)
    (scope / "memory.current").write_text(f"{40 * GIB}\n")
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({"passed": True, "problems": [], "rows": [
        {"op": "all_gather", "bytes": 1048576, "busbw": 0.4},
        {"op": "all_gather", "bytes": 4194304, "busbw": 0.75},
        {"op": "all_reduce", "bytes": 4194304, "busbw": 0.9},
    ]}))  # fmt: skip
    os.utime(verdict, (5000.0, 5000.0))
    outputs = {
        "docker": f"{cid} spark-lane-coder\n{'b' * 64} unrelated\n",
        "nvidia-smi": "40, 4.12, 0, P8, 580.142\n",
        "dpkg-query": "1.19.0-1",
        "journalctl": captured("lab-journal-gpu-clock-lock.txt"),
        "spark-lane-coder.service": "ActiveState=active\nActiveEnterTimestampMonotonic=400500000\n",
        "spark-lane-fast.service": captured("lab-systemctl-show-lane-canary-failed.txt"),
    }
    return {"proc": proc, "sys": sys_fs, "verdict": verdict, "outputs": outputs}


def collect(box: dict, expected: dict | None = None, **changes):
    outputs = {**box["outputs"], **changes}

    def command(argv: list[str]) -> str | None:
        key = argv[2] if argv[0] == "systemctl" else argv[0]
        asked.append(argv)
        return outputs.get(key)

    asked: list[list[str]] = box.setdefault("asked", [])
    expected = {**EXPECTED, **(expected or {}), "nccl_verdict": str(box["verdict"])}
    return spark_metrics.collect(
        expected,
        proc=box["proc"],
        sys_fs=box["sys"],
        command=command,
        health=lambda port: port == 11101,
        now=5600.0,
    )


def samples(text: str) -> dict[tuple, float]:
    """Every sample as the Prometheus parser reads it: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_converged_box_reads_back_through_the_parser(box: dict) -> None:
    text, drift = collect(box)
    got = samples(text)
    coder, fast = (("lane", "coder"),), (("lane", "fast"),)
    first = (("hca", "rocep1s0f1"), ("twin", "enp1s0f1np1"))
    assert got[("spark_memory_available_bytes", ())] == 23527300 * 1024
    assert got[("spark_memory_guard_floor_bytes", ())] == 8 * GIB
    assert got[("spark_container_memory_bytes", (("container", "spark-lane-coder"),))] == 40 * GIB
    assert got[("spark_gpu_temperature_celsius", ())] == 40
    assert got[("spark_gpu_power_watts", ())] == 4.12
    assert got[("spark_gpu_utilization_ratio", ())] == 0
    assert got[("spark_gpu_pstate", ())] == 8
    assert got[("spark_gpu_clock_locked_mhz", ())] == 2200
    assert got[("spark_twin_mtu_bytes", first)] == 9000
    assert got[("spark_twin_rate_mbps", first)] == 200000
    assert got[("spark_twin_roce_v2_gid_index", first)] == 3
    assert got[("spark_rdma_port_active", first)] == 1
    assert got[("spark_roce_events_total", (("counter", "out_of_sequence"), *first))] == 12
    assert got[("spark_lane_up", coder)] == 1 and got[("spark_lane_up", fast)] == 0
    assert got[("spark_lane_healthy", coder)] == 1 and got[("spark_lane_healthy", fast)] == 0
    assert got[("spark_lane_canary_passed", coder)] == 1
    assert got[("spark_lane_canary_passed", fast)] == 0
    assert got[("spark_lane_canary_age_seconds", coder)] == 1000.5 - 400.5
    assert got[("spark_nccl_passed", ())] == 1
    assert got[("spark_nccl_busbw_gbs", ())] == 0.75  # all_gather at its largest size
    assert got[("spark_nccl_age_seconds", ())] == 600
    versions = (("driver", "580.142"), ("kernel", "6.17.0-1032-nvidia"), ("toolkit", "1.19.0-1"))
    assert got[("spark_version_info", versions)] == 1
    # the lane whose canary failed, waiting to start again, is the only drift
    assert [d[:4] + d[5:] for d in drift] == [("lane", "fast", "active", "activating", "critical")]
    assert got[("spark_drifts", ())] == 1
    drifted = (
        ("expected", "active"),
        ("found", "activating"),
        ("kind", "lane"),
        ("severity", "critical"),
        ("subject", "fast"),
    )
    assert got[("spark_drift", drifted)] == 1


def test_the_canarys_exit_status_is_read_from_its_own_entry() -> None:
    """The lab's capture: the /health wait (an ExecStartPost too) exited 0, the canary 1, the
    mark's removal never ran (pid=0). Its path is operations/lanes.py's CANARY_COMMAND. An
    entry not run since the last start is no verdict; one killed (code=killed) is a failure."""
    show = captured("lab-systemctl-show-lane-canary-failed.txt")
    assert spark_metrics.canary_exit(show) == 1
    assert spark_metrics.CANARY == lanes.CANARY_COMMAND
    canary = next(line for line in show.splitlines() if "path=/usr/local/sbin/spark-lane" in line)
    passed = canary.replace("code=exited ; status=1 }", "code=exited ; status=0 }")
    assert spark_metrics.canary_exit(passed) == 0
    killed = canary.replace("code=exited ; status=1 }", "code=killed ; status=9/KILL }")
    assert spark_metrics.canary_exit(killed) == -1
    not_run = canary.replace(
        "pid=5957 ; code=exited ; status=1", "pid=0 ; code=(null) ; status=0/0"
    )
    assert spark_metrics.canary_exit(not_run) is None
    assert spark_metrics.canary_exit("ActiveState=active\n") is None


def test_a_lane_active_after_its_canary_passed(box: dict) -> None:
    show = captured("lab-systemctl-show-lane-canary-failed.txt")
    restarted = show.replace("code=exited ; status=1 }", "code=exited ; status=0 }").replace(
        "ActiveState=activating", "ActiveState=active"
    )
    got = samples(collect(box, **{"spark-lane-fast.service": restarted})[0])
    assert got[("spark_lane_up", (("lane", "fast"),))] == 1
    assert got[("spark_lane_canary_passed", (("lane", "fast"),))] == 1


def test_fabric_faults_are_drift_series(box: dict) -> None:
    """MTU 1500 set by hand, the RoCE v2 entry moved to 4 (the field's GID drift), a twin at
    100G (a switch auto-negotiating)."""
    first = box["sys"] / "class/net/enp1s0f1np1"
    (first / "mtu").write_text("1500\n")
    second = box["sys"] / "class/net/enP2p1s0f1np1"
    (second / "speed").write_text("100000\n")
    gids = box["sys"] / "class/infiniband/roceP2p1s0f1/ports/1"
    (gids / "gids/3").write_text(LINK_LOCAL + "\n")
    (gids / "gids/4").write_text(v4("c0a8:650a") + "\n")
    (gids / "gid_attrs/types/4").write_text("RoCE v2\n")
    (gids / "gid_attrs/ndevs/4").write_text("enP2p1s0f1np1\n")
    text, drift = collect(box)
    got = samples(text)
    kinds = {(d.kind, d.subject, d.found, d.severity) for d in drift}
    assert kinds == {
        ("mtu", "enp1s0f1np1", "1500", "critical"),
        ("rate", "enP2p1s0f1np1", "100000", "critical"),  # the inventory refuses it
        # Moved, not gone: NCCL selects it wherever it is, as the deploy and compliance accept.
        ("gid", "enP2p1s0f1np1", "4", "warning"),
        ("lane", "fast", "activating", "critical"),
    }
    mtu = (
        ("expected", "9000"),
        ("found", "1500"),
        ("kind", "mtu"),
        ("severity", "critical"),
        ("subject", "enp1s0f1np1"),
    )
    assert got[("spark_drift", mtu)] == 1
    assert got[("spark_drifts", ())] == 4


def test_a_slow_twin_the_inventory_accepts_is_a_warning(box: dict) -> None:
    """fabric_link_speed_low = "warn" (a pair behind a 100G switch): the twin at 100000 Mb/s is
    drift of severity warning, as the deploy goes on past it."""
    (box["sys"] / "class/net/enP2p1s0f1np1/speed").write_text("100000\n")
    expected = {**EXPECTED, "rate_low": "warn", "nccl_verdict": str(box["verdict"])}
    text, drift = spark_metrics.collect(
        expected, proc=box["proc"], sys_fs=box["sys"], command=lambda argv: None,
        health=lambda port: False, now=5600.0,
    )  # fmt: skip
    rate = [d for d in drift if d.kind == "rate"]
    assert [(d.subject, d.found, d.severity) for d in rate] == [
        ("enP2p1s0f1np1", "100000", "warning")
    ]
    labels = (
        ("expected", ">= 200000"),
        ("found", "100000"),
        ("kind", "rate"),
        ("severity", "warning"),
        ("subject", "enP2p1s0f1np1"),
    )
    assert samples(text)[("spark_drift", labels)] == 1


def test_the_collector_runs_as_installed_beside_its_twin_readings(tmp_path: Path) -> None:
    """On the box the collector and spark_twin.py sit in one directory (operations/metrics.py)
    and it runs as a script: it imports the readings from there, with the standard library."""
    from operations import metrics

    lib = tmp_path / "lib"
    lib.mkdir()
    for source, installed in (
        (metrics.COLLECTOR_SOURCE, metrics.COLLECTOR),
        (metrics.TWIN_SOURCE, metrics.TWIN),
    ):
        (lib / Path(installed).name).write_text(source.read_text())
    # -s -E: no user site-packages, no PYTHON* variables; the script's own directory is on its
    # path, as when the timer's unit runs it (python3 SCRIPT).
    done = subprocess.run(
        [sys.executable, "-s", "-E", str(lib / "spark_metrics.py"), "--help"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--expected" in done.stdout


def test_a_twin_without_its_roce_v2_entry_or_link(box: dict) -> None:
    port = box["sys"] / "class/infiniband/rocep1s0f1/ports/1"
    (port / "gid_attrs/types/3").write_text("IB/RoCE v1\n")  # the address, not as RoCE v2
    (box["sys"] / "class/net/enP2p1s0f1np1/carrier").write_text("0\n")
    (box["sys"] / "class/net/enP2p1s0f1np1/speed").write_text("-1\n")
    text, drift = collect(box)
    first = (("hca", "rocep1s0f1"), ("twin", "enp1s0f1np1"))
    assert samples(text)[("spark_twin_roce_v2_gid_index", first)] == -1
    assert ("gid", "enp1s0f1np1", "3", "none") in [d[:4] for d in drift]
    assert ("carrier", "enP2p1s0f1np1", "1", "0") in [d[:4] for d in drift]


def test_a_twin_set_down_is_a_red_drift_of_its_link_not_of_its_cable(box: dict) -> None:
    # `ip link set dev enp1s0f1np1 down`: its flags lose IFF_UP (0x1002, as a veth read after
    # it: tests/unit/test_twin.py) and the kernel refuses to read its carrier (EINVAL: read
    # as nothing); its peer's twin, still up, reads carrier 0 (not this box's).
    net = box["sys"] / "class/net/enp1s0f1np1"
    (net / "flags").write_text("0x1002\n")
    (net / "carrier").unlink()
    (net / "speed").write_text("-1\n")
    (box["sys"] / "class/net/enP2p1s0f1np1/flags").write_text("0x1003\n")
    text, drift = collect(box)
    got = samples(text)
    first = (("hca", "rocep1s0f1"), ("twin", "enp1s0f1np1"))
    second = (("hca", "roceP2p1s0f1"), ("twin", "enP2p1s0f1np1"))
    assert (got[("spark_twin_up", first)], got[("spark_twin_up", second)]) == (0, 1)
    assert got[("spark_twin_carrier", first)] == 0
    link = [d for d in drift if d.subject == "enp1s0f1np1"]
    assert link == [
        spark_metrics.Drift(
            "link", "enp1s0f1np1", "up", "down", "nmcli connection up fabric-enp1s0f1np1",
            "critical",
        )
    ]  # fmt: skip
    assert ("spark_drift", (("expected", "up"), ("found", "down"), ("kind", "link"),
            ("severity", "critical"), ("subject", "enp1s0f1np1"))) in got  # fmt: skip


def test_gb10_memory_na_and_a_failed_query(box: dict) -> None:
    """Fields a GB10 does not report ([N/A]) are left out; nvidia-smi failing is said once."""
    got = samples(collect(box, **{"nvidia-smi": "[N/A], [N/A], 0, P0, 580.142\n"})[0])
    assert ("spark_gpu_temperature_celsius", ()) not in got
    assert ("spark_gpu_power_watts", ()) not in got
    assert got[("spark_gpu_utilization_ratio", ())] == 0 and got[("spark_gpu_query_ok", ())] == 1
    got = samples(collect(box, **{"nvidia-smi": None})[0])
    assert got[("spark_gpu_query_ok", ())] == 0
    # The clock's lock is read from its unit's journal, not from the query.
    left_in = ("spark_gpu_query_ok", "spark_gpu_clock_locked_mhz")
    assert not [key for key in got if key[0].startswith("spark_gpu_") and key[0] not in left_in]


def test_below_the_floor_and_a_590_driver_drift(box: dict) -> None:
    (box["proc"] / "meminfo").write_text("MemTotal: 124000000 kB\nMemAvailable: 4194304 kB\n")
    _text, drift = collect(box, **{"nvidia-smi": "40, 4.12, 0, P8, 590.48\n"})
    found = {d[0]: d[3] for d in drift}
    assert found["memory"] == "4.0 GiB"
    assert found["driver"] == "590"


def test_no_nccl_verdict_yet(box: dict) -> None:
    box["verdict"].unlink()
    got = samples(collect(box)[0])
    assert got[("spark_nccl_verdict_present", ())] == 0
    assert ("spark_nccl_passed", ()) not in got


def test_image_pulls_are_series_and_a_stale_one_is_not_running(box: dict, tmp_path: Path) -> None:
    # Status files as files/spark_pull.py writes them (its Progress.write): one written 10 s
    # before `now` (5600), one last written 200 s before (its box rebooted), one done.
    pulls = tmp_path / "pull"
    pulls.mkdir()
    for name, state, written in (
        ("a", "pulling", 5590),
        ("b", "pulling", 5400),
        ("c", "done", 5000),
    ):
        (pulls / f"{name}.json").write_text(json.dumps({
            "image": f"nvcr.io/nvidia/{name}:1", "total": 1000, "done": 400, "rate": 50,
            "state": state, "error": "", "time": written,
        }))  # fmt: skip
    (pulls / "d.json.new").write_text("{")  # a status being written: not read
    expected = {**EXPECTED, "nccl_verdict": str(box["verdict"])}
    text, _drift = spark_metrics.collect(
        expected, proc=box["proc"], sys_fs=box["sys"], command=lambda argv: None,
        health=lambda port: False, now=5600.0, pull_dir=pulls,
    )  # fmt: skip
    got = samples(text)
    running = {name: got[("spark_image_pulling", (("image", f"nvcr.io/nvidia/{name}:1"),))]
               for name in "abc"}  # fmt: skip
    assert running == {"a": 1, "b": 0, "c": 0}
    image = (("image", "nvcr.io/nvidia/a:1"),)
    assert got[("spark_image_pull_bytes", image)] == 400
    assert got[("spark_image_pull_total_bytes", image)] == 1000
    assert got[("spark_image_pull_rate_bytes_per_second", image)] == 50


def test_the_pull_status_directory_is_the_deploys() -> None:
    from spark.box_paths import PULL_STATUS_DIR

    assert str(spark_metrics.PULL_STATUS_DIR) == PULL_STATUS_DIR


def test_label_values_are_escaped_for_the_parser() -> None:
    metrics = spark_metrics.Metrics()
    metrics.add("x_info", 1, 'help with \\ and "quotes"', image='a"b\\c\nd')
    parsed = list(text_string_to_metric_families(metrics.text()))
    assert parsed[0].samples[0].labels == {"image": 'a"b\\c\nd'}


def test_written_atomically_and_readable_by_the_exporter(tmp_path: Path) -> None:
    """Written through a temporary file in the same directory, renamed over the old one, mode
    0644 (the exporter runs as its own user: the Debian package's README.textfile)."""
    out = tmp_path / "spark.prom"
    out.write_text("old 1\n")
    spark_metrics.write_atomically(out, "new 2\n")
    assert out.read_text() == "new 2\n"
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["spark.prom"]


# --- the GPU clock's lock -------------------------------------------------------------------------

GPU_CLOCK_DRIFT = (
    "systemctl restart spark-gpu-clock-lock.service; journalctl -b -u spark-gpu-clock-lock.service"
)


def test_the_lock_is_read_from_its_units_journal_of_this_boot(box: dict) -> None:
    collect(box)
    journal = ["journalctl", "-b", "-u", "spark-gpu-clock-lock.service", "-o", "cat", "--no-pager"]
    assert journal in box["asked"]


@pytest.mark.parametrize(
    ("line", "pair"),
    [
        # Red Hat's OpenShift GPUDirect guide, `nvidia-smi -i 0 -lgc ...` in a driver pod.
        (
            'GPU clocks set to "(gpuClkMin 1740, gpuClkMax 1740)" for GPU 00000000:61:00.0',
            (1740, 1740),
        ),
        # A GB10's journal line, as capetron/gb10-cluster-bench quotes it.
        ('GPU clocks set to "(gpuClkMin 300, gpuClkMax 2200)"', (300, 2200)),
        ("All done.", None),
    ],
)  # fmt: skip
def test_locked_clocks_reads_nvidia_smis_line(line: str, pair: tuple[int, int] | None) -> None:
    assert spark_metrics.locked_clocks(line + "\n") == pair


def test_no_lock_line_this_boot_reads_0_and_is_drift(box: dict) -> None:
    # The unit's journal with systemd's lines alone (nvidia-smi's removed from the capture).
    journal = "".join(
        line for line in captured("lab-journal-gpu-clock-lock.txt").splitlines(keepends=True)
        if line.startswith(("Starting", "Finished"))
    )  # fmt: skip
    text, drift = collect(box, journalctl=journal)
    assert samples(text)[("spark_gpu_clock_locked_mhz", ())] == 0
    assert (
        "gpu_clock",
        "spark-gpu-clock-lock.service",
        "300,2200",
        "none",
        GPU_CLOCK_DRIFT,
        "critical",
    ) in drift


def test_the_last_lock_of_the_boot_counts(box: dict) -> None:
    # The capture, then the unit run again by hand with another cap (its line edited by hand).
    first = captured("lab-journal-gpu-clock-lock.txt")
    journal = first + first.replace("gpuClkMax 2200", "gpuClkMax 2400")
    text, drift = collect(box, journalctl=journal)
    assert samples(text)[("spark_gpu_clock_locked_mhz", ())] == 2400
    assert (
        "gpu_clock",
        "spark-gpu-clock-lock.service",
        "300,2200",
        "300,2400",
        GPU_CLOCK_DRIFT,
        "critical",
    ) in drift


def test_a_box_without_a_lock_neither_asks_nor_reports_it(box: dict) -> None:
    text, drift = collect(box, expected={"gpu_clock_lock": None})
    assert ("spark_gpu_clock_locked_mhz", ()) not in samples(text)
    assert not any(argv[0] == "journalctl" for argv in box["asked"])
    assert not any(kind == "gpu_clock" for kind, *_ in drift)


# Lane fast on demand (docs/on-demand.md): `systemctl show` of its unit idle and of its socket
# listening, written by hand in the form of the captures above (-p ActiveState, no timestamps).
ON_DEMAND = {
    **EXPECTED,
    "lanes": [
        EXPECTED["lanes"][0],
        EXPECTED["lanes"][1] | {"backend_port": 12102, "on_demand": True},
    ],
}
IDLE = "ActiveState=inactive\nActiveEnterTimestampMonotonic=0\n"
LISTENING = "ActiveState=active\nActiveEnterTimestampMonotonic=300000000\n"


def test_an_idle_on_demand_lane_is_up_not_running_and_no_drift(box: dict) -> None:
    changes = {"spark-lane-fast.service": IDLE, "spark-ondemand-fast.socket": LISTENING}
    text, drift = collect(box, ON_DEMAND, **changes)
    got = samples(text)
    fast = (("lane", "fast"),)
    assert got[("spark_lane_on_demand", fast)] == 1
    assert got[("spark_lane_up", fast)] == 1
    assert got[("spark_lane_running", fast)] == 0
    # Idle: neither its /health nor a canary is read (a request to its socket would start it).
    assert ("spark_lane_healthy", fast) not in got
    assert ("spark_lane_canary_passed", fast) not in got
    assert [d for d in drift if d.subject == "fast"] == []
    assert ("spark_lane_on_demand", (("lane", "coder"),)) not in got


def test_a_running_on_demand_lane_is_checked_on_its_servers_own_port(box: dict) -> None:
    running = "ActiveState=active\nActiveEnterTimestampMonotonic=400500000\n"
    changes = {"spark-lane-fast.service": running, "spark-ondemand-fast.socket": LISTENING}
    ports: list[int] = []

    def health(port: int) -> bool:
        ports.append(port)
        return True

    expected = {**ON_DEMAND, "nccl_verdict": str(box["verdict"])}
    outputs = {**box["outputs"], **changes}
    text, _ = spark_metrics.collect(
        expected, proc=box["proc"], sys_fs=box["sys"], now=5600.0, health=health,
        command=lambda argv: outputs.get(argv[2] if argv[0] == "systemctl" else argv[0]),
    )  # fmt: skip
    got = samples(text)
    assert got[("spark_lane_running", (("lane", "fast"),))] == 1
    assert got[("spark_lane_healthy", (("lane", "fast"),))] == 1
    assert ports == [11101, 12102]  # the coder's loopback port, fast's server behind its socket


@pytest.mark.parametrize(
    ("lane", "socket", "found"),
    [
        (IDLE, "ActiveState=inactive\n", "not listening"),
        ("ActiveState=failed\n", LISTENING, "failed"),
    ],
)
def test_an_on_demand_lane_without_its_socket_or_failed_is_down_and_drift(
    box: dict, lane: str, socket: str, found: str
) -> None:
    changes = {"spark-lane-fast.service": lane, "spark-ondemand-fast.socket": socket}
    text, drift = collect(box, ON_DEMAND, **changes)
    assert samples(text)[("spark_lane_up", (("lane", "fast"),))] == 0
    assert [d.found for d in drift if d.subject == "fast"] == [found]

#!/usr/bin/python3
"""The box's own figures for the node exporter's textfile collector (issue 28).

    spark_metrics.py --expected /etc/spark/metrics/expected.json \
        --out /var/lib/prometheus/node-exporter/spark.prom

Run by a systemd timer (operations/metrics.py). Reads what the box has (memory, each lane's and
the cluster rank's container memory, the GPU figures GB10 reports and its clock's lock, each
fabric twin, the lanes, the NCCL test's verdict, image pulls, versions) and compares it with the
box's plan, which the deploy writes to the root-only EXPECTED file: every value that differs is
its own `spark_drift` series and a line on stdout (the journal) naming it and what to run. The
file is written whole or not at all: a temporary file in the same directory, then a rename (the
node exporter's textfile collector documentation: "atomically", or it may read a half-written
file). The standard library alone, like files/nccl_check.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

# The twins' readings, shared with the deploy and compliance (spark/twin.py in the repository),
# installed beside this file on the box (operations/metrics.py): a script's own directory is on
# its path. Compliance imports this file from the repository (its GPU clock reading), where the
# module is spark/twin.py itself.
try:
    import spark_twin as twin
except ModuleNotFoundError:
    from spark import twin

GIB = 1024**3
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"  # an unused GID table entry
# The RoCE error and congestion counters of an mlx5 port (ConnectX-7), as the kernel's mlx5
# driver names them under /sys/class/infiniband/<hca>/ports/1/hw_counters/
# (drivers/infiniband/hw/mlx5/counters.c: the retransmission, out-of-sequence and completion
# error q-counters, and the congestion counters of "IB/mlx5: Support congestion related
# counters"). A counter the box lacks is left out.
ROCE_COUNTERS = (
    "out_of_buffer",  # drops: no receive WQE posted
    "out_of_sequence",  # packets with a PSN out of sequence (loss on the wire)
    "packet_seq_err",  # NAKs for a sequence error received
    "duplicate_request",  # requests received again (the peer retransmitted)
    "local_ack_timeout_err",  # ACK timeouts at the sender: retransmissions
    "rnr_nak_retry_err",  # receiver-not-ready retries exhausted
    "implied_nak_seq_err",  # sequence errors implied by a response
    "req_cqe_error",
    "resp_cqe_error",
    "rx_icrc_encapsulated",  # RoCE packets with a bad ICRC
    "np_cnp_sent",  # congestion: CNPs sent for ECN-marked packets
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",  # congestion: CNPs the sender slowed down for
)
# nvidia-smi --query-gpu fields a GB10 reports (its table: temperature, performance state, power
# draw and utilisation; memory is "Not Supported", [N/A] in CSV: NVIDIA/k8s-device-plugin#1482),
# and the loaded driver's version, as operations/driver.py reads it.
GPU_FIELDS = ("temperature.gpu", "power.draw", "utilization.gpu", "pstate", "driver_version")
NOT_REPORTED = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")
# What `nvidia-smi -lgc MIN,MAX` prints for each GPU it locked, before "All done." (Red Hat's
# OpenShift GPUDirect guide's example output; a GB10's journal line as
# capetron/gb10-cluster-bench docs/power-offs-and-clock-lock.md quotes it). NVML has no getter
# for a locked clock and `nvidia-smi -q -d CLOCK` does not show it (driver 580.178.04, same
# source): the lock unit's journal line of this boot is the reading, here and in compliance.
CLOCKS_SET = re.compile(r'GPU clocks set to "\(gpuClkMin (\d+), gpuClkMax (\d+)\)"')
CONTAINER_PREFIXES = ("spark-lane-", "spark-ray")  # the lanes' containers; Ray's holds ranks
HEALTH_TIMEOUT_S = 2
# The answer canary every lane's unit runs after /health (operations/lanes.py CANARY_COMMAND).
CANARY = "/usr/local/sbin/spark-lane-canary"
# How `systemctl show -p ExecStartPost` ends a command's entry: its last run (pid 0: none since
# the unit's last start, when systemd clears every command's status: src/core/service.c).
RUN = re.compile(r"pid=(\d+) ; code=(\S+) ; status=(\d+)")
# Each image pull's status file (files/spark_pull.py --status; spark/box_paths.py
# PULL_STATUS_DIR). A pull writes it every 2 s while docker reports progress: one not written
# for STALE_PULL_S stopped without saying so (its box rebooted).
PULL_STATUS_DIR = Path("/var/lib/spark/pull")
STALE_PULL_S = 120


class Drift(NamedTuple):
    """A value that differs from the box's plan, what to run, and how it is judged: "critical"
    (the box is red), or "warning" (shown; what the inventory accepts, or NCCL does)."""

    kind: str
    subject: str
    expected: str
    found: str
    fix: str
    severity: str = "critical"


@dataclass
class Family:
    kind: str  # gauge, counter
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


class Metrics:
    """Metric families in the Prometheus text exposition format (version 0.0.4)."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def add(self, name: str, value: float, help: str, _type: str = "gauge", **labels: str) -> None:
        family = self.families.setdefault(name, Family(_type, help))
        family.samples.append((labels, value))

    def text(self) -> str:
        lines = []
        for name, family in self.families.items():
            lines.append(f"# HELP {name} {escape(family.help, quote=False)}")
            lines.append(f"# TYPE {name} {family.kind}")
            for labels, value in family.samples:
                inner = ",".join(f'{key}="{escape(str(v))}"' for key, v in labels.items())
                lines.append(
                    f"{name}{{{inner}}} {number(value)}" if inner else f"{name} {number(value)}"
                )
        return "\n".join(lines) + "\n"


def escape(text: str, quote: bool = True) -> str:
    """A label value (or a HELP text, without quotes) as the text format escapes it."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def number(value: float) -> str:
    if value != value:
        return "NaN"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def run(command: list[str], timeout: float = 10) -> str | None:
    """A command's stdout, or None where it is missing or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


# --- memory -----------------------------------------------------------------------------------


def meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo's fields in bytes (the kernel prints kB, meaning KiB: proc(5))."""
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return fields


def memory(metrics: Metrics, proc: Path, expected: dict, drift: list[Drift]) -> None:
    fields = meminfo(read(proc / "meminfo") or "")
    floor = expected["floor_gib"] * GIB
    metrics.add("spark_memory_guard_floor_bytes", floor, "The memory guard's floor of MemAvailable")
    for key, name in (("MemAvailable", "available"), ("MemTotal", "total")):
        if key in fields:
            metrics.add(f"spark_memory_{name}_bytes", fields[key], f"/proc/meminfo {key}")
    if fields.get("MemAvailable", floor) < floor:
        drift.append(
            Drift("memory", "MemAvailable", f">= {expected['floor_gib']:g} GiB",
             f"{fields['MemAvailable'] / GIB:.1f} GiB",
             "the memory guard stops the lowest-priority lane; journalctl -u spark-memguard")
        )  # fmt: skip


def container_cgroups(sys_fs: Path, containers: dict[str, str]) -> dict[str, Path]:
    """Each container's cgroup directory, by name: docker's systemd cgroup driver puts it in
    system.slice/docker-<id>.scope, its cgroupfs driver in docker/<id> (docker's runtime
    metrics documentation)."""
    found = {}
    for name, cid in containers.items():
        for candidate in (f"system.slice/docker-{cid}.scope", f"docker/{cid}"):
            path = sys_fs / "fs/cgroup" / candidate
            if (path / "memory.current").exists():
                found[name] = path
                break
    return found


def containers_of(docker_ps: str) -> dict[str, str]:
    """`docker ps --no-trunc --format '{{.ID}} {{.Names}}'`: the deploy's containers, by name."""
    found = {}
    for line in docker_ps.splitlines():
        cid, _, name = line.strip().partition(" ")
        if name.startswith(CONTAINER_PREFIXES):
            found[name] = cid
    return found


def container_memory(metrics: Metrics, sys_fs: Path, docker_ps: str | None) -> None:
    """Each lane's and the Ray node's container memory from its cgroup (memory.current: the
    cgroup v2 documentation), the per-process view GB10's driver cannot give."""
    for name, path in sorted(container_cgroups(sys_fs, containers_of(docker_ps or "")).items()):
        current = read(path / "memory.current")
        if current and current.isdigit():
            metrics.add(
                "spark_container_memory_bytes",
                int(current),
                "A lane's (or the Ray node's) container memory: its cgroup's memory.current",
                container=name,
            )


# --- GPU --------------------------------------------------------------------------------------


def gpu(metrics: Metrics, csv: str | None) -> str:
    """nvidia-smi --query-gpu=GPU_FIELDS --format=csv,noheader,nounits; a field the GPU does
    not report ([N/A]) is left out. Returns the loaded driver's version ("" without one)."""
    values = [value.strip() for value in (csv or "").splitlines()[0].split(",")] if csv else []
    ok = len(values) == len(GPU_FIELDS)
    metrics.add("spark_gpu_query_ok", int(ok), "nvidia-smi answered the query")
    if not ok:
        return ""
    got = dict(zip(GPU_FIELDS, values, strict=True))
    for key, name, scale, help in (
        ("temperature.gpu", "spark_gpu_temperature_celsius", 1, "GPU temperature"),
        ("power.draw", "spark_gpu_power_watts", 1, "GPU power draw"),
        ("utilization.gpu", "spark_gpu_utilization_ratio", 0.01, "GPU utilisation (0-1)"),
    ):
        if got[key] not in NOT_REPORTED:
            with contextlib.suppress(ValueError):  # a value in a form not known: left out
                metrics.add(name, float(got[key]) * scale, help)
    if (pstate := got["pstate"]) not in NOT_REPORTED and re.fullmatch(r"P\d+", pstate):
        metrics.add("spark_gpu_pstate", int(pstate[1:]), "GPU performance state (0: highest)")
    return got["driver_version"]


def clock_journal_command(unit: str) -> list[str]:
    """The lock unit's journal of this boot, its messages alone (journalctl(1): -b, -u, -o cat)."""
    return ["journalctl", "-b", "-u", unit, "-o", "cat", "--no-pager"]


def locked_clocks(journal: str | None) -> tuple[int, int] | None:
    """The (min, max) MHz of the last lock nvidia-smi reported in ``journal``; None: none."""
    found = CLOCKS_SET.findall(journal or "")
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def gpu_clock(metrics: Metrics, expected: dict, journal: str | None, drift: list[Drift]) -> None:
    """The GPU clock's lock as its unit's journal of this boot reports it (the plan's unit
    where the plan locks it), against the plan's range."""
    lock = expected["gpu_clock_lock"]
    if lock is None:
        return
    found = locked_clocks(journal)
    metrics.add(
        "spark_gpu_clock_locked_mhz", found[1] if found else 0,
        "The GPU clock's locked maximum, from its unit's journal this boot (0: not locked)",
    )  # fmt: skip
    want = (lock["min_mhz"], lock["max_mhz"])
    if found != want:
        unit, read = lock["unit"], "{},{}".format(*found) if found else "none"
        fix = f"systemctl restart {unit}; journalctl -b -u {unit}"
        drift.append(Drift("gpu_clock", unit, "{},{}".format(*want), read, fix))


# --- fabric -----------------------------------------------------------------------------------


def gid_entries(port: Path) -> list[dict[str, str]]:
    """A device port's non-empty GID entries: index, gid, type and ndev (gids/N,
    gid_attrs/types/N, gid_attrs/ndevs/N: sysfs-class-infiniband; an unused entry's type and
    ndev cannot be read)."""
    gids = port / "gids"
    if not gids.is_dir():
        return []
    entries = []
    for entry in gids.iterdir():
        gid = read(entry)
        if entry.name.isdigit() and gid and gid != ZERO_GID:
            kind, ndev = (
                read(port / "gid_attrs/types" / entry.name),
                read(port / "gid_attrs/ndevs" / entry.name),
            )
            entries.append({"index": entry.name, "gid": gid, "type": kind, "ndev": ndev})
    return entries


def fabric(metrics: Metrics, sys_fs: Path, expected: dict, drift: list[Drift]) -> None:
    """Each twin's figures, read and judged as the deploy and compliance read and judge them
    (spark_twin: the deploy's spark/twin.py, installed beside this file)."""
    for each in expected["twins"]:
        ifname, hca, labels = (
            each["ifname"],
            each["hca"],
            {"twin": each["ifname"], "hca": each["hca"]},
        )
        down = twin.set_down(read(Path(twin.flags_file(ifname, str(sys_fs)))))
        metrics.add("spark_twin_up", int(not down), "The twin is set up (0: set down)", **labels)
        carrier = read(sys_fs / twin.NET / ifname / "carrier")
        metrics.add("spark_twin_carrier", int(carrier == "1"), "The twin has a link", **labels)
        rate = twin.rate(read(Path(twin.rate_file(ifname, str(sys_fs)))))
        metrics.add("spark_twin_rate_mbps", rate, "The twin's link rate (-1: no link)", **labels)
        mtu = twin.mtu(read(Path(twin.mtu_file(ifname, str(sys_fs)))))
        metrics.add("spark_twin_mtu_bytes", mtu, "The twin's MTU (0: no interface)", **labels)
        port = Path(twin.port_dir(hca, str(sys_fs)))
        index = twin.own_roce_v2_index(gid_entries(port), ifname, each["address"])
        metrics.add(
            "spark_twin_roce_v2_gid_index",
            -1 if index is None else index,
            "Index of the twin's RoCE v2 IPv4 GID entry (-1: none)",
            **labels,
        )
        state = read(port / "state")  # "4: ACTIVE" (sysfs-class-infiniband)
        if state:
            metrics.add(
                "spark_rdma_port_active",
                int(state.endswith("ACTIVE")),
                "RDMA port state is ACTIVE",
                **labels,
            )
        for counter in ROCE_COUNTERS:
            value = read(port / "hw_counters" / counter)
            if value and value.isdigit():
                metrics.add(
                    "spark_roce_events_total", int(value),
                    "RoCE error and congestion counters of the port (mlx5 hw_counters)",
                    "counter", counter=counter, **labels,
                )  # fmt: skip
        if mtu != expected["mtu"]:
            # The profile holds the MTU (operations/nmcli.py): activating it again sets it.
            fix = f"nmcli connection up fabric-{ifname}"
            drift.append(Drift("mtu", ifname, str(expected["mtu"]), str(mtu), fix))
        if down:
            # Set down by hand (ip link set down): its profile stays "activated" in
            # NetworkManager; activating it again sets it up, as the deploy does. No carrier
            # nor rate follows from it: the cable is not the cause.
            fix = f"nmcli connection up fabric-{ifname}"
            drift.append(Drift("link", ifname, "up", "down", fix))
        elif carrier != "1":
            drift.append(
                Drift("carrier", ifname, "1", carrier or "none", "check the cable (ip link)")
            )
        elif twin.rate_below(rate, expected["rate_mbps"]):
            drift.append(
                Drift("rate", ifname, f">= {expected['rate_mbps']}", str(rate),
                      "a switch port auto-negotiating 100G, a degraded ConnectX start, the cable",
                      twin.rate_severity(expected["rate_low"]))
            )  # fmt: skip
        if index is None:
            fix = f"ip -4 address show {ifname}; nmcli connection up fabric-{ifname}"
            drift.append(Drift("gid", ifname, str(expected["gid_index"]), "none", fix))
        elif index != expected["gid_index"]:
            # Shown, not red: the deploy and compliance accept it, as NCCL does.
            drift.append(
                Drift("gid", ifname, str(expected["gid_index"]), str(index),
                      "NCCL selects it; a fixed NCCL_IB_GID_INDEX elsewhere would not", "warning")
            )  # fmt: skip


# --- lanes, NCCL ------------------------------------------------------------------------------


def unit_state(show: str) -> dict[str, str]:
    """`systemctl show UNIT -p ActiveState -p ActiveEnterTimestampMonotonic` as a dict."""
    return dict(line.split("=", 1) for line in show.splitlines() if "=" in line)


def canary_exit(show: str) -> int | None:
    """The canary's exit status in the lane's last start (non-zero, or killed: failed), from
    its ExecStartPost entry; None where it has not run since the unit last started."""
    for line in show.splitlines():
        if line.startswith("ExecStartPost=") and f"path={CANARY} " in line:
            run = RUN.search(line)
            if run and run[1] != "0":
                return int(run[3]) if run[2] == "exited" else -1
    return None


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=HEALTH_TIMEOUT_S):
            return True
    except Exception:  # anything but an answer is not healthy
        return False


def lanes(
    metrics: Metrics,
    expected: dict,
    show: Callable[[str], str | None],
    health: Callable[[int], bool],
    uptime_s: float,
    drift: list[Drift],
) -> None:
    """Each lane: its unit active (up), /health on loopback (healthy), and the canary's last
    verdict and age: the canary runs after /health in the unit's start (ExecStartPost,
    templates/vllm-lane.service.j2), and systemd keeps its exit status until the next start,
    through Restart='s wait too; an active unit passed it when it became active."""
    for lane in expected["lanes"]:
        name = lane["name"]
        show_text = show(f"spark-lane-{name}.service") or ""
        state = unit_state(show_text)
        active = state.get("ActiveState")
        labels = {"lane": name}
        metrics.add(
            "spark_lane_info", 1, "A lane of the plan", lane=name, engine=lane["engine"],
            served_name=lane["served_name"], image=lane["image"], port=str(lane["port"]),
        )  # fmt: skip
        if lane.get("on_demand"):
            if not on_demand_lane(metrics, name, active, show, drift):
                continue
        else:
            metrics.add(
                "spark_lane_up", int(active == "active"), "The lane's unit is active", **labels
            )
        if lane["backend_port"] is not None:
            ok = active == "active" and health(lane["backend_port"])
            metrics.add("spark_lane_healthy", int(ok), "The lane answers /health", **labels)
        status = canary_exit(show_text)
        if status is not None or active == "active":
            passed = active == "active" if status is None else status == 0
            metrics.add(
                "spark_lane_canary_passed", int(passed),
                "The canary's verdict at the lane's last start", **labels,
            )  # fmt: skip
        entered = state.get("ActiveEnterTimestampMonotonic", "0")
        if active == "active" and entered.isdigit() and int(entered):
            age = max(0.0, uptime_s - int(entered) / 1e6)
            metrics.add(
                "spark_lane_canary_age_seconds", age, "Since the canary last passed", **labels
            )
        if active != "active":
            drift.append(
                Drift("lane", name, "active", active or "unknown",
                 f"journalctl -u spark-lane-{name}; systemctl start spark-lane-{name}")
            )  # fmt: skip


def on_demand_lane(
    metrics: Metrics,
    name: str,
    active: str | None,
    show: Callable[[str], str | None],
    drift: list[Drift],
) -> bool:
    """An on-demand lane (docs/on-demand.md) is inactive while idle, by design: it is up while
    its socket listens (a request starts it) and its unit has not failed; whether it runs now is
    spark_lane_running. False: idle, nothing more to read of it (no /health, no canary)."""
    socket = f"spark-ondemand-{name}.socket"
    listening = unit_state(show(socket) or "").get("ActiveState") == "active"
    labels = {"lane": name}
    metrics.add(
        "spark_lane_on_demand", 1, "The lane is started by requests, stopped idle", **labels
    )
    metrics.add(
        "spark_lane_up", int(listening and active != "failed"),
        "The lane's unit is active (on demand: its socket listens, its unit not failed)", **labels,
    )  # fmt: skip
    metrics.add("spark_lane_running", int(active == "active"), "The lane's unit runs", **labels)
    if not listening:
        drift.append(
            Drift("lane", name, "socket listening", "not listening",
             f"journalctl -u {socket}; systemctl start {socket}")
        )  # fmt: skip
    elif active == "failed":
        drift.append(
            Drift("lane", name, "inactive or active", "failed",
             f"journalctl -u spark-lane-{name}; systemctl reset-failed spark-lane-{name}")
        )  # fmt: skip
    return active == "active"


def nccl(metrics: Metrics, verdict_file: Path, now: float) -> None:
    """The NCCL test's kept verdict (files/nccl_check.py report): passed, the all_gather bus
    bandwidth at its largest size, and its age."""
    try:
        verdict = json.loads(verdict_file.read_text())
        age = now - verdict_file.stat().st_mtime
    except (OSError, ValueError):
        metrics.add("spark_nccl_verdict_present", 0, "The NCCL test has a verdict on the box")
        return
    metrics.add("spark_nccl_verdict_present", 1, "The NCCL test has a verdict on the box")
    metrics.add(
        "spark_nccl_passed", int(verdict.get("passed") is True), "The NCCL test's last verdict"
    )
    metrics.add("spark_nccl_age_seconds", max(0.0, age), "Since the NCCL test's last verdict")
    gathers = [row for row in verdict.get("rows", []) if row.get("op") == "all_gather"]
    if gathers:
        largest = max(gathers, key=lambda row: row["bytes"])
        metrics.add(
            "spark_nccl_busbw_gbs", largest["busbw"],
            "all_gather bus bandwidth at the largest size (GB/s, 10^9 bytes)",
        )  # fmt: skip


def pulls(metrics: Metrics, directory: Path, now: float) -> None:
    """Each image's last pull on the box (its status file): bytes downloaded, the registry's
    total, the rate, and whether it is running now."""
    for path in sorted(directory.glob("*.json")):
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        image = str(status.get("image", path.stem))
        running = status.get("state") == "pulling" and now - status.get("time", 0) < STALE_PULL_S
        metrics.add(
            "spark_image_pull_bytes", status.get("done", 0),
            "Bytes of the image downloaded by its last pull", image=image,
        )  # fmt: skip
        metrics.add(
            "spark_image_pull_total_bytes", status.get("total", 0),
            "Bytes of the image's layers, from its registry's manifest", image=image,
        )  # fmt: skip
        metrics.add(
            "spark_image_pull_rate_bytes_per_second", status.get("rate", 0),
            "The image's last pull's mean rate", image=image,
        )  # fmt: skip
        metrics.add("spark_image_pulling", int(running), "The image is being pulled", image=image)


# --- versions, drift --------------------------------------------------------------------------


def versions(
    metrics: Metrics,
    proc: Path,
    expected: dict,
    driver: str,
    toolkit: str | None,
    drift: list[Drift],
) -> None:
    metrics.add(
        "spark_version_info", 1, "Versions on the box",
        driver=driver, kernel=read(proc / "sys/kernel/osrelease") or "",
        toolkit=(toolkit or "").strip(),
    )  # fmt: skip
    branch = driver.partition(".")[0]
    if branch != str(expected["driver_branch"]):
        drift.append(
            Drift("driver", "branch", str(expected["driver_branch"]), branch or "none",
             "the deploy stops and says the way back (purge, install, reboot)")
        )  # fmt: skip


def report_drift(metrics: Metrics, drift: list[Drift]) -> None:
    for each in drift:
        metrics.add(
            "spark_drift", 1, "A value that differs from the box's plan",
            kind=each.kind, subject=each.subject, expected=each.expected, found=each.found,
            severity=each.severity,
        )  # fmt: skip
    metrics.add("spark_drifts", len(drift), "How many values differ from the box's plan")


def collect(
    expected: dict,
    *,
    proc: Path = Path("/proc"),
    sys_fs: Path = Path("/sys"),
    command: Callable[[list[str]], str | None] = run,
    health: Callable[[int], bool] = healthy,
    now: float | None = None,
    pull_dir: Path = PULL_STATUS_DIR,
) -> tuple[str, list[Drift]]:
    """The text for the textfile collector, and the drift found (kind, subject, expected,
    found, what to run)."""
    now = time.time() if now is None else now
    metrics, drift = Metrics(), []
    memory(metrics, proc, expected, drift)
    container_memory(
        metrics, sys_fs, command(["docker", "ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}"])
    )
    driver = gpu(
        metrics,
        command(
            ["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]
        ),
    )
    lock = expected["gpu_clock_lock"]
    journal = command(clock_journal_command(lock["unit"])) if lock else None
    gpu_clock(metrics, expected, journal, drift)
    fabric(metrics, sys_fs, expected, drift)
    uptime = float((read(proc / "uptime") or "0").split()[0])

    def show(unit: str) -> str | None:
        properties = ["-p", "ActiveState", "-p", "ActiveEnterTimestampMonotonic"]
        properties += ["-p", "ExecStartPost"]
        return command(["systemctl", "show", unit, *properties])

    lanes(metrics, expected, show, health, uptime, drift)
    if expected["nccl"]:
        nccl(metrics, Path(expected["nccl_verdict"]), now)
    pulls(metrics, pull_dir, now)
    toolkit = command(["dpkg-query", "-W", "-f", "${Version}", "nvidia-container-toolkit"])
    versions(metrics, proc, expected, driver, toolkit, drift)
    report_drift(metrics, drift)
    metrics.add("spark_metrics_timestamp_seconds", now, "When the collector last wrote")
    return metrics.text(), drift


def write_atomically(out: Path, text: str) -> None:
    """A temporary file in the same directory, renamed over ``out``: the exporter reads the old
    file or the new one, never half of one."""
    fd, partial = tempfile.mkstemp(prefix=".spark-", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.chmod(partial, 0o644)
        os.replace(partial, out)
    except BaseException:
        os.unlink(partial)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expected", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    text, drift = collect(json.loads(args.expected.read_text()))
    write_atomically(args.out, text)
    for each in drift:  # the journal's line for each
        print(
            f"drift: {each.kind} {each.subject}: {each.found}, the plan says {each.expected};"
            f" {each.fix}" + (" (accepted: a warning)" if each.severity == "warning" else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fabric's proof: real NCCL collectives between the boxes, read back from NCCL's own log.

Runs where NCCL is: inside the serving image on each box (one rank per box), or on any host
with PyTorch and several GPUs (one rank per GPU). Only the `rank` step needs PyTorch; `report`
is the standard library alone, so the verdict can be read anywhere.

    nccl_check.py rank   --out DIR [--max-bytes N]   # one rank: RANK, WORLD_SIZE, MASTER_ADDR,
                                                    # MASTER_PORT, LOCAL_RANK from the environment
    nccl_check.py local  --ranks N --out DIR [...]   # N ranks on this host, one per GPU
    nccl_check.py report --out DIR [--expect-hca A,B] [--min-busbw GBPS] [--transport NET/IB]
                                                    # [--key K]: K kept in DIR/verdict.json
                                                    # [--image I]: the image the ranks ran in

Each rank runs all_gather and all_reduce (float32) from 1 MiB to --max-bytes, 4x apart, times
them as nccl-tests does (warm-up, then the mean of timed iterations, averaged over the ranks),
checks every result (nccl-tests' "#wrong"), and every rank writes DIR/timings.json. NCCL writes its
INFO log to DIR/nccl.<host>.<pid>.log (NCCL_DEBUG_FILE), and the rank the architecture it runs on
to DIR/rank.<host>.<pid>.json; at the end every rank hands both to the others, so every rank's
DIR holds them all. `report` reads them and prints, per size, NCCL's algorithm and the bus
bandwidth; per rank, the transport of every channel; and the cluster's verdict (every rank
judged: an NCCL known to deadlock on the rank's architecture fails it too), exit status 0 only
on a pass.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

OPS = ("all_gather", "all_reduce")
FLOAT_BYTES = 4  # float32, nccl-tests' default data type
MIN_BYTES = 1 << 20
SIZE_STEP = 4
DEFAULT_MAX_BYTES = 1 << 30  # the "up to at least 1 GiB"
# nccl-tests' defaults (-w 5, -n 20; nccl-tests README "Arguments").
WARMUP_ITERS, TIMED_ITERS = 5, 20

# NCCL reads these (NCCL docs, "Environment Variables": NCCL_DEBUG, NCCL_DEBUG_FILE with %h host
# and %p pid, NCCL_DEBUG_SUBSYS). INIT logs the channels' transports ("Channel 00/0 : 0[0] ->
# 1[0] [send] via NET/IB/0"), NET the network chosen ("NET/IB : Using [0]rocep1s0f1:1/RoCE"),
# ENV the variables NCCL read, TUNING the algorithm per collective (rank 0 only; NCCL
# src/enqueue.cc: "%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}=...").
NCCL_LOG_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV,TUNING",
}
LOG_GLOB = "nccl.*.log"
# What a rank says of itself beside NCCL's log: the architecture it runs on ({"machine": ...}).
RANK_GLOB = "rank.*.json"

# NCCL before 2.29.3 deadlocks silently on aarch64 (a Spark's Grace CPU): ncclProxyGetPostedOps
# hands freed proxy-op slots back with a weak compare-exchange whose loop tests the value, not
# the result, so a spurious failure loses them; once a rank's pool is empty it spins forever in
# ncclLocalOpAppend, no error, no timeout (marin-community/marin#7344, bisected on the aarch64
# nvidia-nccl-cu13 wheels: 2.28.9 and 2.29.2 deadlock, 2.29.3 and 2.30.7 do not; NVIDIA/nccl#2353;
# NCCL v2.29.3-1 release notes: "Fixes CAS usage in case of weak failure which was causing a hang
# on ARM"). Our check's few thousand operations rarely reach it: the version decides.
DEADLOCK_MACHINE = "aarch64"
DEADLOCK_FIXED_IN = (2, 29, 3)
DEADLOCK_WHY = (
    "NCCL before 2.29.3 deadlocks silently on aarch64: a weak compare-exchange in its proxy-op"
    " pool leaks slots until a rank spins forever, no error, no timeout (NVIDIA/nccl#2353,"
    " marin-community/marin#7344; fixed in NCCL 2.29.3)"
)

# Bus bandwidth from algorithm bandwidth: nccl-tests doc/PERFORMANCE.md. S is the size of the
# whole result (for all_gather: every rank's share together).
BUS_FACTOR = {
    "all_gather": lambda n: (n - 1) / n,
    "all_reduce": lambda n: 2 * (n - 1) / n,
}
NCCL_FUNC = {"all_gather": "AllGather", "all_reduce": "AllReduce"}


def sizes(max_bytes: int) -> list[int]:
    out, size = [], MIN_BYTES
    while size <= max_bytes:
        out.append(size)
        size *= SIZE_STEP
    return out


def bus_bandwidth(op: str, size: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes, as nccl-tests prints them)."""
    algbw = size / seconds / 1e9
    return algbw, algbw * BUS_FACTOR[op](ranks)


# --- one rank -------------------------------------------------------------------------------


def run_rank(out: Path, max_bytes: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(rank_environment(out))  # before NCCL starts: it reads them once
    # Where NCCL runs: the container's architecture is the box's (an image runs natively).
    rank_file = out / RANK_GLOB.replace("*", f"{socket.gethostname()}.{os.getpid()}")
    rank_file.write_text(json.dumps({"machine": platform.machine()}))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    rows = []
    for op in OPS:
        for size in sizes(max_bytes):
            count = size // FLOAT_BYTES
            share = count // world
            if op == "all_gather":
                send = torch.full((share,), float(rank + 1), device="cuda")
                recv = torch.empty((share * world,), device="cuda")
                # rank r's share holds r + 1 everywhere
                owner = torch.arange(1, world + 1, device="cuda", dtype=recv.dtype).unsqueeze(1)

                def collective(send=send, recv=recv) -> None:
                    dist.all_gather_into_tensor(recv, send)
            else:
                recv = torch.ones((count,), device="cuda")

                def collective(recv=recv) -> None:
                    dist.all_reduce(recv)

            for _ in range(WARMUP_ITERS):
                collective()
            torch.cuda.synchronize()
            dist.barrier()
            started = time.perf_counter()
            for _ in range(TIMED_ITERS):
                collective()
            torch.cuda.synchronize()
            seconds = torch.tensor([(time.perf_counter() - started) / TIMED_ITERS], device="cuda")
            if op == "all_gather":
                wrong_count = (recv.view(world, share) != owner).sum()
            else:  # one more, from ones, to check the sum
                recv.fill_(1.0)
                collective()
                wrong_count = (recv != world).sum()
            wrong = wrong_count.reshape(1)
            dist.all_reduce(seconds)  # nccl-tests' default: the time averaged over the ranks
            dist.all_reduce(wrong)
            rows.append(
                {
                    "op": op,
                    "bytes": share * world * FLOAT_BYTES,
                    "seconds": seconds.item() / world,
                    "wrong": int(wrong.item()),
                }
            )
    share_logs(dist, out, world)
    # Every rank keeps the timings (all of them have the averages) beside every rank's log.
    timings = {
        "ranks": world,
        "hosts": _hosts(dist, world),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "rows": rows,
    }
    (out / "timings.json").write_text(json.dumps(timings, indent=1))
    dist.destroy_process_group()


def share_logs(dist, out: Path, world: int) -> None:
    """Every rank's NCCL log (and its rank file) into every rank's ``out``: each box's report
    then judges the whole cluster's run, so a box whose own rank did well does not pass when a
    peer's did not (a twin left out on one box, a fallback on one side). NCCL writes its log
    line by line (NVIDIA/nccl src/debug.cc: setvbuf _IOLBF), so it is whole up to here."""
    mine = {path.name: path.read_text(errors="replace") for path in _own_files(out)}
    everyone: list[dict[str, str] | None] = [None] * world
    dist.all_gather_object(everyone, mine)
    for logs in everyone:
        for name, text in (logs or {}).items():
            if not (out / name).exists():  # `local`: the ranks share one ``out`` already
                (out / name).write_text(text)


def _own_files(out: Path) -> list[Path]:
    """This process's NCCL log and rank file: NCCL_DEBUG_FILE's %p is the process id
    (rank_environment)."""
    return sorted(
        path
        for glob in (LOG_GLOB, RANK_GLOB)
        for path in out.glob(glob.replace("*", f"*.{os.getpid()}"))
    )


def _hosts(dist, world: int) -> list[str]:
    names: list[str | None] = [None] * world
    dist.all_gather_object(names, socket.gethostname())
    return [str(name) for name in names]


def rank_environment(out: Path) -> dict[str, str]:
    """NCCL's log settings for a rank; a value the user set wins."""
    env = dict(NCCL_LOG_ENV, NCCL_DEBUG_FILE=str(out / "nccl.%h.%p.log"))
    return env | {key: os.environ[key] for key in env if key in os.environ}


def run_local(ranks: int, out: Path, max_bytes: int, port: int) -> int:
    """`ranks` processes on this host, one per GPU, rendezvous on loopback."""
    base = dict(os.environ) | {
        "WORLD_SIZE": str(ranks),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "rank", "--out", str(out), "--max-bytes", str(max_bytes)],
            env=base | {"RANK": str(rank), "LOCAL_RANK": str(rank)},
        )
        for rank in range(ranks)
    ]
    return max(proc.wait() for proc in procs)


# --- reading NCCL's log ---------------------------------------------------------------------

# "spark-1:432:463 [0] NCCL INFO ..." (host:pid:tid [device]; NCCL src/debug.cc); a WARN has a
# "[date time] " before it and "file.cc:line " before "NCCL"; launchers such as mpirun put "[rank] "
# in front of every line, and Ray "(actor pid=N, ip=A) " (a Spark pair's vLLM workers, quoted in
# tests/unit/captured/public-spark-pair-ray-hpcx.log).
LINE = re.compile(
    r"^(?:\[[^\]]*\] |\([^)]*\) )*(?P<host>[^\s:]+):(?P<pid>\d+):\d+ \[\d+\] (?:\S+:\d+ )?"
    r"NCCL (?P<level>INFO|WARN) (?P<msg>.*)$"
)
VERSION = re.compile(r"NCCL version (\S+)")
# "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:..."
IB_USING = re.compile(r"^NET/IB ?: Using (?P<devices>.*?)(?: \[RO\])?; OOB")
# Each device as "[d]name:port", then ":rail" or ":" and ":plane" where NCCL knows them, then
# "/link" (NVIDIA/nccl src/transport/net_ib/init.cc, the "NET/IB : Using" line); ports merged into
# one virtual device as "[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE}" (NVIDIA/nccl-tests#373).
IB_DEVICE = re.compile(r"\[\d+\] ?(?P<name>[\w.-]+):\d+(?::\d*)*/(?P<link>\w+)")
SOCKET_USING = re.compile(r"^NET/Socket ?: Using (?P<ifaces>.*)$")
USING_NETWORK = re.compile(r"^Using network (?P<net>\w+)")
IB_HCA_SET = re.compile(r"^NCCL_IB_HCA set (?:by environment )?to (?P<hcas>\S+)")
# "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0", "Channel 00 : 2[1] -> 0[0] via
# SHM/direct/direct", older NCCL's "Ring 00 : 43 -> 44 [receive] via NET/Socket/0", and a net
# plugin's name with its spaces: "via NET/NCCL RDMA Plugin v10/0" (on a Spark: kreuzhofer's
# dgx-manager notes, Qwen 3.6-27B fine-tuning, quoted in tests/unit/captured/).
CHANNEL = re.compile(
    r"^(?:Channel|Ring) (?P<channel>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[\w+\])? -> "
    r"(?P<dst>\d+)(?:\[\w+\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)
RANK_OF_COMM = re.compile(r"ncclCommInitRank\w* comm \S+ rank (?P<rank>\d+) nranks (?P<n>\d+)")
TUNING = re.compile(
    r"^(?P<func>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
)


@dataclass
class RankLog:
    """What one rank's NCCL said about itself."""

    host: str
    rank: int | None = None
    version: str | None = None
    network: str | None = None  # "IB" or "Socket": NCCL's "Using network ..."
    ib_devices: list[str] = field(default_factory=list)
    socket_ifaces: list[str] = field(default_factory=list)
    ib_hca_env: str | None = None  # NCCL_IB_HCA as NCCL read it
    channels: dict[str, int] = field(default_factory=dict)  # transport -> channel count
    algorithms: dict[tuple[str, int], str] = field(default_factory=dict)  # (func, bytes) ->
    warnings: list[str] = field(default_factory=list)
    machine: str | None = None  # the rank's architecture (its rank file), not NCCL's log

    def transports(self) -> set[str]:
        """Each channel's transport family: NET/IB, NET/Socket, P2P, SHM..."""
        return {transport_family(via) for via in self.channels}


# What a channel's transport moves the bytes through, as NCCL names it in its "via ..." lines
# (NVIDIA/nccl src/transport/): p2p.cc "P2P/CUMEM", "P2P/IPC", "P2P/direct pointer",
# "P2P/indirect/..." (CUDA peer access between GPUs of one host: NVLink or PCIe); shm.cc
# "SHM/direct" (host memory shared by processes of one host); net.cc "NET/<network>/<device>"
# (the network NCCL chose: IB for verbs, RoCE included, or Socket for TCP).
THROUGH = {
    "P2P": "GPU to GPU within one host",
    "SHM": "shared memory within one host",
    "NET/IB": "RDMA",
    "NET/Socket": "TCP sockets",
}


def transport_family(via: str) -> str:
    """'NET/IB/0', 'NET/IBext_v8/2' and an RDMA plugin's 'NET/NCCL RDMA Plugin v10/0' ->
    'NET/IB' (verbs, RoCE included); 'NET/Socket/1' -> 'NET/Socket'; 'P2P/CUMEM' -> 'P2P'."""
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        rdma = parts[1].startswith("IB") or "RDMA" in parts[1]
        return "NET/IB" if rdma else f"NET/{parts[1]}"
    return parts[0]


def parse_log(text: str) -> RankLog:
    log: RankLog | None = None
    for raw in text.splitlines():
        line = LINE.match(raw.strip())
        if not line:
            continue
        log = log or RankLog(host=line["host"])
        msg = line["msg"].strip()
        if line["level"] == "WARN":
            log.warnings.append(msg)
        elif match := VERSION.search(msg):
            log.version = match[1]
        elif match := IB_USING.match(msg):
            log.ib_devices = [device["name"] for device in IB_DEVICE.finditer(match["devices"])]
        elif match := SOCKET_USING.match(msg):
            log.socket_ifaces = re.findall(r"\[\d+\]([\w.-]+):", match["ifaces"])
        elif match := IB_HCA_SET.match(msg):
            log.ib_hca_env = match["hcas"]
        elif match := USING_NETWORK.match(msg):
            log.network = match["net"]
        elif match := CHANNEL.match(msg):
            log.channels[match["via"]] = log.channels.get(match["via"], 0) + 1
        elif match := RANK_OF_COMM.search(msg):
            log.rank = int(match["rank"])
        elif match := TUNING.match(msg):
            log.algorithms[(match["func"], int(match["bytes"]))] = (
                f"{match['algo']}/{match['proto']}"
            )
    return log or RankLog(host="?")


def read_rank(log_path: Path) -> RankLog:
    """A rank's NCCL log, with the architecture its rank file (beside it, same host and pid)
    gives; none where a rank wrote none (a check from before the rank files)."""
    log = parse_log(log_path.read_text(errors="replace"))
    rank_file = log_path.with_name(
        RANK_GLOB.replace("*", log_path.name.removeprefix("nccl.").removesuffix(".log"))
    )
    if rank_file.exists():
        log.machine = json.loads(rank_file.read_text()).get("machine")
    return log


# --- the verdict ----------------------------------------------------------------------------


@dataclass
class Row:
    op: str
    bytes: int
    seconds: float
    algbw: float
    busbw: float
    wrong: int
    algorithm: str


def rows_of(timings: dict, logs: list[RankLog]) -> list[Row]:
    ranks = timings["ranks"]
    algorithms: dict[tuple[str, int], str] = {}
    for log in logs:
        algorithms |= log.algorithms
    rows = []
    for row in timings["rows"]:
        algbw, busbw = bus_bandwidth(row["op"], row["bytes"], row["seconds"], ranks)
        # NCCL's TUNING line counts an all_gather by one rank's share (its sendcount).
        per_call = row["bytes"] // ranks if row["op"] == "all_gather" else row["bytes"]
        algorithm = algorithms.get((NCCL_FUNC[row["op"]], per_call), "?")
        rows.append(
            Row(row["op"], row["bytes"], row["seconds"], algbw, busbw, row["wrong"], algorithm)
        )
    return rows


def verdict(
    rows: list[Row],
    logs: list[RankLog],
    *,
    transport: str | None,
    expect_hcas: list[str],
    min_busbw: float | None,
    image: str | None = None,
) -> list[str]:
    """Every reason the fabric fails the check; empty when it passes. ``image``: the image the
    ranks ran in, named where its NCCL is what fails."""
    problems = []
    if not rows:
        said = "; ".join(warning for log in logs for warning in log.warnings) or "nothing"
        problems.append(f"no timings: the collective did not complete (NCCL warned: {said})")
    for log in logs:
        who = f"rank {log.rank} ({log.host})"
        if deadlocks(log.version, log.machine):
            problems.append(
                f"{who}: NCCL {log.version} on {log.machine}{f' in {image}' if image else ''}:"
                f" {DEADLOCK_WHY}; use an image with NCCL"
                f" {'.'.join(map(str, DEADLOCK_FIXED_IN))} or later"
            )
        if transport and (problem := transport_problem(log, transport)):
            problems.append(f"{who}: {problem}")
        if missing := [hca for hca in expect_hcas if hca not in log.ib_devices]:
            using = ", ".join(log.ib_devices) or "none"
            problems.append(f"{who}: NCCL does not use {', '.join(missing)} (NET/IB uses {using})")
    for row in rows:
        if row.wrong:
            problems.append(f"{row.op} {row.bytes} B: {row.wrong} wrong elements")
    gathers = [row for row in rows if row.op == "all_gather"]
    if min_busbw is not None and gathers:
        largest = max(gathers, key=lambda row: row.bytes)
        if largest.busbw < min_busbw:
            problems.append(
                f"all_gather {largest.bytes} B: bus bandwidth {below(largest.busbw, min_busbw)}"
                f" GB/s, under the pass mark {min_busbw:g} GB/s"
            )
    return problems


def below(value: float, mark: float) -> str:
    """``value``, under ``mark``, to two decimals, or to the first one after them where it reads
    under the mark as written (0.049 under 0.05, never "0.05 under 0.05")."""
    places = 2
    while float(f"{value:.{places}f}") >= mark and places < 12:
        places += 1
    return f"{value:.{places}f}"


def release(version: str) -> tuple[int, ...] | None:
    """NCCL's version as it logs it ("2.28.9+cuda13.0") as numbers; None where it is no
    version."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(part) for part in match.groups()) if match else None


def deadlocks(version: str | None, machine: str | None) -> bool:
    """Whether this NCCL on this architecture has the proxy-op pool's silent deadlock."""
    number = release(version) if version else None
    return machine == DEADLOCK_MACHINE and number is not None and number < DEADLOCK_FIXED_IN


def transport_problem(log: RankLog, transport: str) -> str | None:
    """Why a rank's channels did not all go through ``transport``, naming what they used.

    NCCL names a network for the communicator even when no channel uses it ("Using network
    Socket" on a host without RDMA whose ranks talk over NVLink): the channels say what carried
    the bytes, and NCCL's network choice speaks only where there is no channel line."""
    found = log.transports()
    if "NET/Socket" in found or (not found and log.network == "Socket"):
        hca = f"NCCL_IB_HCA={log.ib_hca_env} found no device; " if log.ib_hca_env else ""
        return (
            f"NCCL fell back to sockets (NET/Socket on {', '.join(log.socket_ifaces)}):"
            f" {hca}no usable RDMA device in the container (--device /dev/infiniband,"
            " NCCL_IB_HCA naming the box's devices, a RoCE v2 GID)"
        )
    if found and found != {transport}:
        used = "; ".join(
            f"{', '.join(sorted(via for via in log.channels if transport_family(via) == family))}"
            f" ({THROUGH.get(family, family)})"
            for family in sorted(found - {transport})
        )
        crossed = any(family.startswith("NET/") for family in found)
        return f"channels via {used}, not {transport}" + (
            "" if crossed else ": no channel crossed the fabric"
        )
    return None


def report(
    out: Path,
    transport: str | None,
    expect_hcas: list[str],
    min_busbw: float | None,
    key: str | None = None,
    image: str | None = None,
) -> int:
    logs = [read_rank(path) for path in sorted(out.glob(LOG_GLOB))]
    timings_file = out / "timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else None
    rows = rows_of(timings, logs) if timings else []
    problems = verdict(
        rows, logs, transport=transport, expect_hcas=expect_hcas, min_busbw=min_busbw, image=image
    )
    if timings:
        print(f"NCCL {timings['nccl']} (torch {timings['torch']}), {timings['ranks']} ranks on "
              f"{', '.join(timings['hosts'])}")  # fmt: skip
    print(f"{'op':<11}{'size (B)':>12}  {'algorithm':<14}{'time (us)':>11}"
          f"{'algbw GB/s':>12}{'busbw GB/s':>12}{'#wrong':>8}")  # fmt: skip
    for row in rows:
        print(f"{row.op:<11}{row.bytes:>12}  {row.algorithm:<14}{row.seconds * 1e6:>11.1f}"
              f"{row.algbw:>12.2f}{row.busbw:>12.2f}{row.wrong:>8}")  # fmt: skip
    for log in logs:
        channels = ", ".join(f"{count} via {via}" for via, count in sorted(log.channels.items()))
        print(f"rank {log.rank} ({log.host}, {log.machine or '?'}, NCCL {log.version}): "
              f"network {log.network}; "
              f"IB devices {log.ib_devices or '-'}; channels: {channels or 'none'}")  # fmt: skip
    summary = {
        "key": key,  # what the run depended on (the deploy's spark-nccl-test --key)
        "passed": not problems,
        "problems": problems,
        "rows": [asdict(row) for row in rows],
        # the algorithms are in the rows already (and keyed by tuples, which JSON has not)
        "ranks": [{k: v for k, v in asdict(log).items() if k != "algorithms"} for log in logs],
    }
    (out / "verdict.json").write_text(json.dumps(summary, indent=1))
    for problem in problems:  # on stderr too, where a deploy shows a failed command's words
        print(f"FAIL: {problem}")
        print(f"FAIL: {problem}", file=sys.stderr)
    print("PASS" if not problems else f"FAIL ({len(problems)} problems)")
    return 0 if not problems else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    for name in ("rank", "local", "report"):
        step = steps.add_parser(name)
        step.add_argument("--out", type=Path, required=True)
        if name != "report":
            step.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    steps.choices["local"].add_argument("--ranks", type=int, required=True)
    steps.choices["local"].add_argument("--port", type=int, default=29555)
    steps.choices["report"].add_argument("--transport", choices=["NET/IB", "any"], default="NET/IB")
    steps.choices["report"].add_argument("--expect-hca", default="")
    steps.choices["report"].add_argument("--min-busbw", type=float)
    steps.choices["report"].add_argument("--key")
    steps.choices["report"].add_argument("--image")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "rank":
        run_rank(args.out, args.max_bytes)
        return 0
    if args.step == "local":
        return run_local(args.ranks, args.out, args.max_bytes, args.port)
    hcas = [hca for hca in args.expect_hca.split(",") if hca]
    transport = None if args.transport == "any" else args.transport
    return report(args.out, transport, hcas, args.min_busbw, args.key, args.image)


if __name__ == "__main__":
    sys.exit(main())

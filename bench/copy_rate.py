"""The fleet copy's rate against the raw rate of the same link, without a lab (issue 29's target:
the second box's copy at 50% or more of the raw copy rate between the two boxes).

    python -m bench.copy_rate [--files 4] [--file-mib 1024] [--rounds 3] [--loopback]
                              [--fetcher PATH] [--dir DIR] [--json PATH] [--profile PATH]

A model-like set of files (--files weights files of --file-mib MiB, and a config.json and a
tokenizer.json) is served as a box of the fleet serves its cache (files/spark_serve.py: the blobs
under /blobs/<hash>), with the hub's listing beside them (/api/models/<id>/revision/main, the
shape the lab's hub stand-in answers, tests/simlab/hub.py listing: each file's size, an LFS
file's SHA-256, any other's Git blob id). Each round, alternating: (a) raw, curl of every blob
to /dev/null, FILES_AT_ONCE at once as the copy takes them; (b) the copy, spark_fetch.py --source
into an empty cache, every file checked against the listing's hash; (c) sha256sum of every
blob, as many at once, from the served directory. Medians of the rounds, MB/s (10^6 bytes), the
ratio, and the CPU seconds each side's processes used (the server's not counted: the same for
both). Then issue 40's CPU target, a ratio in one run: the copy's CPU seconds per GB against
sha256sum's plus curl's on the same files (what the copy must do at least: receive every byte
and hash it), within 1.3x; CPU seconds from the kernel's sum over ended children (getrusage
RUSAGE_CHILDREN), not wall clock.

As root with `ip`, the server runs in one network namespace and the clients in another, joined
by a veth pair at the fabric's MTU: two boxes on one link, as near as one machine gets.
Otherwise (or with --loopback) both on this machine's loopback. The output says which.

Standard library only (and curl), so it runs where the repository's virtualenv is not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from spark.topology import FABRIC_MTU

REPO = Path(__file__).resolve().parents[1]
SERVE = REPO / "files" / "spark_serve.py"
FETCH = REPO / "files" / "spark_fetch.py"
MODEL = "bench/model"
COMMIT = hashlib.sha1(MODEL.encode()).hexdigest()  # any 40 hex digits: the fetcher echoes it
PORT = 60991  # operations/weights.py's share port (docs/reference.md: The weights)
SERVER_NS, CLIENT_NS = "copybench-serve", "copybench-fetch"
SERVER_IP, CLIENT_IP = "10.254.29.1", "10.254.29.2"  # a /30 of their own, issue 29's
PATTERN = 64 * 2**20  # the weights: this much random data, repeated
SMALL = {"config.json": b'{"model_type": "bench"}\n', "tokenizer.json": b"{}\n" * 4096}


# --- the model ----------------------------------------------------------------------------------


def git_blob_id(data: bytes) -> str:
    """What the hub gives as a non-LFS file's blobId (Git's object name of a blob)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_model(served: Path, files: int, size: int) -> tuple[dict, int]:
    """The blobs under served/blobs, the listing under served/api/...; the listing and the bytes
    in all."""
    blobs = served / "blobs"
    blobs.mkdir(parents=True)
    pattern = os.urandom(PATTERN)
    siblings = []
    for index in range(files):
        name = f"model-{index + 1:05d}-of-{files:05d}.safetensors"
        digest, partial = hashlib.sha256(), blobs / f"{name}.part"
        with open(partial, "wb") as out:
            # Each file its own start, so no two share a hash (a blob).
            for offset in range(0, size, PATTERN):
                piece = (os.urandom(4096) + pattern)[:PATTERN] if not offset else pattern
                piece = memoryview(piece)[: min(PATTERN, size - offset)]
                digest.update(piece)
                out.write(piece)
        partial.rename(blobs / digest.hexdigest())
        # An LFS file as the hub lists it (hub.py listing; hf_api.py model_info, blobs=true).
        lfs = {"sha256": digest.hexdigest(), "size": size, "pointerSize": 134}
        siblings.append({"rfilename": name, "size": size, "lfs": lfs})
    for name, data in SMALL.items():
        (blobs / git_blob_id(data)).write_bytes(data)
        siblings.append({"rfilename": name, "size": len(data), "blobId": git_blob_id(data)})
    listing = {"id": MODEL, "modelId": MODEL, "sha": COMMIT, "siblings": siblings}
    api = served / "api" / "models" / MODEL / "revision" / "main"
    api.parent.mkdir(parents=True)
    api.write_text(json.dumps(listing))
    return listing, files * size + sum(len(data) for data in SMALL.values())


# --- the link -----------------------------------------------------------------------------------


def can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


@contextmanager
def link(loopback: bool) -> Iterator[tuple[str, list[str], list[str], str]]:
    """(what the link is, the server's command prefix, the clients', the server's address)."""
    if loopback or not can_make_namespaces():
        why = "asked" if loopback else "not root, or no ip(8)"
        yield f"loopback ({why})", [], [], "127.0.0.1"
        return
    for namespace in (SERVER_NS, CLIENT_NS):  # a run killed before its clean-up
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
    steps = [
        ["ip", "netns", "add", SERVER_NS],
        ["ip", "netns", "add", CLIENT_NS],
        ["ip", "link", "add", "cb-serve", "type", "veth", "peer", "name", "cb-fetch"],
        ["ip", "link", "set", "cb-serve", "netns", SERVER_NS],
        ["ip", "link", "set", "cb-fetch", "netns", CLIENT_NS],
    ]
    for namespace, device, address in ((SERVER_NS, "cb-serve", SERVER_IP),
                                       (CLIENT_NS, "cb-fetch", CLIENT_IP)):  # fmt: skip
        inside = ["ip", "-n", namespace]
        steps += [
            [*inside, "link", "set", "lo", "up"],
            [*inside, "link", "set", device, "mtu", str(FABRIC_MTU), "up"],
            [*inside, "addr", "add", f"{address}/30", "dev", device],
        ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as error:
        for namespace in (SERVER_NS, CLIENT_NS):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        yield f"loopback (network namespaces refused: {error.stderr.strip()})", [], [], "127.0.0.1"
        return
    try:
        yield (f"two network namespaces joined by a veth pair, MTU {FABRIC_MTU}",
               ["ip", "netns", "exec", SERVER_NS], ["ip", "netns", "exec", CLIENT_NS],
               SERVER_IP)  # fmt: skip
    finally:
        for namespace in (SERVER_NS, CLIENT_NS):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)


@contextmanager
def server(prefix: list[str], address: str, served: Path) -> Iterator[str]:
    """files/spark_serve.py on the model; its URL once it answers."""
    command = [*prefix, sys.executable, str(SERVE), str(PORT), "--bind", address,
               "--directory", str(served)]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    url = f"http://{address}:{PORT}"
    try:
        deadline = time.monotonic() + 30
        while True:
            probe = subprocess.run([*prefix, "curl", "-fsS", "-o", "/dev/null", url + "/api/models/"
                                    f"{MODEL}/revision/main"], capture_output=True)  # fmt: skip
            if probe.returncode == 0:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"spark_serve.py did not answer: {probe.stderr.decode()}")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait()


# --- the measurements ---------------------------------------------------------------------------


def children_cpu() -> float:
    """CPU seconds (user+system) of this process's children that have ended and been waited
    for: the kernel's sum (getrusage(2) RUSAGE_CHILDREN), whoever reaped them (gevent, once
    pyinfra is imported in the same process, reaps children itself)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_all(commands: list[list[str]], at_once: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of them all) of `commands`, `at_once` at a time; each must
    succeed. No other child of this process ends meanwhile (the server runs throughout)."""
    cpu, started = children_cpu(), time.monotonic()
    with ThreadPoolExecutor(at_once) as pool:
        for ran in pool.map(lambda c: subprocess.run(c, capture_output=True), commands):
            if ran.returncode:
                raise RuntimeError(f"{ran.args}: exit {ran.returncode}: {ran.stderr!r}")
    return time.monotonic() - started, children_cpu() - cpu


def blob_names(listing: dict) -> list[str]:
    return [s["lfs"]["sha256"] if "lfs" in s else s["blobId"] for s in listing["siblings"]]


def raw(prefix: list[str], url: str, listing: dict, at_once: int, total: int) -> dict:
    """Every blob to /dev/null by curl, `at_once` at a time."""
    curls = [[*prefix, "curl", "-fsS", "-o", "/dev/null", f"{url}/blobs/{blob}"]
             for blob in blob_names(listing)]  # fmt: skip
    wall, cpu = run_all(curls, at_once)
    return {"seconds": wall, "rate": total / wall, "cpu": cpu}


def hashed(served: Path, listing: dict, at_once: int) -> dict:
    """sha256sum of every blob the copy receives, `at_once` at a time: the hashing the copy must
    do, by the tool a person would check the files with. Its CPU seconds."""
    sums = [["sha256sum", str(served / "blobs" / blob)] for blob in blob_names(listing)]
    return {"cpu": run_all(sums, at_once)[1]}


def copy(prefix: list[str], url: str, fetcher: Path, cache: Path, total: int) -> dict:
    """spark_fetch.py's fleet copy into an empty cache (its files checked against the listing)."""
    shutil.rmtree(cache, ignore_errors=True)
    command = [*prefix, sys.executable, str(fetcher), MODEL, "--cache", str(cache),
               "--endpoint", url, "--source", f"{url}/blobs"]  # fmt: skip
    wall, cpu = run_all([command], 1)
    snapshot = cache / "hub" / f"models--{MODEL.replace('/', '--')}" / "snapshots" / COMMIT
    if not (snapshot / "config.json").exists():
        raise RuntimeError(f"{fetcher}: exit 0 but no snapshot at {snapshot}")
    shutil.rmtree(cache)
    return {"seconds": wall, "rate": total / wall, "cpu": cpu}


def profile(prefix: list[str], url: str, fetcher: Path, cache: Path, out: Path) -> str:
    """One copy under cProfile, the fetcher's threads included (the work is in them): from
    Python 3.12 one profiler sees every thread (it rests on sys.monitoring, and a second one is
    refused); before it, each thread gets its own. The merged stats to `out`, the top lines back."""
    shutil.rmtree(cache, ignore_errors=True)
    runner = (
        "import cProfile, pstats, runpy, sys, threading\n"
        "profiles = [cProfile.Profile()]\n"
        "if sys.version_info < (3, 12):\n"
        "    run = threading.Thread.run\n"
        "    def profiled(self):\n"
        "        p = cProfile.Profile(); profiles.append(p); p.runcall(run, self)\n"
        "    threading.Thread.run = profiled\n"
        "sys.argv = sys.argv[1:]\n"
        "try:\n"
        "    profiles[0].runcall(runpy.run_path, sys.argv[0], run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"stats = pstats.Stats(*profiles); stats.dump_stats({str(out)!r})\n"
        "stats.sort_stats('tottime').print_stats(15)\n"
    )
    command = [*prefix, sys.executable, "-c", runner, str(fetcher), MODEL, "--cache", str(cache),
               "--endpoint", url, "--source", f"{url}/blobs"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    shutil.rmtree(cache)
    return result.stdout[result.stdout.find("   ncalls") :]


def median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def cpu_per_gb(raws: list[dict], copies: list[dict], sums: list[dict], total: int) -> dict:
    """Each side's median CPU seconds per GB (10^9 bytes) and the copy's against sha256sum's plus
    curl's."""
    per_gb = {
        name: median(runs, "cpu") / (total / 1e9)
        for name, runs in (("copy", copies), ("curl", raws), ("sha256sum", sums))
    }
    return {
        "cpu_s_per_gb": {name: round(value, 3) for name, value in per_gb.items()},
        "cpu_ratio": round(per_gb["copy"] / (per_gb["sha256sum"] + per_gb["curl"]), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.copy_rate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--files", type=int, default=4, help="weights files")
    parser.add_argument("--file-mib", type=int, default=1024, help="each weights file's size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loopback", action="store_true", help="no network namespaces")
    parser.add_argument("--fetcher", type=Path, default=FETCH, help="another spark_fetch.py")
    parser.add_argument("--dir", help="where the model and the cache go (default: TMPDIR)")
    parser.add_argument("--json", default="copy-rate-results.json")
    parser.add_argument("--profile", type=Path, help="also one profiled copy, its stats here")
    args = parser.parse_args(argv)
    if not shutil.which("curl"):
        parser.error("curl is needed (the raw rate)")
    if not args.fetcher.is_file():
        parser.error(f"no fetcher at {args.fetcher}")
    # The fetcher's own figure: the raw side asks as many files at once.
    at_once = int(subprocess.run([sys.executable, "-c", "import runpy, sys; print(runpy.run_path("
                                  "sys.argv[1])['FILES_AT_ONCE'])", str(args.fetcher)],
                                 capture_output=True, text=True, check=True).stdout)  # fmt: skip
    machine = {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
               "cpu": platform.processor() or platform.machine(),
               "python": platform.python_version(), "kernel": platform.release()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="copybench-", dir=args.dir) as work:
        listing, total = make_model(Path(work) / "served", args.files, args.file_mib * 2**20)
        cache = Path(work) / "cache"
        served = Path(work) / "served"
        with (
            link(args.loopback) as (how, server_prefix, client_prefix, address),
            server(server_prefix, address, served) as url,
        ):
            raws, copies, sums = [], [], []
            for _ in range(args.rounds):
                raws.append(raw(client_prefix, url, listing, at_once, total))
                copies.append(copy(client_prefix, url, args.fetcher, cache, total))
                sums.append(hashed(served, listing, at_once))
            profiled = (profile(client_prefix, url, args.fetcher, cache, args.profile)
                        if args.profile else None)  # fmt: skip
    machine["load_average_at_end"] = os.getloadavg()
    results = {
        "machine": machine, "link": how, "files_at_once": at_once, "bytes": total,
        "files": f"{args.files} x {args.file_mib} MiB + {len(SMALL)} small",
        "fetcher": str(args.fetcher), "raw": raws, "copy": copies,
        "raw_median_mb_s": round(median(raws, "rate") / 1e6),
        "copy_median_mb_s": round(median(copies, "rate") / 1e6),
        "raw_cpu_median_s": round(median(raws, "cpu"), 2),
        "copy_cpu_median_s": round(median(copies, "cpu"), 2),
        "sha256sum": sums, "sha256sum_cpu_median_s": round(median(sums, "cpu"), 2),
    }  # fmt: skip
    results["ratio"] = round(results["copy_median_mb_s"] / results["raw_median_mb_s"], 3)
    results |= cpu_per_gb(raws, copies, sums, total)
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(f"machine: {machine['cpus']} CPUs ({machine['cpu']}), load average"
          f" {machine['load_average_at_start'][0]:.2f} at the start,"
          f" {machine['load_average_at_end'][0]:.2f} at the end; link: {how}")  # fmt: skip
    print(f"model: {results['files']} ({total / 1e9:.2f} GB), {at_once} files at once,"
          f" {args.rounds} rounds; fetcher {args.fetcher}")  # fmt: skip
    for name, runs in (("raw (curl to /dev/null)", raws), ("copy (spark_fetch.py)", copies)):
        rates = ", ".join(f"{run['rate'] / 1e6:.0f}" for run in runs)
        print(f"{name:26} median {median(runs, 'rate') / 1e6:6.0f} MB/s  rounds [{rates}]"
              f"  CPU {median(runs, 'cpu'):.2f} s")  # fmt: skip
    print(f"copy / raw: {results['ratio']:.0%} (issue 29's target: 50% or more)")
    per_gb = results["cpu_s_per_gb"]
    print(f"CPU s per GB: copy {per_gb['copy']:.2f} against sha256sum {per_gb['sha256sum']:.2f}"
          f" + curl {per_gb['curl']:.2f}: {results['cpu_ratio']:.2f}x"
          " (issue 40's target: within 1.3x)")  # fmt: skip
    if profiled:
        print(f"\nprofile of one copy ({args.profile}), top by own time:\n{profiled}")
    print(f"{args.json} written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

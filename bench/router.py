"""The fleet's router (issue 38) against the lane it fronts, on loopback, in one run.

    python -m bench.router [--ttft-samples 30] [--rps-seconds 5] [--rps-rounds 3]
                           [--json router-results.json]

The router is LiteLLM's proxy (docs/design.md: the router), pinned (spark/router.py
LITELLM, the deploy's pins), installed by this bench into a virtualenv of its own under
SPARK_ROUTER_CACHE (default /var/cache/spark-router), outside the clone, as the lab keeps its
images. Its lanes are the lab's vLLM stand-in (tests/simlab/serving/vllm_standin.py) run as
processes on loopback addresses, each with its own key (VLLM_API_KEY, never in argv): `alpha`
alone, `beta` as a replica pair. The router holds each lane's key, clients hold one fleet key;
every key goes through the environment, the router's configuration names them (os.environ/...).

Measured, alternating router and lane within each round (this machine is noisy):
- the router's start: from its launch to the first 200 on /v1/models listing every served name;
- the time to the first token of a short streaming chat to `alpha`, through the router and
  directly (median of --ttft-samples each), and their ratio;
- requests per second at 16 concurrent short streaming chats to `alpha`, through the router and
  directly (median of --rps-rounds rounds of --rps-seconds each), and their ratio;
- the resident memory of the router's processes, idle after its start and at its peak under
  that load;
- one replica of `beta` killed while a request a tenth of a second goes to `beta`: the
  requests that failed, and the time from the kill to the last failure.

Standard library only (and the router's own virtualenv), so it runs where the repository's
virtualenv is not. Every wait has a deadline and every load loop a bound.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from spark.router import LITELLM  # the router's pins, the deploy's (standard library only)

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests/simlab/serving/vllm_standin.py"
STANDIN_DATA = REPO / "spark/data"  # the releases' option lists the stand-in checks against
STANDIN_RELEASE = "0.19.0"
CACHE = Path(os.environ.get("SPARK_ROUTER_CACHE", "/var/cache/spark-router"))
ROUTER_HOST, ROUTER_PORT = "127.0.0.1", 38100
LANE_PORT = 38000
CONCURRENCY = 16
HEALTH_INTERVAL = 5  # seconds between the router's checks of each lane
START_DEADLINE = 240.0  # the router's start on a busy 2-core machine
REQUEST_TIMEOUT = 30.0
PROMPT = "What is 2 + 3? Answer with the number and the word done."


@dataclass(frozen=True)
class Lane:
    """One lane: the name it serves, its loopback address and its own key."""

    name: str
    host: str
    key: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{LANE_PORT}"


def bench_lanes() -> list[Lane]:
    """`alpha` alone, `beta` on two boxes (a replica pair), each with a fresh key."""
    return [
        Lane("alpha", "127.0.0.2", secrets.token_urlsafe(24)),
        Lane("beta", "127.0.0.3", secrets.token_urlsafe(24)),
        Lane("beta", "127.0.0.4", secrets.token_urlsafe(24)),
    ]


# --- the pure figures ---------------------------------------------------------------------------


def ratio(through_router: float, direct: float) -> float:
    """The router's figure over the lane's, to three places."""
    return round(through_router / direct, 3)


def failover(events: list[tuple[float, bool]], killed_at: float) -> dict:
    """From (time, answered) of each request to the replica pair and the time one replica was
    killed: the requests that failed, and the seconds from the kill to the last failure (0.0
    when none failed), and whether every request after that one was answered."""
    failed = [at for at, answered in events if not answered]
    last = max(failed, default=killed_at)
    after = [answered for at, answered in events if at > last]
    return {
        "requests": len(events),
        "failed": len(failed),
        "seconds_to_last_failure": round(max(0.0, last - killed_at), 2),
        "answered_after": bool(after) and all(after),
    }


def table(results: dict) -> list[tuple[str, str, str, str]]:
    """The rows printed: (what, through the router, directly, router / direct)."""
    ttft, rps = results["ttft_ms"], results["rps_at_16"]
    memory, start, lost = results["rss_mib"], results["start_seconds"], results["failover"]
    return [
        ("time to first token, ms (median)", f"{ttft['router']:.1f}", f"{ttft['direct']:.1f}",
         f"{ttft['ratio']:.2f}"),
        (f"requests/s at {CONCURRENCY} concurrent (median)", f"{rps['router']:.1f}",
         f"{rps['direct']:.1f}", f"{rps['ratio']:.2f}"),
        ("router CPU per request, ms (median)", f"{results['router_cpu_ms_per_request']:.1f}",
         "", ""),
        ("router RSS, MiB: idle / peak under load", f"{memory['idle']:.0f} / {memory['peak']:.0f}",
         "", ""),
        ("router start to /v1/models, s", f"{start:.1f}", "", ""),
        ("a replica killed: failed requests, s to the last", f"{lost['failed']} of "
         f"{lost['requests']}, {lost['seconds_to_last_failure']:.1f}", "", ""),
    ]  # fmt: skip


# --- processes ----------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """The process and every process under it (/proc: each one's parent)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (/proc: VmRSS)."""
    total = 0
    for current in descendants(pid):
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines()
                       if line.startswith("VmRSS:")), 0)  # fmt: skip
    return total


def tree_cpu(pid: int) -> float:
    """CPU seconds (user and system) used so far by a process and all its descendants."""
    total = 0
    for current in descendants(pid):
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime: proc(5)
    return total / os.sysconf("SC_CLK_TCK")


def stop(process: subprocess.Popen) -> None:
    """TERM the process's group (it was started in its own session), KILL it if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)


def wait_until(
    check: Callable[[], bool],
    deadline: float,
    what: str,
    process: subprocess.Popen | None = None,
    log: Path | None = None,
) -> None:
    """Retry `check` until it holds; RuntimeError (with the log's tail) past the deadline or
    once the process has exited."""
    while not check():
        if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{what}: not ready in time or exited\n{tail}")
        time.sleep(0.1)


# --- HTTP ---------------------------------------------------------------------------------------


def _split(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    return host, int(port)


def get(url: str, path: str, key: str | None, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; (0, b"") when nothing answers."""
    connection = http.client.HTTPConnection(*_split(url), timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    except OSError:
        return 0, b""
    finally:
        connection.close()


def served_names(url: str, key: str) -> set[str]:
    """The names /v1/models lists (OpenAI's shape: data[].id); empty when it does not answer."""
    status, body = get(url, "/v1/models", key)
    if status != 200:
        return set()
    try:
        return {card["id"] for card in json.loads(body)["data"]}
    except (ValueError, KeyError, TypeError):
        return set()


def stream_chat(url: str, key: str, model: str, timeout: float = REQUEST_TIMEOUT) -> float:
    """One short streaming chat; the seconds to its first content token. It must be answered
    200 and end with [DONE] (RuntimeError otherwise); `timeout` bounds each wait for a read."""
    body = json.dumps({"model": model, "stream": True, "max_tokens": 16,
                       "messages": [{"role": "user", "content": PROMPT}]})  # fmt: skip
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connection = http.client.HTTPConnection(*_split(url), timeout=timeout)
    started = time.perf_counter()
    first = None
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{url} {model}: {response.status} {response.read()[:200]!r}")
        while line := response.readline():
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                if first is None:
                    raise RuntimeError(f"{url} {model}: [DONE] before any content")
                return first
            choices = json.loads(data).get("choices") or [{}]
            if first is None and choices[0].get("delta", {}).get("content"):
                first = time.perf_counter() - started
        raise RuntimeError(f"{url} {model}: the stream ended without [DONE]")
    finally:
        connection.close()


def answered(url: str, key: str, model: str) -> bool:
    try:
        stream_chat(url, key, model)
        return True
    except (OSError, RuntimeError, ValueError, http.client.HTTPException):
        return False


def load(url: str, key: str, model: str, seconds: float) -> tuple[int, float]:
    """(streaming chats answered, seconds taken) with CONCURRENCY clients, each asking again as
    soon as it is answered, for `seconds`; a failure stops the measurement (RuntimeError)."""
    deadline = time.monotonic() + seconds
    done, errors = [0] * CONCURRENCY, []

    def client(index: int) -> None:
        while time.monotonic() < deadline and not errors:
            try:
                stream_chat(url, key, model)
            except Exception as error:  # reported below, whatever it is
                errors.append(error)
                return
            done[index] += 1

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + REQUEST_TIMEOUT + 5)
    if errors:
        raise RuntimeError(f"under load: {errors[0]}")
    return sum(done), time.monotonic() - started


class PeakRss:
    """The largest tree_rss of a process seen while this runs (sampled every 0.2 s)."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.stopped = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stopped.wait(0.2):
            self.peak = max(self.peak, tree_rss(self.pid))

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


# --- the lanes and the router -------------------------------------------------------------------


@contextmanager
def lanes_up(lanes: list[Lane], work: Path) -> Iterator[dict[Lane, subprocess.Popen]]:
    """Each lane's stand-in on its address, its key in VLLM_API_KEY; stopped at the end."""
    snapshot = work / "hf/hub"
    for name in {lane.name for lane in lanes}:
        model = snapshot / f"models--bench--{name}/snapshots/0"
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}\n")
    processes: dict[Lane, subprocess.Popen] = {}
    try:
        for lane in lanes:
            env = {
                **os.environ,
                "VLLM_API_KEY": lane.key,
                "HF_HOME": str(work / "hf"),
                "SIMLAB_VLLM_SHARE": str(STANDIN_DATA),
                "SIMLAB_VLLM_RELEASE": STANDIN_RELEASE,
            }
            command = [sys.executable, str(STANDIN), "serve", f"bench/{lane.name}",
                       "--served-model-name", lane.name, "--host", lane.host,
                       "--port", str(LANE_PORT), "--disable-uvicorn-access-log"]  # fmt: skip
            log = work / f"lane-{lane.host}.log"
            with open(log, "w") as out:
                processes[lane] = subprocess.Popen(command, env=env, stdout=out, stderr=out,
                                                   start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 60
        for lane, process in processes.items():
            wait_until(lambda lane=lane: get(lane.url, "/health", None)[0] == 200, deadline,
                       f"lane {lane.name} on {lane.host}", process,
                       work / f"lane-{lane.host}.log")  # fmt: skip
        yield processes
    finally:
        for process in processes.values():
            stop(process)


def install(requirements: tuple[str, ...], name: str) -> Path:
    """A virtualenv holding `requirements` under CACHE/<name>, made once (a stamp names them);
    its bin directory."""
    venv = CACHE / name
    stamp = venv / f".installed-{hashlib.sha256(' '.join(requirements).encode()).hexdigest()[:12]}"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check",
                        *requirements], check=True, timeout=1800)  # fmt: skip
        stamp.touch()
    return venv / "bin"


def litellm_config(lanes: list[Lane]) -> tuple[dict, dict[str, str]]:
    """LiteLLM's proxy configuration for the lanes, and the environment holding their keys.

    Keys are read from the environment by name (os.environ/NAME: litellm/proxy/proxy_server.py
    get_secret). Every lane is a deployment of its served name (hosted_vllm/: LiteLLM's vLLM
    provider, an OpenAI-compatible api_base); one name on several lanes is one model group,
    load-balanced (simple-shuffle, the default). Background health checks every
    HEALTH_INTERVAL s take a failing lane out of its group (docs: proxy/health_check_routing);
    a failed request is retried on another lane of the group (router_settings num_retries)."""
    deployments, env = [], {}
    for index, lane in enumerate(lanes):
        variable = f"SPARK_LANE_KEY_{index}"
        env[variable] = lane.key
        deployments.append({
            "model_name": lane.name,
            "litellm_params": {"model": f"hosted_vllm/{lane.name}", "api_base": f"{lane.url}/v1",
                               "api_key": f"os.environ/{variable}"},
        })  # fmt: skip
    config = {
        "model_list": deployments,
        "general_settings": {
            "master_key": "os.environ/SPARK_FLEET_KEY",
            "background_health_checks": True,
            "health_check_interval": HEALTH_INTERVAL,
            "enable_health_check_routing": True,
        },
        "router_settings": {"num_retries": 2, "allowed_fails": 1, "cooldown_time": 30},
        "litellm_settings": {"callbacks": ["prometheus"], "telemetry": False},
    }
    return config, env


@contextmanager
def litellm_up(bin_dir: Path, lanes: list[Lane], fleet_key: str, work: Path
               ) -> Iterator[subprocess.Popen]:  # fmt: skip
    """LiteLLM's proxy from `bin_dir` on ROUTER_HOST:ROUTER_PORT for the lanes, one worker;
    stopped at the end. Its configuration is JSON (YAML's subset), 0600; the keys are in its
    environment."""
    config, env = litellm_config(lanes)
    path = work / "litellm.yaml"
    path.touch(mode=0o600)
    path.write_text(json.dumps(config, indent=2))
    env |= {"SPARK_FLEET_KEY": fleet_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    command = [str(bin_dir / "litellm"), "--config", str(path), "--host", ROUTER_HOST,
               "--port", str(ROUTER_PORT), "--num_workers", "1"]  # fmt: skip
    log = work / "router.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        yield process
    finally:
        stop(process)


# --- the run ------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, work: Path) -> dict:
    """Every figure of one run."""
    bin_dir = install(LITELLM, "litellm")
    lanes, fleet_key = bench_lanes(), secrets.token_urlsafe(24)
    alpha, replica = lanes[0], lanes[2]
    through = f"http://{ROUTER_HOST}:{ROUTER_PORT}"
    names = {lane.name for lane in lanes}
    with lanes_up(lanes, work) as processes:
        started = time.monotonic()
        with litellm_up(bin_dir, lanes, fleet_key, work) as process:
            wait_until(lambda: served_names(through, fleet_key) == names,
                       started + START_DEADLINE, "the router", process,
                       work / "router.log")  # fmt: skip
            start_seconds = time.monotonic() - started
            # A wrong key, and none, are refused (LiteLLM without a database answers a key it
            # does not know 400 "No connected db."); every name answers through the router.
            refused = {"wrong key": get(through, "/v1/models", "not-the-fleet-key")[0],
                       "no key": get(through, "/v1/models", None)[0]}  # fmt: skip
            if any(status in (0, 200) for status in refused.values()):
                raise RuntimeError(f"the router did not refuse a client: {refused}")
            for name in sorted(names):
                stream_chat(through, fleet_key, name)
            time.sleep(2)  # the start's own work settles
            idle = tree_rss(process.pid)
            ttft = {"router": [], "direct": []}
            for _ in range(args.ttft_samples):
                ttft["router"].append(stream_chat(through, fleet_key, alpha.name))
                ttft["direct"].append(stream_chat(alpha.url, alpha.key, alpha.name))
            rps: dict[str, list[float]] = {"router": [], "direct": []}
            cpu_per_request = []  # the router's CPU ms for each chat it passed on
            with PeakRss(process.pid) as peak:
                for _ in range(args.rps_rounds):
                    cpu = tree_cpu(process.pid)
                    answered_count, seconds = load(through, fleet_key, alpha.name,
                                                   args.rps_seconds)  # fmt: skip
                    cpu_per_request.append((tree_cpu(process.pid) - cpu) * 1000 / answered_count)
                    rps["router"].append(answered_count / seconds)
                    answered_count, seconds = load(alpha.url, alpha.key, alpha.name,
                                                   args.rps_seconds)  # fmt: skip
                    rps["direct"].append(answered_count / seconds)
            events: list[tuple[float, bool]] = []
            killed_at = time.monotonic() + 2
            window_end = killed_at + 3 * HEALTH_INTERVAL + 5
            while (now := time.monotonic()) < window_end:
                if now >= killed_at and processes[replica].poll() is None:
                    os.killpg(processes[replica].pid, signal.SIGKILL)
                    processes[replica].wait(timeout=15)
                events.append((time.monotonic(), answered(through, fleet_key, replica.name)))
                time.sleep(0.1)
    ttft_ms = {side: statistics.median(samples) * 1000 for side, samples in ttft.items()}
    rps_median = {side: statistics.median(rounds) for side, rounds in rps.items()}
    return {
        "start_seconds": round(start_seconds, 2),
        "refused": refused,
        "rss_mib": {"idle": round(idle / 2**20, 1), "peak": round(peak.peak / 2**20, 1)},
        "ttft_ms": {**{k: round(v, 2) for k, v in ttft_ms.items()},
                    "ratio": ratio(ttft_ms["router"], ttft_ms["direct"])},
        "rps_at_16": {**{k: round(v, 1) for k, v in rps_median.items()},
                      "ratio": ratio(rps_median["router"], rps_median["direct"])},
        "rps_rounds": rps,
        "router_cpu_ms_per_request": round(statistics.median(cpu_per_request), 1),
        "failover": failover(events, killed_at),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.router",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ttft-samples", type=int, default=30)
    parser.add_argument("--rps-seconds", type=float, default=5.0)
    parser.add_argument("--rps-rounds", type=int, default=3)
    parser.add_argument("--json", default="router-results.json")
    args = parser.parse_args(argv)
    machine = {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
               "cpu": platform.processor() or platform.machine(),
               "python": platform.python_version()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="routerbench-") as work:
        results = {"router": " ".join(LITELLM), **measure(args, Path(work))}
    machine["load_average_at_end"] = os.getloadavg()
    results["machine"] = machine
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(f"router: {' '.join(LITELLM)} on loopback, lanes: the vLLM stand-in; machine:"
          f" {machine['cpus']} CPUs, load average {machine['load_average_at_start'][0]:.2f}"
          f" at the start, {machine['load_average_at_end'][0]:.2f} at the end")  # fmt: skip
    rows = [("", "router", "direct", "router/direct"), *table(results)]
    for what, router, direct, share in rows:
        print(f"{what:50} {router:>16} {direct:>8} {share:>13}")
    print(f"{args.json} written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A lane on demand (issue 38) on the simulated lab: the time from a request to its first token
when the request has to start the lane, against the lane's own start, in one run.

    SIMLAB_ID=<n> python -m bench.on_demand [--reps 5] [--json on-demand-results.json]

Boots its own lab of two hosts (as root; SIMLAB_ID keeps it apart from other labs), deploys
tests/e2e/on_demand_inventory.py (the e2e's: the fast lane and a spare copy of it on demand, the
coder lane resident), then on the first host, alternating within each repetition:

- (a) on demand: the fast lane stopped, a short streaming chat through its front (the port
  clients use, with the lane's key), which starts it through its socket: the seconds to the
  first content token. The same lane's start within that request, as systemd timed it, and the
  first token of the same chat again once it serves (its warm answer) are kept beside it;
- (b) the lane's own start, as tests/e2e/test_on_demand.py defines it: the lane's unit started
  directly (`systemctl start`, the deploy's check start), from leaving inactive to active as
  systemd timed it (its container, health wait and answer canary). Nothing needs the unit, so
  systemd stops it right after (StopWhenUnneeded=, docs/on-demand.md).

It prints the medians, the ratio (a) / (b) and the load average beside them, writes them as JSON,
and takes its lab down. Before each start the lane's start-rate counter is reset (`systemctl
reset-failed`: systemd.unit(5), StartLimitIntervalSec=): the lane allows 6 starts an hour
(templates/vllm-lane.service.j2) and the bench makes two a repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from bench.router import stream_chat
from operations.on_demand import proxy_name
from tests.conftest import pyinfra, run_on
from tests.e2e.on_demand_lanes import FAST
from tests.e2e.test_lanes import key_of, unit
from tests.e2e.test_on_demand import INVENTORY, PATIENCE_S, states
from tests.simlab import lab as simlab
from tests.simlab.waits import until

PROXY = proxy_name(FAST["name"])  # what the lane's socket starts, which requires the lane
DEPLOY_TIMEOUT = 1800  # a bare deploy of two hosts on the loaded 2-core machine took up to 354 s


# --- the pure figures ---------------------------------------------------------------------------


def own_start(shown: dict[str, str], after: float) -> float:
    """The seconds of the lane's last start from systemd's timestamps (`systemctl show`,
    microseconds of CLOCK_MONOTONIC, which the lab's hosts share with this machine): from
    leaving inactive to active. RuntimeError unless that start began after `after` (seconds,
    time.monotonic()) and reached active."""
    left = int(shown["InactiveExitTimestampMonotonic"]) / 1e6
    entered = int(shown["ActiveEnterTimestampMonotonic"]) / 1e6
    if left < after or entered < left:
        raise RuntimeError(f"no start of the lane since {after:.3f} s reached active: {shown}")
    return entered - left


def figures(samples: dict[str, list[float]]) -> dict:
    """The medians of each kind of sample (seconds, to three places), and the ratio of the
    request that started its lane over the lane's own start."""
    medians = {name: round(statistics.median(values), 3) for name, values in samples.items()}
    return {"medians_s": medians,
            "ratio": round(medians["on_demand_first_token"] / medians["own_start"], 3)}  # fmt: skip


def table(results: dict) -> list[str]:
    """The lines printed: each figure's median and its samples, then the ratio and the load."""
    labels = {
        "on_demand_first_token": "(a) first token of a request that started the lane",
        "start_within_request": "    the lane's start within it (systemd)",
        "warm_first_token": "    the same request again, the lane serving",
        "own_start": "(b) the lane's own start (unit started directly)",
    }
    lines = [f"{'':52} {'median s':>9}  samples"]
    for name, label in labels.items():
        samples = " ".join(f"{value:.2f}" for value in results["samples_s"][name])
        lines.append(f"{label:52} {results['medians_s'][name]:9.2f}  {samples}")
    loads = results["load_average"]
    low, high = min(loads["samples"]), max(loads["samples"])
    lines.append(f"{'ratio (a) / (b), medians':52} {results['ratio']:9.2f}  load average"
                 f" {loads['start']:.2f} at the start, {loads['end']:.2f} at the end,"
                 f" {low:.2f}-{high:.2f} over the samples")  # fmt: skip
    return lines


# --- the lab ------------------------------------------------------------------------------------


def lane_state(host: simlab.Host) -> tuple[str, str]:
    """(the lane's ActiveState, its proxy's)."""
    shown = states(host, unit(FAST), PROXY)
    return shown[unit(FAST)]["ActiveState"], shown[PROXY]["ActiveState"]


def stopped(host: simlab.Host) -> None:
    """The lane and its proxy inactive (systemd stops the lane once nothing needs it)."""
    until(lambda: lane_state(host) == ("inactive", "inactive"), PATIENCE_S, "the lane stopped")


def on_demand_request(host: simlab.Host, key: str) -> dict[str, float]:
    """(a): the lane stopped, the chat through its front; then the same chat again."""
    stopped(host)
    run_on(host, f"sudo systemctl reset-failed {unit(FAST)} {PROXY}")
    front = f"http://{host.mgmt_ip}:{FAST['port']}"
    asked = time.monotonic()
    first = stream_chat(front, key, FAST["served_name"], timeout=PATIENCE_S)
    within = own_start(states(host, unit(FAST))[unit(FAST)], asked)
    warm = stream_chat(front, key, FAST["served_name"])
    run_on(host, f"sudo systemctl stop {PROXY}")  # not waiting out its idle time
    return {"on_demand_first_token": first, "start_within_request": within,
            "warm_first_token": warm}  # fmt: skip


def started_directly(host: simlab.Host) -> dict[str, float]:
    """(b): the lane stopped, its unit started directly, as systemd timed that start."""
    stopped(host)
    run_on(host, f"sudo systemctl reset-failed {unit(FAST)} {PROXY}")
    asked = time.monotonic()
    run_on(host, f"sudo systemctl start {unit(FAST)}")
    return {"own_start": own_start(states(host, unit(FAST))[unit(FAST)], asked)}


def measure(reps: int) -> dict:
    """Boot, deploy, then (a) and (b) alternating, `reps` of each; the lab is left up."""
    lab = simlab.up(2)
    started = time.monotonic()
    pyinfra(INVENTORY, "deploy.py", timeout=DEPLOY_TIMEOUT)
    deploy_s = time.monotonic() - started
    host = lab.hosts[0]
    key = key_of(host, FAST).strip()
    samples: dict[str, list[float]] = {"on_demand_first_token": [], "start_within_request": [],
                                       "warm_first_token": [], "own_start": []}  # fmt: skip
    loads = []
    for rep in range(reps):
        # Which goes first alternates too: a start may be quicker right after another.
        steps = (lambda: on_demand_request(host, key), lambda: started_directly(host))
        for step in steps if rep % 2 == 0 else reversed(steps):
            loads.append(round(os.getloadavg()[0], 2))
            for name, seconds in step().items():
                samples[name].append(round(seconds, 3))
    stopped(host)
    return {"deploy_s": round(deploy_s, 1), "samples_s": samples, "load_samples": loads}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.on_demand",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions of (a) and of (b)")
    parser.add_argument("--json", default="on-demand-results.json")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the lab needs root")
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    load_start = round(os.getloadavg()[0], 2)
    started = time.monotonic()
    try:
        measured = measure(args.reps)
    finally:
        simlab.down()
    results = {
        "lane": FAST["name"], "inventory": INVENTORY, "reps": args.reps,
        "deploy_s": measured["deploy_s"], "samples_s": measured["samples_s"],
        **figures(measured["samples_s"]),
        "load_average": {"start": load_start, "end": round(os.getloadavg()[0], 2),
                         "samples": measured["load_samples"]},
        "machine": machine, "bench_seconds": round(time.monotonic() - started),
    }  # fmt: skip
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(f"lane {FAST['name']} on demand ({INVENTORY}), {args.reps} repetitions alternating;"
          f" {machine['cpus']} CPUs; deploy {results['deploy_s']:.0f} s")  # fmt: skip
    print("\n".join(table(results)))
    print(f"{args.json} written; the bench took {results['bench_seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

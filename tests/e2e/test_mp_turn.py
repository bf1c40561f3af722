"""An mp cluster lane's headless rank in its box's turn to load, on the simulated lab: the
worker (spark-2) serves a lane of its own (fast) beside its rank of the cluster lane big
(tests/e2e/cluster_mp_turn_inventory.py), and the worker's lane never loads while the rank's start
takes memory: its weights, then its KV cache and CUDA graphs; a worker whose rank never starts
fails the head's start within the rendezvous watch's deadline, naming the rank and its box,
instead of holding it forever.

Each test reads the worker's own journal: the stand-in logs vLLM's lines of a rank's start in
vLLM's order, "Starting to load model", "Model loading took", "Available KV cache memory",
"Graph capturing finished in" (tests/simlab/serving/vllm_standin.py), headless ranks as lanes.
"""

from __future__ import annotations

import pytest

from operations import lanes
from tests.conftest import pyinfra, run_on
from tests.simlab import lab as simlab
from tests.simlab.waits import until

pytestmark = pytest.mark.lab

INVENTORY = "tests/e2e/cluster_mp_turn_inventory.py"
BIG, FAST = lanes.unit_name("big"), lanes.unit_name("fast")
BIG_MODEL = "Qwen/Qwen3-235B-A22B-GPTQ-Int4"
VLLM_PORT = 11103  # the cluster lane's vLLM on the head's loopback (port 10103 + 1000)
HEAD_IP, WORKER_IP = "192.168.100.10", "192.168.100.11"  # inventories/sim.py's first twins
# The watch's deadline to join: half the start timeout of 4 minutes (the inventory's).
JOIN_S = 120


def state(host: simlab.Host, unit: str) -> str:
    return run_on(host, f"systemctl is-active {unit}", check=False).strip()


def serving(head: simlab.Host) -> bool:
    probe = f"curl -fs -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{VLLM_PORT}/health"
    return state(head, BIG) == "active" and run_on(head, probe, check=False).strip() == "200"


def now(host: simlab.Host) -> str:
    return run_on(host, "date '+%Y-%m-%d %H:%M:%S'").strip()


def journal(host: simlab.Host, unit: str, since: str) -> str:
    return run_on(host, f"sudo journalctl -u {unit} --since '{since}' --no-pager -o cat")


def when(host: simlab.Host, unit: str, since: str, text: str) -> float:
    """The time (seconds since the epoch, the journal's own) of the unit's first line since
    `since` that holds `text`; AssertionError naming it if there is none."""
    lines = run_on(
        host, f"sudo journalctl -u {unit} --since '{since}' --no-pager -o short-unix"
    ).splitlines()
    found = [float(line.split()[0]) for line in lines if text in line]
    assert found, f"{host.name} {unit}: no {text!r} since {since}"
    return found[0]


def capture_seconds(host: simlab.Host, seconds: int | None) -> None:
    """The cluster lane's CUDA graphs' capture time on the box (the stand-in reads it beside its
    model's config.json), or none."""
    snapshots = f"/var/lib/spark/models/hub/models--{BIG_MODEL.replace('/', '--')}/snapshots/*/"
    file = "$d/simlab-capture-seconds"
    write = f"echo {seconds} > {file}" if seconds else f"rm -f {file}"
    run_on(host, f"sudo sh -c 'for d in {snapshots}; do {write}; done'")


@pytest.fixture(scope="module")
def cluster(lab: simlab.Lab) -> simlab.Lab:
    # Deployed over whatever the lab holds: in `make test`, what test_cluster.py left (the same
    # work unit, tests/conftest.py CONTINUES), whose cluster lane this changes on every box.
    pyinfra(INVENTORY, "deploy.py")
    head, worker = lab.hosts
    # Weights fetched in the background: the lanes start once they land.
    until(lambda: serving(head) and state(worker, FAST) == "active", 600, "both boxes serving")
    return lab


def test_a_workers_own_lane_waits_until_its_rank_of_the_cluster_lane_is_ready_to_serve(
    cluster: simlab.Lab,
) -> None:
    head, worker = cluster.hosts
    # Long enough for fast to be started once the rank's weights are in, while it captures.
    capture_seconds(worker, 30)
    try:
        run_on(worker, f"sudo systemctl stop {FAST}")
        since = now(worker)
        for host in (head, worker):
            run_on(host, f"sudo systemctl restart --no-block {BIG}")
        until(
            lambda: "Model loading took" in journal(worker, BIG, since),
            JOIN_S + 60,
            "the worker's rank's weights in",
        )
        run_on(worker, f"sudo systemctl start --no-block {FAST}")
        until(
            lambda: serving(head) and state(worker, FAST) == "active",
            300,
            "the cluster lane and the worker's lane serving",
        )
    finally:
        capture_seconds(worker, None)
    rank, own = journal(worker, BIG, since), journal(worker, FAST, since)
    assert "lane fast waits for lane big to finish loading" in own, own[-2000:]
    ready = "this box's rank is ready to serve (weights, KV cache and CUDA graphs in)"
    assert ready in rank, rank[-2000:]
    rank_loaded = when(worker, BIG, since, "Model loading took")
    rank_ready = when(worker, BIG, since, "Graph capturing finished in")
    own_loading = when(worker, FAST, since, "Starting to load model")
    print(
        f"\nworker: rank's weights in {rank_loaded:.1f}, graphs captured {rank_ready:.1f};"
        f" own lane loading from {own_loading:.1f} ({own_loading - rank_ready:+.1f} s)"
    )
    # Never at once: the worker's own lane, started once the rank's weights were in, began
    # loading only after the rank's KV cache and CUDA graphs were in too.
    assert rank_loaded < rank_ready <= own_loading


def test_a_worker_whose_rank_never_starts_fails_the_heads_start_by_name(
    cluster: simlab.Lab,
) -> None:
    head, worker = cluster.hosts
    run_on(worker, f"sudo systemctl stop {BIG}")  # stopped by hand: no restart brings it back
    since = now(head)
    run_on(head, f"sudo systemctl restart --no-block {BIG}")
    said = (
        f"spark-lane-ranks: the rank at {WORKER_IP} (spark-2) has not joined the rendezvous on"
        f" port 29501 within {JOIN_S} s"
    )
    # The watch's deadline, then the head's unit failing its start (Restart= tries again).
    until(lambda: said in journal(head, BIG, since), JOIN_S + 120, "the head's watch naming it")
    took = when(head, BIG, since, said) - when(head, BIG, since, "Starting")
    print(f"\nhead: the rank never started, named after {took:.0f} s")
    assert state(head, BIG) != "active"
    # The worker's rank started again: the lane serves again on both boxes.
    for host in (worker, head):
        run_on(host, f"sudo systemctl restart --no-block {BIG}")
    until(lambda: serving(head), 300, "the cluster lane serving again")
    assert f"every rank joined the rendezvous on port 29501: {HEAD_IP} (spark-1)" in journal(
        worker, BIG, since
    )

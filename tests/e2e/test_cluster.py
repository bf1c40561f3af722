"""The Ray cluster, its firewall and the cluster lane on the simulated lab: two bare hosts, a
deploy of tests/e2e/cluster_inventory.py (seed 004's cluster lane on the head, TP=2) refused for
the model missing on both boxes, then one with fetch_weights on that returns while the head
fetches it from the lab's hub and the worker copies it from the head.

Tests in this module run in order on the session's lab; each later one stands on the deploys
made by the `fetched` fixture (and on what the test before it left: every test ends with both
nodes joined).
"""

from __future__ import annotations

import json
import platform
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from operations import lanes, nccl, preflight, ray, weights
from spark import box_paths
from spark.ports import DASHBOARD_PORT
from tests.conftest import pyinfra, reimage_all, run_on
from tests.e2e import test_fabric_down as fabric_down
from tests.e2e.cluster_lane import CLUSTER_LANE
from tests.e2e.runs import output_of
from tests.e2e.test_compliance import compliance
from tests.e2e.test_host_layer import detected
from tests.e2e.test_weights import hub
from tests.simlab import lab as simlab
from tests.simlab.paths import STATE
from tests.simlab.serving import hf_standin
from tests.simlab.waits import patiently, until

pytestmark = pytest.mark.lab

INVENTORY = "tests/e2e/cluster_inventory.py"
LANE_UNIT = lanes.unit_name(CLUSTER_LANE["name"])
PORT = CLUSTER_LANE["port"]
# vLLM itself, behind the front, on the head's loopback (spark/lane.py: port + 1000 by default).
VLLM_PORT = PORT + 1000
HEAD_IP, WORKER_IP = "192.168.100.10", "192.168.100.11"  # inventories/sim.py's first twin
IMAGE = "nvcr.io/nvidia/vllm:26.04-py3"
# A port of the distributed back-end's (torch's TCPStore), listened on by the test on every
# interface: the firewall, not a bind address, is what keeps the management network off it.
PROBE_PORT = 29500


def changes(result: subprocess.CompletedProcess) -> int:
    """The number of host-operations pyinfra reports as changed (its results table)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    total = re.search(r"Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", text)
    assert total, f"no results table in pyinfra's output:\n{text}"
    assert total[3] == "-", f"pyinfra reported errors:\n{text}"
    return 0 if total[2] == "-" else int(total[2])


# How often a wait asks Ray: as often as spark-ray-nodes itself (its sleep 5). Each `ray status`
# costs a CPU second (1.1 s, measured on the lab), which a wait asking every second took from
# the tests running beside it.
RAY_POLL_S = 5


def until_ray(says: Callable[[], bool], seconds: float, what: str) -> None:
    """until() for a question put to Ray."""
    until(says, seconds, what, every=RAY_POLL_S)


def alive(head: simlab.Host) -> str:
    """What spark-ray-nodes says on the head right now ("N of 2 Ray nodes are alive")."""
    return run_on(head, f"sudo {ray.NODES_COMMAND} 2 2>&1", check=False).strip()


def connects(host_ip: str, port: int, source: simlab.Host | None = None) -> str:
    """'open', 'refused' or 'timeout': a TCP connection from this machine (the management
    network's side) or from a lab host."""
    if source is None:
        try:
            socket.create_connection((host_ip, port), timeout=3).close()
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "timeout"
        return "open"
    probe = (
        f"timeout 3 bash -c '</dev/tcp/{host_ip}/{port}' 2>/dev/null && echo open"
        " || { [ $? -eq 124 ] && echo timeout || echo refused; }"
    )
    return run_on(source, probe, check=False).strip()


# The cluster lane's model as the lab's hub stand-in serves it (tests/simlab/hub.py: the
# serving image's `hf` stand-in's files, config.json and 256 MiB of weights, with their hashes).
MODEL = CLUSTER_LANE["model"]
CACHE = preflight.hf_cache_dir(box_paths.MODELS_DIR, MODEL)
FILES = hf_standin.repository_files(MODEL)
BLOB = hf_standin.repo_file(MODEL, "model.safetensors").blob
FETCH_UNIT = box_paths.fetch_unit(MODEL)
STATUS = weights.status_path(MODEL)
# The hub slowed while the fleet fetches (its bytes a second: 256 MiB in about 65 s), so that the
# deploy returns while the fetches run, and a second one runs before they land (test_weights.py's
# way).
SLOW = 4 * 2**20
# What a deploy says of a running fetch (operations/weights.py progress).
PROGRESS = r"{}: [\d.]+ of [\d.]+ GB \(\d+%\), \d+ MB/s: fetching"


def lane_state(head: simlab.Host) -> str:
    return run_on(head, f"systemctl is-active {LANE_UNIT}", check=False).strip()


def healthy(head: simlab.Host) -> bool:
    probe = f"curl -fs -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{VLLM_PORT}/health"
    return run_on(head, probe, check=False).strip() == "200"


def fetch_state(host: simlab.Host) -> str:
    return run_on(host, f"systemctl show -p ActiveState --value {FETCH_UNIT}").strip()


def fetch_said(host: simlab.Host) -> str:
    """The state in the box's fetch status file (spark_fetch.py --status); "" without one."""
    text = run_on(host, f"sudo cat {STATUS} 2>/dev/null", check=False)
    return json.loads(text)["state"] if text.strip() else ""


def landed_at(host: simlab.Host) -> tuple[float, float]:
    """When the box's fetch unit started and when it landed (CLOCK_MONOTONIC, one clock for
    every host of the lab: they share this machine's kernel), in seconds."""
    shown = run_on(
        host,
        f"systemctl show -p ExecMainStartTimestampMonotonic,ActiveEnterTimestampMonotonic"
        f" {FETCH_UNIT}",
    )
    times = dict(line.split("=", 1) for line in shown.split())
    return (
        int(times["ExecMainStartTimestampMonotonic"]) / 1e6,
        int(times["ActiveEnterTimestampMonotonic"]) / 1e6,
    )


@dataclass
class Fetched:
    """What the module's deploys did: the one that returned while the fleet fetched (its time,
    output, and each box's fetch and NCCL verdict as it returned), the hub's downloads of each
    file since before it, then the deploys after the model landed."""

    lab: simlab.Lab
    took: float
    output: str
    fetching: dict[str, str]  # each box's fetch unit's state as the deploy returned
    lane_then: str  # the head's lane unit's state then
    during: subprocess.CompletedProcess  # a deploy run next, while they still fetched
    still: dict[str, str]  # each box's fetch unit's state as that one returned
    verdicts: dict[str, bool]  # whether each box kept an NCCL verdict then
    downloads: dict[str, int]
    proved: str
    again: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def fetched(lab: simlab.Lab) -> Fetched:
    reimage_all(lab)  # bare boxes: the deploy pulls the serving image from the lab's registry
    # The model is on neither box: without fetch_weights the deploy stops each before any lane
    # starts, saying how to fetch it (a wait of hours is not hidden in a deploy).
    refused = pyinfra(INVENTORY, "deploy.py", "--data", "fetch_weights=False", check=False)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert f"spark-2: {MODEL} is not on this box" in output, output
    assert f"hf download {MODEL}" in output
    # The token is mounted only where the inventory has one (test_host_layer.py plants it).
    assert ("HF_TOKEN_PATH=/run/secrets/hf-token" in output) == (STATE / "hf-token").exists()
    assert lane_state(lab.hosts[0]) in ("inactive", "unknown")  # not started anywhere
    # The user's other way: fetch_weights. The head's unit from the hub, the worker's from the
    # head over the fabric; the deploy returns while they run.
    before = {name: hub("stats")["downloads"].get(f"{MODEL}/{name}", 0) for name in FILES}
    hub("rate", str(SLOW).encode())
    try:
        started = time.monotonic()
        deploy = pyinfra(INVENTORY, "deploy.py", "--data", "fetch_weights=True")
        took = time.monotonic() - started
        fetching = {host.name: fetch_state(host) for host in lab.hosts}
        verdicts = {
            host.name: run_on(
                host, f"sudo test -f {nccl.VERDICT} && echo kept", check=False
            ).strip()
            == "kept"
            for host in lab.hosts
        }
        head = lab.hosts[0]
        lane_then = lane_state(head)
        during = pyinfra(INVENTORY, "deploy.py", "--data", "fetch_weights=True")
        still = {host.name: fetch_state(host) for host in lab.hosts}
        until(lambda: lane_state(head) == "active" and healthy(head), 300, "the lane serving")
    finally:
        hub("rate", str(simlab.HUB_RATE).encode())
    downloads = {
        name: hub("stats")["downloads"].get(f"{MODEL}/{name}", 0) - before[name] for name in FILES
    }
    (head_start, head_landed), (worker_start, worker_landed) = map(landed_at, lab.hosts)
    print(
        f"\ncluster deploy while the fleet fetches: returned in {took:.0f} s; the head's fetch"
        f" {head_landed - head_start:.0f} s from the hub at {SLOW >> 20} MiB/s, the worker's"
        f" landed {worker_landed - head_landed:.1f} s after the head's"
        f" ({worker_landed - worker_start:.0f} s from its start, waiting for the head's files)"
    )
    # The model on every box: the NCCL test runs (the collective proved), then nothing changes.
    proved = pyinfra(INVENTORY, "deploy.py", "--data", "fetch_weights=True")
    again = pyinfra(INVENTORY, "deploy.py", "--data", "fetch_weights=True")
    return Fetched(
        lab,
        took,
        output_of(deploy),
        fetching,
        lane_then,
        during,
        still,
        verdicts,
        downloads,
        output_of(proved),
        again,
    )


@pytest.fixture(scope="module")
def cluster(fetched: Fetched) -> simlab.Lab:
    return fetched.lab


def test_a_missing_model_is_copied_from_the_head_when_fetch_weights_is_on(
    fetched: Fetched,
) -> None:
    head, worker = fetched.lab.hosts
    # The deploy returned while both boxes fetched, saying so, the lane queued after its fetch
    # (started once it landed: the fixture waited for it).
    assert fetched.fetching == {"spark-1": "activating", "spark-2": "activating"}, fetched.output
    assert fetched.lane_then != "active"
    for box in ("spark-1", "spark-2"):
        started = rf"\[{box}\] {re.escape(MODEL)}: .*fetch started \({re.escape(FETCH_UNIT)}"
        assert re.search(started, fetched.output), fetched.output
    # A deploy while they fetch: each box's progress, nothing changed.
    assert fetched.still == {"spark-1": "activating", "spark-2": "activating"}
    during = output_of(fetched.during)
    for box in ("spark-1", "spark-2"):
        assert re.search(rf"\[{box}\] {PROGRESS.format(re.escape(MODEL))}", during), during
    assert changes(fetched.during) == 0, during
    # The NCCL test waited for the weights instead of failing a box: no verdict yet.
    assert fetched.verdicts == {"spark-1": False, "spark-2": False}, fetched.verdicts
    assert (
        f"the NCCL test waits for {MODEL}, not yet on spark-1, spark-2: the cluster lane comes"
        " up once it lands on every box" in fetched.output
    ), fetched.output
    # From the internet once for the fleet: one download of each file, the head's; the
    # worker's unit copied them from the head's blobs over the fabric (its first twin).
    assert fetched.downloads == dict.fromkeys(FILES, 1), fetched.downloads
    unit = run_on(worker, f"systemctl cat {FETCH_UNIT}")
    assert f"--source http://{HEAD_IP}:60991/models--Qwen--Qwen3-235B-A22B-GPTQ-Int4/blobs" in unit
    # spark-2's repository is the head's: the same blobs (checked by the hub's hashes), links,
    # ref; every byte of the weights on the worker's disk.
    listing = f"sudo sh -c 'cd {CACHE} && find . -printf \"%p %l %s\\n\" | sort'"
    on_worker = run_on(worker, listing).splitlines()
    assert [line.rsplit(" ", 1)[0] for line in on_worker] == [
        line.rsplit(" ", 1)[0] for line in run_on(head, listing).splitlines()
    ]
    assert f"./blobs/{BLOB}  {hf_standin.WEIGHTS_BYTES}" in on_worker
    used = run_on(worker, f"sudo du -B1 {CACHE}/blobs/{BLOB}").split()[0]
    assert int(used) >= hf_standin.WEIGHTS_BYTES
    # The next deploy proves the collective (nccl.passed says why each rank runs); the one
    # after changes nothing.
    assert "spark-1: it never ran, spark-2: it never ran" in fetched.proved, fetched.proved
    for host in fetched.lab.hosts:
        assert verdict(host)["passed"]
    assert changes(fetched.again) == 0, output_of(fetched.again)
    assert lane_state(head) == "active" and healthy(head)


def test_a_corrupt_copy_is_caught_by_its_hash(cluster: simlab.Lab) -> None:
    head, worker = cluster.hosts
    blob = f"{CACHE}/blobs/{BLOB}"
    run_on(worker, f"sudo rm -rf {CACHE} {STATUS}")
    # One byte of the head's weights flipped (its disk, or the wire: the worker cannot tell).
    flip = f"printf x | sudo dd of={blob} bs=1 seek=1000 conv=notrunc status=none"
    run_on(head, flip)
    try:
        pyinfra(INVENTORY, "deploy.py", "--data", "fetch_weights=True")
        # The worker's fetch finds it by the hub's hash, deletes it and fails (to start again).
        until(lambda: fetch_said(worker).startswith("failed: "), 120, "the worker's fetch failed")
        said = fetch_said(worker)
        assert f"the hub says {hf_standin.WEIGHTS_BYTES} bytes and {BLOB}: deleted" in said, said
        kept = run_on(worker, f"sudo ls {CACHE}/blobs", check=False).split()
        assert not [name for name in kept if name.startswith(BLOB)], kept
        assert lane_state(head) == "active" and healthy(head)  # the running lane left alone
    finally:
        zero = f"sudo dd if=/dev/zero of={blob} bs=1 count=1 seek=1000 conv=notrunc status=none"
        run_on(head, zero)
    # The unit starts again (RestartSec=30s) and copies the right bytes.
    checked = lambda: run_on(worker, f"sudo sha256sum {blob} 2>/dev/null", check=False)  # noqa: E731
    until(lambda: checked().split()[:1] == [BLOB], 120, "the worker's copy landed")


def test_the_cluster_lane_serves_with_one_bundle_on_each_box(cluster: simlab.Lab) -> None:
    head = cluster.hosts[0]
    assert lane_state(head) == "active" and healthy(head)
    times = run_on(
        head,
        f"systemctl show -p ExecMainStartTimestampMonotonic,ActiveEnterTimestampMonotonic"
        f" {LANE_UNIT}",
    )
    shown = dict(line.split("=", 1) for line in times.split())
    started = int(shown["ActiveEnterTimestampMonotonic"]) - int(
        shown["ExecMainStartTimestampMonotonic"]
    )
    print(f"cluster lane: docker run to /health answering in {started / 1e6:.1f} s")
    placement = json.loads(run_on(head, f"curl -fs http://127.0.0.1:{VLLM_PORT}/simlab/placement"))
    assert placement == {
        "distributed_executor_backend": "ray",
        "world_size": 2,
        "bundle_node_ips": [HEAD_IP, WORKER_IP],
    }
    unit = run_on(head, f"systemctl show -p After,Requires {LANE_UNIT}")
    assert ray.UNIT in unit.split("Requires=")[1], unit
    assert ray.UNIT in unit.split("After=")[1].split("\n")[0], unit
    # A request answered through the cluster lane, from the management network, with its key.
    key = run_on(head, f"sudo cat {box_paths.key_path(CLUSTER_LANE['name'])}").strip()
    body = json.dumps(
        {"model": CLUSTER_LANE["served_name"], "messages": [{"role": "user", "content": "hi"}]}
    )
    answer = patiently(lambda: subprocess.run(
        ["curl", "-fsS", "--noproxy", "*", "-H", f"Authorization: Bearer {key}",
         "-H", "Content-Type: application/json", "-d", body,
         f"http://{head.mgmt_ip}:{PORT}/v1/chat/completions"],
        capture_output=True, text=True, timeout=20, check=True,
    ), 120, "a chat completion")  # fmt: skip
    assert json.loads(answer.stdout)["choices"][0]["message"]["content"].endswith("got: hi")
    # The workers serve no lane of their own: the cluster lane runs there as Ray's ranks.
    assert "spark-lane-" not in run_on(cluster.hosts[1], "sudo docker ps --format '{{.Names}}'")


def test_a_stopped_worker_takes_the_lane_down_with_a_reason_and_it_comes_back(
    cluster: simlab.Lab,
) -> None:
    head, worker = cluster.hosts
    since = run_on(head, "date '+%Y-%m-%d %H:%M:%S'").strip()
    run_on(worker, f"sudo systemctl stop {ray.UNIT}")
    try:
        until(lambda: not healthy(head), 90, "the cluster lane unhealthy")
        journal = lambda: run_on(  # noqa: E731
            head, f"sudo journalctl -u {LANE_UNIT} --since '{since}' --no-pager -o cat"
        )
        until(lambda: "waiting for 2 Ray nodes: 1 alive" in journal(), 90, "the wait said")
        said = journal()
        assert "holding a worker died" in said, said  # vLLM's own reason
        status = lambda: run_on(  # noqa: E731
            head, f"sudo systemctl status {LANE_UNIT} --no-pager -n 20", check=False
        )
        until(lambda: "waiting for 2 Ray nodes: 1 alive" in status(), 60, "the status said")
    finally:
        run_on(worker, f"sudo systemctl start {ray.UNIT}")
    started = time.monotonic()
    until(lambda: lane_state(head) == "active" and healthy(head), 180, "the lane back")
    print(f"cluster lane back {time.monotonic() - started:.0f} s after the worker's start")


def test_deploy_forms_a_two_node_cluster_over_the_fabric(cluster: simlab.Lab) -> None:
    head = cluster.hosts[0]
    until_ray(lambda: alive(head) == "2 of 2 Ray nodes are alive", 120, "both nodes joined")

    def status() -> str:
        return run_on(head, f"sudo docker exec {ray.CONTAINER} ray status")

    # One GPU on each box, none held: right after the test before brought the lane back, Ray
    # may still count a GPU of the lane's old placement group as used ("1.0 used of 2.0
    # reserved", seen in a CI-like run) until it removes that group.
    until_ray(lambda: "0.0/2.0 GPU" in status(), 60, "the old placement group gone")
    # Each node is known by its fabric address (the token comes from the container's env).
    addresses = run_on(
        head,
        f'sudo docker exec {ray.CONTAINER} python3 -c \'import ray; ray.init(address="auto",'
        ' logging_level="ERROR"); print(sorted(n["NodeManagerAddress"] for n in ray.nodes()'
        ' if n["Alive"]))\'',
    )
    assert addresses.strip().splitlines()[-1] == str([HEAD_IP, WORKER_IP])
    for host in cluster.hosts:
        assert run_on(host, f"systemctl is-enabled {ray.UNIT} spark-firewall.service").split() == [
            "enabled",
            "enabled",
        ]


def test_ray_ports_answer_over_the_fabric_only(cluster: simlab.Lab) -> None:
    head, worker = cluster.hosts
    run_on(head, f"sudo systemd-run --unit=probe-listener python3 -m http.server {PROBE_PORT}")
    try:
        until(lambda: connects(HEAD_IP, PROBE_PORT, worker) == "open", 20, "probe listening")
        for port in (6379, PROBE_PORT):
            assert connects(head.mgmt_ip, port) == "refused", port  # from this machine
            assert connects(head.mgmt_ip, port, worker) == "refused", port  # worker, management
            assert connects(HEAD_IP, port, worker) == "open", port  # worker, fabric
        assert connects(head.mgmt_ip, 22) == "open"  # SSH is left alone
    finally:
        run_on(head, "sudo systemctl stop probe-listener", check=False)
    # Ray's dashboard never listens beyond the box.
    listeners = run_on(head, "sudo ss -Hltn")
    assert not re.search(
        rf"^\S+\s+\d+\s+\d+\s+(?!127\.0\.0\.1)\S+:{DASHBOARD_PORT}\s", listeners, re.M
    )


def test_ray_refuses_a_client_without_the_token(cluster: simlab.Lab) -> None:
    _head, worker = cluster.hosts
    client = f"sudo docker run --rm --network host {IMAGE} ray status --address {HEAD_IP}:6379"
    refused = run_on(worker, f"{client} 2>&1", check=False)
    assert "2 node" not in refused and re.search(r"(?i)auth|token", refused), refused
    with_token = (
        f"sudo docker run --rm --network host -e RAY_AUTH_MODE=token"
        f" -e RAY_AUTH_TOKEN_PATH=/t -v {ray.TOKEN_PATH}:/t:ro {IMAGE}"
        f" ray status --address {HEAD_IP}:6379"
    )
    assert "Active:" in run_on(worker, with_token)


def test_the_token_is_root_only_and_shown_nowhere(cluster: simlab.Lab) -> None:
    for host in cluster.hosts:
        assert run_on(host, f"sudo stat -c '%U %a' {ray.TOKEN_PATH}").strip() == "root 600"
        token = run_on(host, f"sudo cat {ray.TOKEN_PATH}").strip()
        assert len(token) == 64
        seen = run_on(
            host,
            f"sudo docker inspect {ray.CONTAINER}; cat {ray.UNIT_PATH} /etc/spark/cluster.env;"
            f" ps -eo args; sudo journalctl -u {ray.UNIT} --no-pager",
        )
        assert token not in seen


def test_a_stopped_worker_leaves_and_rejoins_when_started(cluster: simlab.Lab) -> None:
    head, worker = cluster.hosts
    run_on(worker, f"sudo systemctl stop {ray.UNIT}")
    until_ray(lambda: alive(head).startswith("1 of 2"), 120, "the head sees the worker gone")
    run_on(worker, f"sudo systemctl start {ray.UNIT}")
    until_ray(lambda: alive(head) == "2 of 2 Ray nodes are alive", 120, "the worker rejoined")


def test_a_worker_started_before_its_head_keeps_trying_until_it_joins(cluster: simlab.Lab) -> None:
    head, worker = cluster.hosts
    run_on(head, f"sudo systemctl stop {ray.UNIT}")
    since = run_on(worker, "date '+%Y-%m-%d %H:%M:%S'").strip()
    run_on(worker, f"sudo systemctl restart {ray.UNIT}")
    # Ray's own word that it asked the head and found none: a warning 5 s into each try (Ray
    # 2.60's rpc_client.h, seen from `ray start --address` with nothing listening there).
    tried = f"Failed to connect to GCS at address {HEAD_IP}:6379 within 5 seconds"

    def ray_log() -> str:
        return run_on(worker, f"sudo journalctl -u {ray.UNIT} --since '{since}' --no-pager")

    until(lambda: tried in ray_log(), 120, "the worker's Ray trying its stopped head")
    # Still trying (its ray start tries for minutes: node.py _init_gcs_client's 20 tries, each
    # waiting for the head; then systemd starts it again), not given up.
    state = run_on(worker, f"systemctl is-active {ray.UNIT}", check=False).strip()
    assert state in ("active", "activating"), state
    # Stopping the head's Ray stopped the cluster lane too (Requires=); starting the lane
    # starts Ray again, and the lane waits for both nodes.
    run_on(head, f"sudo systemctl start --no-block {LANE_UNIT}")
    # Seen joining 72 s and 160 s after the start (a worker between two `ray start` tries
    # waits out its GCS reconnect timeout, then systemd's restart delay): the bound is for a
    # worker that never joins.
    until_ray(lambda: alive(head) == "2 of 2 Ray nodes are alive", 300, "the worker joined")


def test_a_flushed_firewall_chain_fails_compliance_and_the_deploy_restores_it(
    cluster: simlab.Lab,
) -> None:
    # The table's comment (its digest) outlives a flush: before issue 15 the deploy and the
    # compliance check both read only that, and Ray's port answered from management.
    head, worker = cluster.hosts
    run_on(worker, "sudo nft flush chain inet spark input")
    code, table, output = compliance("-k", "firewall")
    assert code != 0, output
    assert table["firewall table as deployed"][head.name] == "PASS", output
    assert "rules differ" in table["firewall table as deployed"][worker.name], output
    deploy = pyinfra(INVENTORY, "deploy.py")
    firewall_rows = [
        line
        for line in output_of(deploy).splitlines()
        if line.strip().startswith("Cluster | Firewall:")  # the stage, then the operation
    ]
    assert firewall_rows and firewall_rows[0].split()[-4:] == ["2", "1", "-", "1"], firewall_rows
    run_on(worker, f"sudo systemd-run --unit=probe-listener python3 -m http.server {PROBE_PORT}")
    try:
        until(lambda: connects(WORKER_IP, PROBE_PORT, head) == "open", 20, "probe listening")
        assert connects(worker.mgmt_ip, PROBE_PORT) == "refused"  # management: closed again
    finally:
        run_on(worker, "sudo systemctl stop probe-listener", check=False)
    code, table, output = compliance("-k", "firewall")
    assert code == 0, output


# A UDP listener on the box that writes what it gets: WireGuard's port and one in the ephemeral
# range, where the cluster's TCP ports are closed to management.
UDP_ECHO = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', int(sys.argv[1])))\n"
    "open(sys.argv[2], 'wb').write(s.recvfrom(64)[0])\n"
)


def test_udp_on_the_management_network_passes_the_cluster_firewall(cluster: simlab.Lab) -> None:
    _head, worker = cluster.hosts
    for port in (51820, 40000):  # WireGuard's; an ephemeral one
        got = f"/tmp/udp-{port}"
        run_on(
            worker,
            f"sudo rm -f {got}; sudo systemd-run --unit=udp-{port} python3 -c"
            f" {shlex.quote(UDP_ECHO)} {port} {got}",
        )

        def arrived(port: int = port, got: str = got) -> bool:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
                sender.sendto(b"handshake", (worker.mgmt_ip, port))
            return run_on(worker, f"sudo cat {got} 2>/dev/null", check=False) == "handshake"

        until(arrived, 60, f"UDP {port} from the management network")


# --- the NCCL test (issue 13): the deploy ran it before the cluster lane started --------------

TWINS = ("rocep1s0f1", "roceP2p1s0f1")


def nccl_on_every_box(lab: simlab.Lab, command: str = f"sudo {nccl.COMMAND}") -> list[str]:
    """``command`` (a run of the NCCL test) on every box at once, as the user starts it: each
    box's output, its stderr after it, and its exit status last ("rc=N")."""
    with ThreadPoolExecutor(len(lab.hosts)) as pool:
        runs = [
            pool.submit(run_on, box, f'{command} 2>&1; echo "rc=$?"', check=False)
            for box in lab.hosts
        ]
        return [run.result() for run in runs]


def verdict(box: simlab.Host) -> dict:
    return json.loads(run_on(box, f"sudo cat {nccl.VERDICT}"))


def test_the_nccl_test_passed_over_both_twins_and_compliance_says_so(cluster: simlab.Lab) -> None:
    for box in cluster.hosts:
        kept = verdict(box)
        assert kept["passed"], kept["problems"]
        # every box judges every rank's NCCL log: the verdict is the cluster's
        for rank, (me, its_box) in enumerate(zip(kept["ranks"], cluster.hosts, strict=True)):
            assert (me["rank"], me["host"], me["network"]) == (rank, its_box.name, "IB")
            assert sorted(me["ib_devices"]) == sorted(TWINS)
            assert me["channels"] == {"NET/IB/0": 2, "NET/IB/1": 2}  # send, receive per twin
            # The image's NCCL (the table knows none of 26.04's: the stand-in's 2.29.7) on the
            # lab's own architecture, which the rank read in its container (a Spark's: aarch64).
            assert (me["version"], me["machine"]) == ("2.29.7+simlab", platform.machine())
        assert [(row["op"], row["bytes"], row["wrong"]) for row in kept["rows"]] == [
            (op, size, 0) for op in ("all_gather", "all_reduce") for size in (1 << 20, 4 << 20)
        ]
    report = run_on(cluster.hosts[0], f"sudo cat {nccl.RESULT_DIR}/run/report.txt")
    print(report)  # the lab's numbers: the stand-in's TCP over veths, not a Spark's
    assert re.search(r"^all_gather\s+4194304  RING/SIMPLE ", report, re.M), report
    code, table, output = compliance("-k", "nccl")
    assert code == 0 and table["NCCL test passed"] == {"spark-1": "PASS", "spark-2": "PASS"}, output


def test_a_twin_left_out_or_no_rdma_devices_fail_the_nccl_test_naming_box_and_twin(
    cluster: simlab.Lab,
) -> None:
    worker = cluster.hosts[1]
    env = "/etc/spark/cluster.env"
    # spark-2's environment names one twin only: its rank fails, naming the twin left out, and
    # so does the head's, whose own rank did well: the verdict is the cluster's.
    run_on(worker, f"sudo cp {env} /tmp/cluster.env.kept")
    run_on(worker, f"sudo sed -i 's/^NCCL_IB_HCA=.*/NCCL_IB_HCA=\"{TWINS[0]}\"/' {env}")
    try:
        said = nccl_on_every_box(cluster)
    finally:
        run_on(worker, f"sudo cp /tmp/cluster.env.kept {env}")
    for words in said:
        assert f"FAIL: rank 1 (spark-2): NCCL does not use {TWINS[1]} (NET/IB uses {TWINS[0]})" in (
            words
        ), words
        assert "FAIL: rank 0" not in words and words.endswith("rc=1\n"), words
    code, table, _ = compliance("-k", "nccl")
    assert code != 0 and {
        box: cell.startswith("FAIL rank 1 (spark-2)")
        for box, cell in table["NCCL test passed"].items()
    } == {"spark-1": True, "spark-2": True}, table["NCCL test passed"]
    # The container started without the RDMA devices (a `docker run` without --device
    # /dev/infiniband): NCCL falls back to sockets on every box, and says so.
    nodev = f"sed 's| --device /dev/infiniband||' {nccl.COMMAND} > /tmp/nccl-nodev"
    said = nccl_on_every_box(cluster, f"{nodev} && sudo bash /tmp/nccl-nodev")
    for rank, (box, words) in enumerate(zip(cluster.hosts, said, strict=True)):
        assert (
            f"FAIL: rank {rank} ({box.name}): NCCL fell back to sockets (NET/Socket on"
            f" enp1s0f1np1): NCCL_IB_HCA={','.join(TWINS)} found no device; no usable RDMA device"
            " in the container (--device /dev/infiniband" in words
        ), words
        assert words.endswith("rc=1\n")
    # As it was: the next deploy (the test after this one) changes nothing.
    assert all(words.endswith("rc=0\n") for words in nccl_on_every_box(cluster))


def test_second_deploy_changes_nothing(cluster: simlab.Lab) -> None:
    head = cluster.hosts[0]
    until(lambda: lane_state(head) == "active" and healthy(head), 180, "the lane serving")
    before = run_on(head, "sudo docker inspect -f '{{.Id}}' spark-lane-big").strip()
    assert changes(pyinfra(INVENTORY, "deploy.py")) == 0
    assert run_on(head, "sudo docker inspect -f '{{.Id}}' spark-lane-big").strip() == before


# --- the same lane on vLLM's own multi-node mode (executor mp), last: it leaves Ray removed ------

MP_INVENTORY = "tests/e2e/cluster_mp_inventory.py"


def journal(host: simlab.Host, since: str) -> str:
    return run_on(host, f"sudo journalctl -u {LANE_UNIT} --since '{since}' --no-pager", check=False)


def answers(head: simlab.Host) -> int:
    """The HTTP status of a chat request through the head's front, from the management network,
    with the lane's key (a head that lost a rank still answers /health, not this)."""
    key = run_on(head, f"sudo cat {box_paths.key_path(CLUSTER_LANE['name'])}").strip()
    body = json.dumps(
        {"model": CLUSTER_LANE["served_name"], "messages": [{"role": "user", "content": "hi"}]}
    )
    status = patiently(lambda: subprocess.run(
        ["curl", "-sS", "--noproxy", "*", "-o", "/dev/null", "-w", "%{http_code}",
         "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
         "-d", body, f"http://{head.mgmt_ip}:{PORT}/v1/chat/completions"],
        capture_output=True, text=True, timeout=20,
    ), 120, "a chat completion's status")  # fmt: skip
    return int(status.stdout or 0)


def test_the_lane_on_an_image_without_ray_runs_on_vllms_own_multinode_mode(
    cluster: simlab.Lab,
) -> None:
    head, worker = cluster.hosts
    started = run_on(head, "date '+%Y-%m-%d %H:%M:%S'").strip()
    # No -y: the plan, then Enter (this test, both typed runs and compliance: 66 s on the lab).
    deploy = pyinfra(MP_INVENTORY, "deploy.py", typed=True)
    print(f"cluster lane moved to executor mp on 26.10: {changes(deploy)} changes")
    # No Ray on either box; a unit of the lane on each: the head serving, the worker's rank
    # headless, joined to the head's rendezvous (port 29501) over the fabric.
    for host in cluster.hosts:
        assert run_on(host, f"systemctl is-active {LANE_UNIT}").strip() == "active"
        assert run_on(host, f"systemctl cat {ray.UNIT} 2>&1", check=False).startswith("No files")
    assert healthy(head)
    head_log, worker_log = journal(head, started), journal(worker, started)
    assert "every rank joined the rendezvous on port 29501: 192.168.100.11" in head_log
    assert "every rank joined the rendezvous on port 29501: 192.168.100.10" in worker_log
    assert "lane big: canary passed" in head_log, head_log[-2000:]
    started_args = run_on(worker, "sudo docker inspect -f '{{.Args}}' spark-lane-big")
    assert "--node-rank 1 --master-addr 192.168.100.10 --master-port 29501 --headless" in (
        started_args
    ), started_args
    # The rendezvous port is the fabric's only, like the cluster's other ports.
    assert connects(head.mgmt_ip, 29501) == "refused"
    assert connects(HEAD_IP, 29501, worker) == "open"
    code, table, output = compliance(inventory=MP_INVENTORY)
    assert code == 0, output
    assert table["cluster lane active, all nodes in"] == {head.name: "PASS", worker.name: "PASS"}
    assert table["Ray unit enabled and running"][worker.name].startswith("SKIP"), output
    again = pyinfra(MP_INVENTORY, "deploy.py", typed=True)
    assert detected(again) == [] and changes(again) == 0, output_of(again)


def test_an_mp_rank_lost_or_a_head_restarted_brings_the_lane_back_on_every_box(
    cluster: simlab.Lab,
) -> None:
    head, worker = cluster.hosts
    # The worker's rank dies (its box's container killed): the head's watch sees the rank leave
    # and restarts the head, which serves again once the worker's unit has started it again.
    assert answers(head) == 200
    since = run_on(head, "date '+%Y-%m-%d %H:%M:%S'").strip()
    run_on(worker, "sudo docker kill spark-lane-big")
    until(lambda: "left the rendezvous" in journal(head, since), 60, "the head seeing it")
    # Back means answering again (the head restarted: its canary passed anew), not /health
    # alone: a head that lost its rank keeps /health (the stand-in, like vLLM, until a
    # collective fails) and answers every request 500.
    until(lambda: "canary passed" in journal(head, since), 240, "the head started again")
    until(lambda: answers(head) == 200, 60, "the lane answering")
    assert "the rank at 192.168.100.11 (spark-2) left the rendezvous on port 29501" in journal(
        head, since
    )
    # The head restarted: vLLM's headless rank would stay in the old group for good
    # (vllm#32136); the worker's watch restarts it, and it joins the head's new start.
    since = run_on(worker, "date '+%Y-%m-%d %H:%M:%S'").strip()
    run_on(head, f"sudo systemctl restart {LANE_UNIT}")
    assert healthy(head) and answers(head) == 200
    worker_log = journal(worker, since)
    assert "the rank at 192.168.100.10 (spark-1) left the rendezvous on port 29501" in worker_log
    assert run_on(worker, f"systemctl is-active {LANE_UNIT}").strip() == "active"
    # The fabric cut between the boxes (a box lost, or its cable): nothing closes the ranks'
    # connections, and the watches take the fabric's silence for the loss; mended, they meet.
    since = run_on(head, "date '+%Y-%m-%d %H:%M:%S'").strip()
    drop = f"{{ type filter hook ingress device {fabric_down.A} priority -500; policy drop; }}"
    for host in cluster.hosts:
        fabric_down.nft(host, "add", "table", "netdev", fabric_down.CUT_TABLE)
        fabric_down.nft(host, "add", "chain", "netdev", fabric_down.CUT_TABLE, "cut", drop)
    try:
        silence = "the rank at {} answers no ping on the fabric (its box lost?)"
        until(
            lambda: silence.format(f"{WORKER_IP} (spark-2)") in journal(head, since),
            90,
            "the head's watch",
        )
        # The worker's watch too: until it takes it, its rank's connection to the head stays
        # established (nothing closes it) and compliance would find it joined.
        until(
            lambda: silence.format(f"{HEAD_IP} (spark-1)") in journal(worker, since),
            90,
            "the worker's watch",
        )
        # Meanwhile no rank can join: compliance names the lane on both boxes.
        code, table, output = compliance("-k", "cluster_lane", inventory=MP_INVENTORY)
        assert code != 0, output
        row = table["cluster lane active, all nodes in"]
        assert all(cell.startswith("FAIL") for cell in row.values()), output
        assert "rendezvous 29501 with none" in row[worker.name], output
    finally:
        for host in cluster.hosts:
            fabric_down.nft(host, "delete", "table", "netdev", fabric_down.CUT_TABLE)
    until(lambda: "canary passed" in journal(head, since), 300, "the head serving again")
    until(lambda: answers(head) == 200, 60, "the lane answering")

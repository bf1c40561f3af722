"""The metrics endpoint on the deployed lab (issue 28): from the management network it refuses a
scrape without the box's metrics key, answers with it, and serves each lane's own metrics behind
the same key (a lane's key is not it); `make status` reads every box from the endpoints and is
green on a healthy lab (its twins read a Spark's 200000 Mb/s: the lab's rate stand-in). The
distribution's Prometheus on this machine, given `make prometheus-config`'s files,
scrapes every box and lane with the keys and is refused without them; then faults made on the
lab (a twin's MTU, its GID entry, its link rate, a lane stopped, a lane answering gibberish,
memory below the floor) are each a series, a red `make status` and a pending or firing alert
after one collection (started at once, as the timer would within its interval), each put back
after; a slower twin the inventory accepts (fabric_link_speed_low = "warn") is a warning: shown,
`make status` exits 0, its alert's severity "warning".

Tests in this module run in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from operations import metrics
from spark import prometheus as fleet
from spark.box_paths import FLEET_KEY, key_path
from tests.conftest import Deployed, pyinfra, run_on
from tests.simlab import lab as simlab
from tests.simlab.loopback import free_port
from tests.simlab.paths import REPO, STATE
from tests.simlab.rootfs import prometheus_binaries
from tests.simlab.waits import patiently, until

pytestmark = pytest.mark.lab

TWIN, HCA = simlab.FABRIC_TWINS[0]
INTERVAL_S = 30  # group_data's metrics_interval_s: a fault is seen within one
# The test's copy of the generated configuration scrapes and evaluates oftener than the plan's
# interval, so the time measured is the collection's and Prometheus' own, not a wait.
SCRAPE_S, EVALUATE_S = 2, 1


def scrape(host: simlab.Host, key: str | None, path: str = "/metrics") -> tuple[int, str]:
    request = urllib.request.Request(f"http://{host.mgmt_ip}:9100{path}")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")

    def ask() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    return patiently(ask, 60, request.full_url)


def key_of(host: simlab.Host) -> str:
    return run_on(host, f"sudo cat {metrics.KEY_PATH}").strip()


def collect(host: simlab.Host) -> None:
    """One collection now, as the timer starts it."""
    run_on(host, f"sudo systemctl start {metrics.SERVICE}")


def collected_fresh(host: simlab.Host) -> None:
    """A test or module before may have restarted a lane after the collector's last run (every
    30 s): once every lane of the box is active again, one collection now."""
    lanes = "spark-lane-coder spark-lane-fast"
    run_on(host, f"timeout 300 sh -c 'until systemctl is-active -q {lanes}; do sleep 2; done'")
    collect(host)


def test_the_endpoint_asks_the_key_and_serves_the_collectors_figures(
    deployed_lab: Deployed,
) -> None:
    for host in deployed_lab.lab.hosts:
        collected_fresh(host)
        assert scrape(host, None)[0] == 401
        assert scrape(host, "not-the-key")[0] == 401
        code, text = scrape(host, key_of(host))
        assert code == 200
        assert 'spark_lane_up{lane="coder"} 1' in text.splitlines()
        assert "node_load1 " in text  # the node exporter's own figures beside them
        assert f'spark_twin_mtu_bytes{{hca="{simlab.FABRIC_TWINS[0][1]}",twin="{TWIN}"}} 9000' in (
            text.splitlines()
        )


@pytest.fixture(scope="module")
def keys(deployed_lab: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each box's metrics key, copied as the README says, one file per box; and the fleet key of
    each box holding one (a router's), which make status and Prometheus ask the router with,
    where make clients copies it (spark/prometheus.py FLEET_KEYS)."""
    directory = tmp_path_factory.mktemp("metrics-keys")
    (directory / fleet.FLEET_KEYS).mkdir()
    for host in deployed_lab.lab.hosts:
        (directory / f"{host.name}.key").write_text(key_of(host))
        if fleet_key := run_on(host, f"sudo cat {FLEET_KEY} 2>/dev/null || true").strip():
            (directory / fleet.FLEET_KEYS / f"{host.name}.key").write_text(fleet_key)
    return directory


def make_status(keys: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(REPO) / ".venv/bin/python"), "-m", "stages.status",
         "--inventory", "inventories/sim.py", "--keys-dir", str(keys)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, SIMLAB_STATE=str(STATE)),
    )  # fmt: skip


def status_row(keys: Path, host: simlab.Host) -> str:
    lines = make_status(keys).stdout.splitlines()
    return next(line for line in lines if line.startswith(f"{host.name} "))


def test_make_status_reads_every_box_without_ssh(deployed_lab: Deployed, keys: Path) -> None:
    for host in deployed_lab.lab.hosts:
        collected_fresh(host)
        # Its cost: the CPU systemd counted for that run (the commands it ran included).
        cpu = run_on(host, f"systemctl show {metrics.SERVICE} -p CPUUsageNSec --value").strip()
        print(f"{host.name}: one collection, {int(cpu) / 1e6:.0f} ms of CPU")
    started = time.monotonic()
    done = make_status(keys)
    print(f"make status on the lab, {time.monotonic() - started:.2f} s:\n{done.stdout}")
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[0].split()[:2] == ["box", "lanes"]
    # The drift column, between its heading and the GPU clock's (the last column).
    drift = slice(lines[0].index("drift"), lines[0].index("GPU clock"))
    for host in deployed_lab.lab.hosts:
        row = next(line for line in lines if line.startswith(f"{host.name} "))
        assert "coder up, fast up" in row
        assert f"{TWIN} 200G/9000/gid 3" in row
        assert row[drift].strip() == "-"  # no drift
        assert row.rstrip().endswith("max 2200 MHz")  # group_data's lock, read from its journal


def test_a_lanes_own_metrics_answer_the_metrics_key_alone(deployed_lab: Deployed) -> None:
    """vLLM's series through the metrics port with the box's metrics key; no key and the lane's
    own key are refused there, and the lane's port serves no /metrics to its key."""
    for host in deployed_lab.lab.hosts:
        lane_key = run_on(host, f"sudo cat {key_path('coder')}").strip()
        path = "/lanes/coder/metrics"
        assert scrape(host, None, path)[0] == 401
        assert scrape(host, lane_key, path)[0] == 401
        code, text = scrape(host, key_of(host), path)
        assert code == 200
        assert 'vllm:num_requests_running{engine="0",model_name="qwen3-coder-next"} 0.0' in (
            text.splitlines()
        )
        request = urllib.request.Request(f"http://{host.mgmt_ip}:10101/metrics")
        request.add_header("Authorization", f"Bearer {lane_key}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 404


@dataclass
class Prometheus:
    url: str
    log: Path

    def get(self, path: str) -> dict:
        def ask() -> dict:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as response:
                return json.load(response)["data"]

        return patiently(ask, 60, f"{self.url}{path}")

    def targets(self) -> dict[str, dict]:
        return {t["labels"]["job"]: t for t in self.get("/api/v1/targets")["activeTargets"]}

    def alerts(self) -> list[dict]:
        return self.get("/api/v1/alerts")["alerts"]


@pytest.fixture(scope="module")
def prometheus(
    deployed_lab: Deployed, keys: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    """`make prometheus-config`'s files for the lab, its keys beside them; the test's copy
    scrapes every SCRAPE_S and evaluates every EVALUATE_S, and adds, for each box, a job with no
    key and one with a lane's key on the lane's path, which the boxes must refuse."""
    out = tmp_path_factory.mktemp("prometheus")
    subprocess.run(
        [str(Path(REPO) / ".venv/bin/python"), "-m", "stages.prometheus_config",
         "--inventory", "inventories/sim.py", "--out", str(out), "--keys-dir", str(keys)],
        cwd=REPO, check=True, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, SIMLAB_STATE=str(STATE)),
    )  # fmt: skip
    config = json.loads((out / "prometheus.yml").read_text())
    config["global"]["evaluation_interval"] = f"{EVALUATE_S}s"
    jobs = config["scrape_configs"]
    refused = []
    for host in deployed_lab.lab.hosts:
        lane_key = out / f"{host.name}-coder.key"
        lane_key.write_text(run_on(host, f"sudo cat {key_path('coder')}").strip())
        box_job = next(job for job in jobs if job["job_name"] == fleet.job_name(host.name))
        lane_job = next(
            job for job in jobs if job["job_name"] == fleet.lane_job_name(host.name, "coder")
        )
        no_key = {k: v for k, v in box_job.items() if k != "authorization"}
        refused.append(no_key | {"job_name": f"no-key/{host.name}"})
        refused.append(
            lane_job
            | {"job_name": f"lane-key/{host.name}"}
            | {"authorization": {"type": "Bearer", "credentials_file": str(lane_key)}}
        )
    for job in jobs + refused:
        job["scrape_interval"] = f"{SCRAPE_S}s"
    config["scrape_configs"] = jobs + refused
    (out / "prometheus.yml").write_text(json.dumps(config, indent=1))
    port = free_port()
    log = out / "prometheus.log"
    with log.open("w") as output:
        server = subprocess.Popen(
            [str(prometheus_binaries() / "prometheus"),
             f"--config.file={out / 'prometheus.yml'}", f"--storage.tsdb.path={out / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2):
                return True
        except OSError:
            return server.poll() is not None  # stopped: the assert below says so

    try:
        until(ready, 60, "Prometheus ready", every=0.25)
        assert server.poll() is None, log.read_text()
        yield Prometheus(url, log)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_prometheus_scrapes_every_box_and_lane_with_its_key_and_is_refused_without(
    deployed_lab: Deployed, prometheus: Prometheus
) -> None:
    hosts = deployed_lab.lab.hosts
    spark_jobs = {
        job
        for host in hosts
        for job in (
            fleet.job_name(host.name),
            fleet.lane_job_name(host.name, "coder"),
            fleet.lane_job_name(host.name, "fast"),
        )
    }
    refused = {f"{kind}/{host.name}" for kind in ("no-key", "lane-key") for host in hosts}

    def scraped() -> dict[str, dict] | None:
        targets = prometheus.targets()
        done = spark_jobs | refused <= set(targets)
        return targets if done and all(targets[j]["health"] != "unknown" for j in targets) else None

    targets = until(scraped, 30, "every target scraped once", every=0.25)
    assert isinstance(targets, dict)
    for job in spark_jobs:
        assert targets[job]["health"] == "up", (job, targets[job]["lastError"])
    for job in refused:
        assert targets[job]["health"] == "down"
        assert "401 Unauthorized" in targets[job]["lastError"], targets[job]["lastError"]
    # The lanes' own series, labelled with their box and lane.
    query = "/api/v1/query?query=vllm:num_requests_running"
    series = {(r["metric"]["box"], r["metric"]["lane"]) for r in prometheus.get(query)["result"]}
    assert series == {(host.name, lane) for host in hosts for lane in ("coder", "fast")}


@dataclass
class Fault:
    """A fault made on a box by hand, what shows it, and how it is put back."""

    make: Callable[[simlab.Host], object]
    restore: Callable[[simlab.Host], object]
    alert: str
    labels: dict[str, str]
    series: str  # a line of the box's metrics
    status: str  # in the box's row of make status
    journal: str = ""


SNAPSHOTS = "/var/lib/spark/models/hub/models--*/snapshots/*/"
SAVED = f"{metrics.EXPECTED}.saved"
RAISED = 's/"floor_gib": [0-9.]*/"floor_gib": 100000/'


FAULTS = {
    "mtu 1500 by hand": Fault(
        make=lambda host: run_on(host, f"sudo ip link set {TWIN} mtu 1500"),
        # What the drift line says to run.
        restore=lambda host: run_on(host, f"sudo nmcli connection up fabric-{TWIN}"),
        alert="SparkFabricDrifted",
        labels={"kind": "mtu", "subject": TWIN, "found": "1500"},
        series='spark_drift{expected="9000",found="1500",kind="mtu",severity="critical",'
        f'subject="{TWIN}"}} 1',
        status=f"mtu {TWIN} 1500 (plan 9000)",
        journal=f"drift: mtu {TWIN}: 1500, the plan says 9000; nmcli connection up fabric-{TWIN}",
    ),
    # Set down by hand: NetworkManager still shows its profile activated; the link's flags tell.
    "twin set down": Fault(
        make=lambda host: run_on(host, f"sudo ip link set {TWIN} down"),
        restore=lambda host: run_on(host, f"sudo nmcli connection up fabric-{TWIN}"),
        alert="SparkFabricDrifted",
        labels={"kind": "link", "subject": TWIN, "found": "down"},
        series='spark_drift{expected="up",found="down",kind="link",severity="critical",'
        f'subject="{TWIN}"}} 1',
        status=f"link {TWIN} down (plan up)",
        journal=f"drift: link {TWIN}: down, the plan says up; nmcli connection up fabric-{TWIN}",
    ),
    "gid entry moved to 4": Fault(
        make=lambda host: simlab.set_hardware(host, ipv4_roce_v2_index=4),
        restore=lambda host: simlab.set_hardware(host, ipv4_roce_v2_index=3),
        alert="SparkFabricDrifted",
        labels={"kind": "gid", "subject": TWIN, "found": "4"},
        series=f'spark_twin_roce_v2_gid_index{{hca="{HCA}",twin="{TWIN}"}} 4',
        status=f"gid {TWIN} 4 (plan 3)",
    ),
    "twin at 100000 Mb/s": Fault(
        make=lambda host: simlab.set_hardware(host, link_speeds={TWIN: 100000}),
        restore=lambda host: simlab.set_hardware(host, link_speeds={}),
        alert="SparkFabricDrifted",
        labels={"kind": "rate", "subject": TWIN, "found": "100000"},
        series=f'spark_twin_rate_mbps{{hca="{HCA}",twin="{TWIN}"}} 100000',
        status=f"rate {TWIN} 100000 (plan >= 200000)",
    ),
    "lane stopped": Fault(
        make=lambda host: run_on(host, "sudo systemctl stop spark-lane-fast"),
        restore=lambda host: run_on(host, "sudo systemctl start spark-lane-fast"),
        alert="SparkLaneDown",
        labels={"lane": "fast"},
        series='spark_lane_up{lane="fast"} 0',
        status="fast DOWN",
    ),
    # As test_lanes makes a lane's model answer gibberish (the stand-in reads simlab-answer
    # beside the model's config.json); the lane restarted, its canary fails its start.
    "lane answering gibberish": Fault(
        make=lambda host: run_on(
            host,
            f"sudo sh -c 'for d in {SNAPSHOTS}; do echo gibberish > $d/simlab-answer; done;"
            " systemctl restart spark-lane-fast'",
            check=False,
        ),
        restore=lambda host: run_on(
            host, f"sudo sh -c 'rm -f {SNAPSHOTS}simlab-answer; systemctl restart spark-lane-fast'"
        ),
        alert="SparkCanaryFailing",
        labels={"lane": "fast"},
        series='spark_lane_canary_passed{lane="fast"} 0',
        status="fast DOWN,canary FAILED",
    ),
    # The guard's floor as the plan gives it to the collector, raised above all the lab's
    # memory (as test_lanes raises the guard's own threshold), then put back.
    "memory below the floor": Fault(
        make=lambda host: run_on(
            host,
            f"sudo cp -p {metrics.EXPECTED} {SAVED} && sudo sed -i '{RAISED}' {metrics.EXPECTED}",
        ),
        restore=lambda host: run_on(host, f"sudo mv {SAVED} {metrics.EXPECTED}"),
        alert="SparkMemoryBelowFloor",
        labels={},
        # As the node exporter writes a float (Go's strconv 'g', shortest): 100000 GiB.
        series="spark_memory_guard_floor_bytes 1.073741824e+14",
        status="/100000 GiB",
    ),
}


@pytest.mark.parametrize("name", FAULTS)
def test_a_fault_is_a_series_a_red_status_and_an_alert_within_one_collection(
    deployed_lab: Deployed, keys: Path, prometheus: Prometheus, name: str
) -> None:
    fault, host = FAULTS[name], deployed_lab.lab.hosts[0]
    labels = {"alertname": fault.alert, "box": host.name} | fault.labels

    def alerted() -> dict | None:
        return next((a for a in prometheus.alerts() if labels.items() <= a["labels"].items()), None)

    assert alerted() is None
    started = time.monotonic()
    try:
        fault.make(host)
        made = time.monotonic()
        collect(host)
        alert = until(alerted, INTERVAL_S, f"{fault.alert} {fault.labels}", every=0.25)
        seen = time.monotonic()
        assert isinstance(alert, dict) and alert["state"] in ("pending", "firing")
        print(f"fault {name!r}: made in {made - started:.1f} s, {fault.alert} {alert['state']}"
              f" {seen - made:.1f} s after")  # fmt: skip
        row = status_row(keys, host)
        print(row)
        assert fault.status in row
        if fault.journal:
            journal = run_on(host, f"sudo journalctl -u {metrics.SERVICE} -n 20 --no-pager")
            assert fault.journal in journal
    finally:
        fault.restore(host)
        collect(host)
    assert fault.series not in scrape(host, key_of(host))[1].splitlines()
    assert fault.status not in status_row(keys, host)


def test_a_slow_twin_the_inventory_accepts_is_a_warning_and_status_exits_0(
    deployed_lab: Deployed, keys: Path, prometheus: Prometheus
) -> None:
    host = deployed_lab.lab.hosts[1]
    labels = {"alertname": "SparkFabricDrifted", "box": host.name, "kind": "rate"}
    simlab.set_hardware(host, link_speeds={TWIN: 100000})
    try:
        # The plan's choice reaches the collector with the deploy (expected.json's rate_low).
        pyinfra("inventories/sim.py", "deploy.py", "--data", "fabric_link_speed_low=warn")
        collect(host)
        done = make_status(keys)
        print(done.stdout)
        assert done.returncode == 0, done.stdout + done.stderr
        row = next(line for line in done.stdout.splitlines() if line.startswith(f"{host.name} "))
        assert f"rate {TWIN} 100000 (plan >= 200000) warning" in row
        assert f"{host.name}: warning: drift: rate {TWIN} 100000 (plan >= 200000)" in done.stdout
        alert = until(
            lambda: next(
                (a for a in prometheus.alerts() if labels.items() <= a["labels"].items()), None
            ),
            INTERVAL_S,
            f"SparkFabricDrifted {labels}",
        )
        assert isinstance(alert, dict) and alert["labels"]["severity"] == "warning", alert
    finally:
        simlab.set_hardware(host, link_speeds={})
        pyinfra("inventories/sim.py", "deploy.py")
        collect(host)
    assert f"rate {TWIN}" not in status_row(keys, host)

"""The metrics endpoint on the deployed lab (issue 28): from the management network it refuses a
scrape without the box's metrics key, answers with it, and a fault made by hand (MTU 1500 on a
twin) is a drift series after one collection, with its journal line; `make status` reads every
box from the endpoints and is red on the lab (its veths link at 10000 Mb/s, below a Spark's
200000: drift the lab cannot help).

Tests in this module run in order; the last one puts the twin's MTU back.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from operations import metrics
from tests.conftest import Deployed, run_on
from tests.simlab import lab as simlab
from tests.simlab.paths import REPO, STATE

pytestmark = pytest.mark.lab

TWIN = simlab.FABRIC_TWINS[0][0]


def scrape(host: simlab.Host, key: str | None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{host.mgmt_ip}:9100/metrics")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def key_of(host: simlab.Host) -> str:
    return run_on(host, f"sudo cat {metrics.KEY_PATH}").strip()


def test_the_endpoint_asks_the_key_and_serves_the_collectors_figures(
    deployed_lab: Deployed,
) -> None:
    for host in deployed_lab.lab.hosts:
        assert scrape(host, None)[0] == 401
        assert scrape(host, "not-the-key")[0] == 401
        code, text = scrape(host, key_of(host))
        assert code == 200
        assert 'spark_lane_up{lane="coder"} 1' in text.splitlines()
        assert "node_load1 " in text  # the node exporter's own figures beside them
        assert f'spark_twin_mtu_bytes{{hca="{simlab.FABRIC_TWINS[0][1]}",twin="{TWIN}"}} 9000' in (
            text.splitlines()
        )


def test_make_status_reads_every_box_without_ssh(deployed_lab: Deployed, tmp_path: Path) -> None:
    for host in deployed_lab.lab.hosts:
        (tmp_path / f"{host.name}.key").write_text(key_of(host))
        # A test before this one may have restarted a lane after the collector's last run (every
        # 30 s): once every lane of the box is active again, one collection now.
        lanes = "spark-lane-coder spark-lane-fast"
        run_on(host, f"timeout 300 sh -c 'until systemctl is-active -q {lanes}; do sleep 2; done'")
        run_on(host, f"sudo systemctl start {metrics.SERVICE}")
    done = subprocess.run(
        [str(Path(REPO) / ".venv/bin/python"), "-m", "stages.status",
         "--inventory", "inventories/sim.py", "--keys-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, SIMLAB_STATE=str(STATE)),
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert lines[0].split()[:2] == ["box", "lanes"]
    for host in deployed_lab.lab.hosts:
        row = next(line for line in lines if line.startswith(f"{host.name} "))
        assert "coder up, fast up" in row
        assert f"rate {TWIN} 10000 (plan >= 200000)" in row


def test_mtu_1500_set_by_hand_is_drift_after_one_collection(deployed_lab: Deployed) -> None:
    host = deployed_lab.lab.hosts[0]
    try:
        run_on(host, f"sudo ip link set {TWIN} mtu 1500")
        run_on(host, f"sudo systemctl start {metrics.SERVICE}")  # one collection
        code, text = scrape(host, key_of(host))
        assert code == 200
        assert (
            f'spark_drift{{expected="9000",found="1500",kind="mtu",subject="{TWIN}"}} 1'
            in text.splitlines()
        )
        journal = run_on(host, f"sudo journalctl -u {metrics.SERVICE} -n 20 --no-pager")
        assert (
            f"drift: mtu {TWIN}: 1500, the plan says 9000; nmcli connection up fabric-{TWIN}"
            in journal
        )
    finally:
        # What the drift line says to run; the next module finds the lab as deployed.
        run_on(host, f"sudo nmcli connection up fabric-{TWIN}")
    assert run_on(host, f"cat /sys/class/net/{TWIN}/mtu").strip() == "9000"
    run_on(host, f"sudo systemctl start {metrics.SERVICE}")
    assert f'kind="mtu",subject="{TWIN}"' not in scrape(host, key_of(host))[1]

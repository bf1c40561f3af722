"""Independent boxes in one inventory (fabric_topology "independent"): two boxes with no cable
between them, deployed in one run as two servers of their own. Each converges with no fabric
stage and no cluster (no "no cable" stop, no Ray, no NCCL variable), its own lane answers
through its own front, and a second run changes nothing.

It boots a bare pair and pulls its cable (conftest.cabled, simlab.unplug: both boxes come
back without port 1's twins and RDMA devices, as uncabled Sparks show no ConnectX functions),
and leaves them up.

Times on the 2-core machine beside another lab's tests: the deploy from bare 18 s, the deploy
that changes nothing 3 s, the module 51 s (the session's boot, this module's and the unplug's
reboots included).
"""

from __future__ import annotations

import re
import runpy
import time
from pathlib import Path

import pytest

from tests.conftest import cabled, pyinfra, run_on
from tests.e2e.runs import output_of
from tests.e2e.test_host_layer import changes
from tests.e2e.test_lanes import key_of, request
from tests.simlab import lab as simlab
from tests.simlab.paths import REPO

pytestmark = [pytest.mark.lab, pytest.mark.recabled]

INVENTORY = "tests/e2e/independent_inventory.py"
# What the inventory gives each box: group_data's first lane to spark-1, its second to spark-2.
LANES = runpy.run_path(str(Path(REPO) / "group_data" / "all.py"))["lanes"]


@pytest.fixture(scope="module")
def uncabled(lab: simlab.Lab) -> simlab.Lab:
    pair = cabled(lab, "pair")
    simlab.unplug("spark-1", 1)  # the pair's one cable: both its ends reboot without it
    for host in pair.hosts:
        assert run_on(host, "ls /sys/class/net").split().count("enp1s0f1np1") == 0
    return pair


@pytest.fixture(scope="module")
def deployed(uncabled: simlab.Lab) -> str:
    start = time.monotonic()
    result = pyinfra(INVENTORY, "deploy.py")
    print(f"independent: the deploy from bare took {time.monotonic() - start:.0f} s")
    return output_of(result)


def test_each_box_converges_alone_with_no_fabric_and_no_cluster(
    uncabled: simlab.Lab, deployed: str
) -> None:
    assert "no cable" not in deployed
    assert "Fabric ports" not in deployed
    # The cluster stage of a box without a cluster only removes what a cluster left (none here).
    cluster_ops = re.findall(r"^--> Starting operation: (Cluster \| .*?)\s*$", deployed, re.M)
    assert cluster_ops == [
        "Cluster | No spark-ray.service: this box serves alone",
        "Cluster | No spark-firewall.service: this box serves alone",
    ], cluster_ops
    for host in uncabled.hosts:
        environment = run_on(host, "sudo cat /etc/spark/cluster.env")
        assert 'RAY_memory_monitor_refresh_ms="0"' in environment
        assert "NCCL_IB_HCA" not in environment and "MASTER_ADDR" not in environment
        assert "spark-ray" not in run_on(host, "sudo docker ps -a --format '{{.Names}}'")


def test_each_lane_answers_through_its_own_boxs_front(uncabled: simlab.Lab, deployed: str) -> None:
    for host, lane in zip(uncabled.hosts, LANES, strict=True):
        base = f"http://{host.mgmt_ip}:{lane['port']}/v1"
        key = key_of(host, lane)
        status, listing = request(f"{base}/models", key)
        assert status == 200, (host.name, listing)
        assert [model["id"] for model in listing["data"]] == [lane["served_name"]]
        assert request(f"{base}/models")[0] == 401
        chat = {"model": lane["served_name"], "messages": [{"role": "user", "content": "hi"}]}
        assert request(f"{base}/chat/completions", key, chat)[0] == 200
    # Lanes per box: the other box's lane is not on this one.
    first, second = uncabled.hosts
    assert "spark-lane-fast" not in run_on(first, "systemctl list-units --all 'spark-lane-*'")
    assert "spark-lane-coder" not in run_on(second, "systemctl list-units --all 'spark-lane-*'")


def test_a_second_run_changes_nothing(deployed: str) -> None:
    start = time.monotonic()
    again = pyinfra(INVENTORY, "deploy.py")
    print(f"independent: the deploy that changes nothing took {time.monotonic() - start:.0f} s")
    assert changes(again) == 0, output_of(again)

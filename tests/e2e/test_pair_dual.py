"""Two boxes on two cables (fabric_topology "pair-dual"): the lab cables both ports, the
inventory gives no fabric addresses, and the deploy derives, configures and checks all four
twins of each box; the NCCL test runs over all four; compliance passes and a second run changes
nothing. Deployed as tests/e2e/fabric_inventory.py (no lanes): a box's lanes do not depend on
its cabling, and test_lanes serves them on the session's pair.

It boots the session's two boxes again with both ports cabled and leaves them so (conftest.cabled).
"""

from __future__ import annotations

import json
import re

import pytest

from operations import nccl
from tests.conftest import cabled, pyinfra, run_on
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab

pytestmark = [pytest.mark.lab, pytest.mark.recabled]

INVENTORY = "tests/e2e/fabric_inventory.py"
TWINS = ("enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0", "enP2p1s0f0np0")
# Derived: one /24 per twin per cable, port 1's cable first (spark/topology.py).
SUBNETS = dict(
    zip(TWINS, ("192.168.100", "192.168.101", "192.168.102", "192.168.103"), strict=True)
)


@pytest.fixture(scope="module")
def dual(lab: simlab.Lab) -> tuple[simlab.Lab, str]:
    dual_lab = cabled(lab, "pair-dual")
    result = pyinfra(INVENTORY, "deploy.py")
    return dual_lab, result.stdout + result.stderr


def test_every_twin_of_both_cables_is_configured_from_derived_addresses(dual) -> None:
    lab, _output = dual
    for host in lab.hosts:
        for twin in TWINS:
            address = f"{SUBNETS[twin]}.{9 + host.index}/24"
            shown = run_on(host, f"ip -4 -br address show {twin}; cat /sys/class/net/{twin}/mtu")
            assert address in shown and shown.strip().endswith("9000"), (host.name, twin, shown)


def test_nccl_names_all_four_devices_merged(dual) -> None:
    lab, _output = dual
    for host in lab.hosts:
        env = run_on(host, "cat /etc/spark/cluster.env")
        hcas = "rocep1s0f1,roceP2p1s0f1,rocep1s0f0,roceP2p1s0f0"
        assert re.search(rf'^NCCL_IB_HCA="{hcas}"$', env, re.M), env
        assert re.search(r'^NCCL_IB_MERGE_NICS="1"$', env, re.M), env
        assert "# all four twins reach the one peer" in env


def test_the_nccl_test_ran_over_all_four_twins(dual) -> None:
    lab, output = dual
    assert "NCCL test: NET/IB on every twin" in output
    hcas = ["rocep1s0f1", "roceP2p1s0f1", "rocep1s0f0", "roceP2p1s0f0"]
    for host in lab.hosts:
        kept = json.loads(run_on(host, f"sudo cat {nccl.VERDICT}"))
        assert kept["passed"], kept["problems"]
        for rank, me in enumerate(kept["ranks"]):  # every rank's log, on every box
            assert (me["rank"], me["network"], sorted(me["ib_devices"])) == (
                rank, "IB", sorted(hcas)
            )  # fmt: skip
            assert me["channels"] == {f"NET/IB/{index}": 2 for index in range(4)}  # send, receive
        assert len(kept["ranks"]) == len(lab.hosts)


def test_the_link_rate_check_ran_and_every_twin_read_a_sparks_rate(dual) -> None:
    _lab, output = dual
    assert "Fabric twins link at 200000 Mb/s" in output  # the check, on all four twins
    assert "below the 200000 expected" not in output


def test_compliance_passes_and_a_second_deploy_changes_nothing(dual) -> None:
    code, table, output = compliance(inventory=INVENTORY)
    assert code == 0 and not not_passing(table), output
    assert any("enp1s0f0np0" in check for check in table), table  # port 0's twins checked too
    assert changes(pyinfra(INVENTORY, "deploy.py")) == 0

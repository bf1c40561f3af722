"""The firewall: its fact, its ruleset, loaded once, never closing a port that must stay open.

Captures (FirewallState's command, run with sudo on the simulated lab):
- lab-head-deployed-firewall.txt: spark-1 after a deploy (table loaded, unit enabled and active).
- lab-worker-deployed-firewall.txt: spark-2 after the same deploy.
- lab-worker-flushed-firewall.txt: spark-2 after `nft flush chain inet spark input`: the table's
  comment (its digest) as deployed, its rules gone.
- lab-bare-firewall.txt: spark-2 freshly reimaged (no nft installed, no unit).
Written out (the files a deploy of ARGS leaves on a box, its ruleset's digest the lab's):
- deployed-firewall.nft.sample.txt, deployed-spark-firewall.service.sample.txt.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from operations import firewall
from spark.ports import BACKEND_PORTS, listen_ports
from tests.unit.harness import (
    FakeHost,
    captured,
    file_facts,
    needs_tools,
    process,
    refusal,
    run_op,
)

FABRIC = {"enp1s0f1np1": "192.168.100.0/24", "enP2p1s0f1np1": "192.168.101.0/24"}
RULES = "/etc/spark/firewall.nft"
UNIT = f"/etc/systemd/system/{firewall.UNIT}"
ARGS = {"fabric": FABRIC, "ports": listen_ports(6379), "open_ports": [22, 10101, 10102]}
LAB_DIGEST = "73093b6d0388057d84c30b82dac2d55b27e7b04f6e6e83de8b51e8ccfcc989ab"


def firewall_host(fact: str, files: dict[str, str | None] | None = None) -> FakeHost:
    return FakeHost(file_facts(files or {RULES: None, UNIT: None}) | {firewall.FirewallState: fact})


def deployed_files() -> dict[str, str]:
    return {
        RULES: captured("deployed-firewall.nft.sample.txt"),
        UNIT: captured("deployed-spark-firewall.service.sample.txt"),
    }


def test_fact_reads_a_deployed_and_a_bare_box() -> None:
    assert process(firewall.FirewallState, captured("lab-head-deployed-firewall.txt")) == {
        "nft": True,
        "ephemeral": (32768, 60999),
        "loaded": LAB_DIGEST,
        "rules": "as-file",
        "enabled": "enabled",
        "active": "active",
    }
    assert process(firewall.FirewallState, captured("lab-bare-firewall.txt")) == {
        "nft": False,
        "ephemeral": (32768, 60999),
        "loaded": None,
        "rules": "none",
        "enabled": None,
        "active": "inactive",
    }


def test_a_flushed_chain_is_seen_by_its_rules_and_reloaded() -> None:
    flushed = process(firewall.FirewallState, captured("lab-worker-flushed-firewall.txt"))
    assert (flushed["loaded"], flushed["rules"]) == (LAB_DIGEST, "differ")  # the comment lies
    host = firewall_host(captured("lab-worker-flushed-firewall.txt"), deployed_files())
    assert run_op(firewall.cluster_ports_fabric_only, **ARGS, host=host) == [f"nft -f {RULES}"]
    worker = firewall_host(captured("lab-worker-deployed-firewall.txt"), deployed_files())
    assert run_op(firewall.cluster_ports_fabric_only, **ARGS, host=worker) == []


def test_the_lab_loaded_what_the_deploy_renders_today() -> None:
    # The digest the lab's table carries is the one of this ruleset: nothing to reload there.
    ranges = firewall.merged([*ARGS["ports"], *BACKEND_PORTS, (32768, 60999)])
    assert f'comment "spark:{LAB_DIGEST}"' in firewall.ruleset(FABRIC, ranges)


def test_bare_box_gets_nftables_the_ruleset_and_its_unit() -> None:
    host = firewall_host(captured("lab-bare-firewall.txt"))
    commands = run_op(firewall.cluster_ports_fabric_only, **ARGS, host=host)
    assert commands[0] == (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600"
        " install -y -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
        " nftables"
    )
    assert commands[-3:] == [
        "systemctl daemon-reload",
        "systemctl enable spark-firewall.service",
        "systemctl start spark-firewall.service",
    ]
    rules = host.uploads[RULES]
    assert "elements = { 192.168.100.0/24, 192.168.101.0/24 }" in rules
    # Ray's pinned ports, the back-end's, the kernel's ephemeral range: joined where adjacent.
    ports = "6379-6385, 8265, 10001, 14579, 20000-20999, 29500-29501, 32768-60999"
    assert f"elements = {{ {ports} }}" in rules
    assert 'iifname { "enP2p1s0f1np1", "enp1s0f1np1" } ip saddr @fabric_subnets accept' in rules
    assert "\t\ttcp dport @cluster_ports reject with tcp reset\n" in rules
    assert "udp" not in rules.split("chain input")[1]  # WireGuard, Tailscale, mosh: left open
    assert f"ExecStart=/usr/sbin/nft -f {RULES}" in host.uploads[UNIT]
    assert "After=nftables.service" in host.uploads[UNIT]
    assert host.uploads == deployed_files()  # as written out for the tests of a deployed box


def test_in_place_yields_nothing() -> None:
    host = firewall_host(captured("lab-head-deployed-firewall.txt"), deployed_files())
    assert run_op(firewall.cluster_ports_fabric_only, **ARGS, host=host) == []
    assert host.noops[-1] == "inet spark admits the cluster's ports from the fabric only"


def test_a_table_changed_by_hand_is_replaced_in_one_transaction() -> None:
    fact = captured("lab-head-deployed-firewall.txt").replace(LAB_DIGEST, "0" * 64)
    host = firewall_host(fact, deployed_files())
    assert run_op(firewall.cluster_ports_fabric_only, **ARGS, host=host) == [f"nft -f {RULES}"]


def test_a_new_fabric_subnet_rewrites_and_reloads() -> None:
    host = firewall_host(captured("lab-head-deployed-firewall.txt"), deployed_files())
    fabric = FABRIC | {"enP2p1s0f1np1": "192.168.102.0/24"}
    commands = run_op(firewall.cluster_ports_fabric_only, **(ARGS | {"fabric": fabric}), host=host)
    assert commands[0].startswith("FileUploadCommand(") and commands[-1] == f"nft -f {RULES}"
    assert "192.168.102.0/24" in host.uploads[RULES]


@pytest.mark.parametrize(
    ("open_ports", "named"),
    [([2222, 40022], "40022"), ([22, 6380], "6380"), ([22, 20500, 29500], "20500, 29500")],
)
def test_an_open_port_among_the_cluster_ports_is_refused(open_ports: list[int], named: str) -> None:
    host = firewall_host(captured("lab-head-deployed-firewall.txt"))
    assert re.search(
        rf"spark-test: port\(s\) {named} must stay open",
        refusal(
            run_op(
                firewall.cluster_ports_fabric_only, **(ARGS | {"open_ports": open_ports}), host=host
            )
        ),
    )


def test_merged_joins_overlapping_and_adjacent_ranges() -> None:
    assert firewall.merged([(10, 20), (5, 9), (30, 30), (15, 25), (31, 40), (50, 50)]) == [
        (5, 25),
        (30, 40),
        (50, 50),
    ]


def test_nft_accepts_the_ruleset(tmp_path: Path) -> None:
    needs_tools("nft", "unshare")
    path = tmp_path / "firewall.nft"
    path.write_text(deployed_files()[RULES])
    # In a network namespace of its own: this machine's rules are never touched.
    result = subprocess.run(
        ["unshare", "--net", "nft", "-c", "-f", str(path)], capture_output=True, text=True
    )
    if "Operation not permitted" in result.stderr:
        pytest.skip("no permission for a network namespace here")
    assert result.returncode == 0, result.stderr


def test_a_box_serving_alone_loses_the_firewall_a_cluster_left() -> None:
    left = FakeHost(file_facts({"/etc/systemd/system/spark-firewall.service": "[Unit]\n"}))
    assert run_op(firewall.removed, host=left) == [
        "systemctl disable --now spark-firewall.service",
        "if nft list table inet spark >/dev/null 2>&1; then nft delete table inet spark; fi",
        "rm -f /etc/systemd/system/spark-firewall.service /etc/spark/firewall.nft",
        "systemctl daemon-reload",
    ]
    never = FakeHost(file_facts({"/etc/systemd/system/spark-firewall.service": None}))
    assert run_op(firewall.removed, host=never) == []
    assert never.noops == ["no spark-firewall.service on this box"]

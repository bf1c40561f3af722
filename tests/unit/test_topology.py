"""Fabric shapes (spark/topology.py, through spark/inventory/): the addresses each
box gets from its place in the inventory, the ones given checked, the NCCL settings.

Captures: public-ibstat-dell-gb10.txt, real: `ibstat` on a Dell Pro Max GB10 with port 0 cabled,
as geerlingguy/sbc-reviews issue 92 quotes it (its first three CAs; the fourth is cut there)."""

from __future__ import annotations

from typing import Any

import pytest

from spark import topology
from spark.inventory import ConfigError, load_from_dicts
from spark.topology import DIRECT_RATE
from tests.unit.harness import captured

from .test_config import merged


def boxes(count: int, **data: Any) -> dict[str, dict[str, Any]]:
    """``count`` boxes, the first the head, no addresses given: the shape derives them."""
    return merged(
        {
            f"spark-{n}": {"spark_role": "head" if n == 1 else "worker", **data}
            for n in range(1, count + 1)
        }
    )


# Each ring box's address on its management port (enP7s7), where the ring's rendezvous goes.
MANAGEMENT = {"spark-1": "10.0.0.21", "spark-2": "10.0.0.22", "spark-3": "10.0.0.23"}


def ring(**data: Any) -> dict[str, dict[str, Any]]:
    """Three boxes in a ring, no fabric addresses given, each its management address."""
    hosts = boxes(3, fabric_topology="ring3", **data)
    for name, address in MANAGEMENT.items():
        hosts[name]["management_address"] = address
    return hosts


def addresses(hosts: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    spark = load_from_dicts(hosts)
    return {h.name: {link.ifname: str(link.address) for link in h.fabric} for h in spark.hosts}


def refusal(hosts: dict[str, dict[str, Any]]) -> list[str]:
    with pytest.raises(ConfigError) as error:
        load_from_dicts(hosts)
    return error.value.problems


def test_a_pair_derives_nvidias_two_subnets_on_port_1() -> None:
    # The inventory's own example (inventories/lab.py), derived: nothing given.
    assert addresses(boxes(2)) == {
        "spark-1": {"enp1s0f1np1": "192.168.100.10/24", "enP2p1s0f1np1": "192.168.101.10/24"},
        "spark-2": {"enp1s0f1np1": "192.168.100.11/24", "enP2p1s0f1np1": "192.168.101.11/24"},
    }


def test_pair_dual_gives_the_second_cable_two_more_subnets() -> None:
    assert addresses(boxes(2, fabric_topology="pair-dual")) == {
        "spark-1": {
            "enp1s0f1np1": "192.168.100.10/24",
            "enP2p1s0f1np1": "192.168.101.10/24",
            "enp1s0f0np0": "192.168.102.10/24",
            "enP2p1s0f0np0": "192.168.103.10/24",
        },
        "spark-2": {
            "enp1s0f1np1": "192.168.100.11/24",
            "enP2p1s0f1np1": "192.168.101.11/24",
            "enp1s0f0np0": "192.168.102.11/24",
            "enP2p1s0f0np0": "192.168.103.11/24",
        },
    }


def test_ring3_cables_port_0_to_the_next_boxs_port_1_one_subnet_per_twin_per_cable() -> None:
    derived = addresses(ring())

    # Cable i: box i's port 0 to box i+1's port 1 (the last back to the first).
    assert derived == {
        "spark-1": {
            "enp1s0f1np1": "192.168.104.10/24",  # cable 2, from spark-3's port 0
            "enP2p1s0f1np1": "192.168.105.10/24",
            "enp1s0f0np0": "192.168.100.10/24",  # cable 0, to spark-2's port 1
            "enP2p1s0f0np0": "192.168.101.10/24",
        },
        "spark-2": {
            "enp1s0f1np1": "192.168.100.11/24",
            "enP2p1s0f1np1": "192.168.101.11/24",
            "enp1s0f0np0": "192.168.102.11/24",
            "enP2p1s0f0np0": "192.168.103.11/24",
        },
        "spark-3": {
            "enp1s0f1np1": "192.168.102.12/24",
            "enP2p1s0f1np1": "192.168.103.12/24",
            "enp1s0f0np0": "192.168.104.12/24",
            "enP2p1s0f0np0": "192.168.105.12/24",
        },
    }


def test_a_switch_puts_every_box_on_one_subnet_per_twin() -> None:
    derived = addresses(boxes(4, fabric_topology="switch", fabric_switch_ports=[1, 0]))

    assert derived["spark-4"] == {
        "enp1s0f1np1": "192.168.100.13/24",
        "enP2p1s0f1np1": "192.168.101.13/24",
        "enp1s0f0np0": "192.168.102.13/24",
        "enP2p1s0f0np0": "192.168.103.13/24",
    }
    assert addresses(boxes(8, fabric_topology="switch", fabric_switch_ports=[0]))["spark-8"] == {
        "enp1s0f0np0": "192.168.100.17/24",
        "enP2p1s0f0np0": "192.168.101.17/24",
    }


def test_given_ring_addresses_on_the_fields_scheme_are_accepted() -> None:
    # eugr/spark-vllm-docker docs/NETWORKING.md's four-node ring, cut to three boxes' shape:
    # any subnets do, as long as both ends of each twin of each cable share one.
    hosts = ring()
    plan = {
        "spark-1": ("10.20.0.11", "10.20.1.11", "10.20.4.11", "10.20.5.11"),
        "spark-2": ("10.20.2.12", "10.20.3.12", "10.20.0.12", "10.20.1.12"),
        "spark-3": ("10.20.4.13", "10.20.5.13", "10.20.2.13", "10.20.3.13"),
    }
    for name, (p0a, p0b, p1a, p1b) in plan.items():
        hosts[name]["fabric_addresses"] = {
            "enp1s0f0np0": f"{p0a}/24",
            "enP2p1s0f0np0": f"{p0b}/24",
            "enp1s0f1np1": f"{p1a}/24",
            "enP2p1s0f1np1": f"{p1b}/24",
        }

    assert addresses(hosts)["spark-2"]["enp1s0f1np1"] == "10.20.0.12/24"


def test_a_ring_cabled_the_other_way_round_is_refused_naming_the_cable() -> None:
    hosts = ring()
    # spark-2's port 1 addressed as if its port 0 met spark-1: both ends disagree.
    hosts["spark-2"]["fabric_addresses"] = {
        "enp1s0f1np1": "192.168.102.11/24",
        "enP2p1s0f1np1": "192.168.103.11/24",
        "enp1s0f0np0": "192.168.100.11/24",
        "enP2p1s0f0np0": "192.168.101.11/24",
    }

    problems = refusal(hosts)

    assert any(
        "spark-1, spark-2: fabric_addresses: twins joined by one cable are on different subnets"
        " (spark-1 enp1s0f0np0 192.168.100.0/24, spark-2 enp1s0f1np1 192.168.102.0/24)" in p
        for p in problems
    ), problems


@pytest.mark.parametrize(
    ("shape", "count", "expect"),
    [
        ("ring3", 4, "spark-1, spark-2, spark-3, spark-4: fabric_topology: ring3 joins 3 boxes,"),
        ("pair", 3, "spark-1, spark-2, spark-3: fabric_topology: pair joins 2 boxes,"),
        ("pair-dual", 3, "fabric_topology: pair-dual joins 2 boxes, the inventory has 3"),
        ("switch", 9, "fabric_topology: switch joins 2 to 8 boxes, the inventory has 9"),
    ],
)
def test_a_box_count_the_shape_cannot_take_is_refused(shape: str, count: int, expect: str) -> None:
    (problem,) = refusal(boxes(count, fabric_topology=shape))
    assert expect in problem, problem


def test_one_host_in_another_topology_is_refused_naming_it() -> None:
    hosts = ring()
    hosts["spark-3"]["fabric_topology"] = "switch"

    (problem,) = refusal(hosts)

    assert problem.startswith("spark-3: fabric_topology: the hosts differ (spark-1: ring3 [1]")


def test_a_pair_given_port_0_twins_is_told_which_ports_it_uses() -> None:
    hosts = boxes(2)
    hosts["spark-2"]["fabric_addresses"] = {
        "enp1s0f0np0": "192.168.100.11/24",
        "enP2p1s0f0np0": "192.168.101.11/24",
    }

    problems = refusal(hosts)

    assert (
        "spark-2: fabric_addresses: pair uses enp1s0f1np1, enP2p1s0f1np1 on this box (ports 1);"
        " add enp1s0f1np1, enP2p1s0f1np1; remove enp1s0f0np0, enP2p1s0f0np0"
    ) in problems[0]


def test_two_cables_sharing_a_subnet_are_refused_on_the_box_they_meet() -> None:
    hosts = boxes(2, fabric_topology="pair-dual")
    for n, host in enumerate(hosts.values()):
        host["fabric_addresses"] = {
            "enp1s0f1np1": f"192.168.100.{10 + n}/24",
            "enP2p1s0f1np1": f"192.168.101.{10 + n}/24",
            "enp1s0f0np0": f"192.168.100.{20 + n}/24",  # port 0's cable on port 1's subnet
            "enP2p1s0f0np0": f"192.168.103.{10 + n}/24",
        }

    problems = refusal(hosts)

    assert problems[0].startswith(
        "spark-1: fabric_addresses: enp1s0f1np1 (192.168.100.0/24) and enp1s0f0np0"
        " (192.168.100.0/24) share a subnet"
    ), problems


@pytest.mark.parametrize(
    ("speed", "shape", "refused"),
    [
        (200000, "pair", False),
        (100000, "switch", False),
        (100000, "pair", True),
        (400000, "switch", True),
    ],
)
def test_link_speed_200g_or_100g_behind_a_switch(speed: int, shape: str, refused: bool) -> None:
    hosts = boxes(2, fabric_topology=shape, fabric_link_speed_mbps=speed)
    if refused:
        assert refusal(hosts)[0].startswith(f"spark-1: fabric_link_speed_mbps: {speed} Mb/s")
    else:
        assert load_from_dicts(hosts).head.link_speed_mbps == speed


def test_a_direct_twins_rate_is_what_a_real_gb10s_active_ports_report() -> None:
    ports = [
        dict(line.strip().split(": ", 1) for line in block.splitlines()[1:] if ": " in line)
        for block in captured("public-ibstat-dell-gb10.txt").split("CA '")[1:]
    ]
    rates = {(port["State"], int(port["Rate"])) for port in ports}  # ibstat's Rate: Gb/s
    # Every active twin at the rate a direct cable expects; a twin without link reports 40,
    # no rate of a link (the deploy reads the netdev's rate, which has none then).
    assert rates == {("Active", DIRECT_RATE[0] // 1000), ("Down", 40)}


def nccl(shape: str, count: int, **data: Any) -> dict[str, str]:
    hosts = ring(**data) if shape == "ring3" else boxes(count, fabric_topology=shape, **data)
    spark = load_from_dicts(hosts)
    environment = spark.host("spark-2").cluster_environment(spark.head)
    return {k: v for k, v in environment.items() if k.startswith(("NCCL_", "GLOO", "UCX"))}


def test_nccl_per_topology_names_every_twin_used() -> None:
    assert nccl("pair", 2) | {} == {
        "NCCL_IB_ADDR_FAMILY": "AF_INET",
        "NCCL_IB_ROCE_VERSION_NUM": "2",
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
        "NCCL_IB_MERGE_NICS": "1",
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "UCX_NET_DEVICES": "rocep1s0f1:1,roceP2p1s0f1:1,enp1s0f1np1",
    }
    dual = nccl("pair-dual", 2)
    assert dual["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1,rocep1s0f0,roceP2p1s0f0"
    assert dual["NCCL_IB_MERGE_NICS"] == "1"

    ring = nccl("ring3", 3)
    assert ring["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1,rocep1s0f0,roceP2p1s0f0"
    assert (ring["NCCL_IB_MERGE_NICS"], ring["NCCL_NET_PLUGIN"]) == ("0", "none")
    assert ring["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"
    # No fabric subnet reaches every box of a ring: sockets over management.
    assert ring["NCCL_SOCKET_IFNAME"] == ring["GLOO_SOCKET_IFNAME"] == "enP7s7"

    switch = nccl("switch", 4, fabric_switch_ports=[1, 0])
    assert switch["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1,rocep1s0f0,roceP2p1s0f0"
    assert switch["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"
    assert "NCCL_IB_MERGE_NICS" not in switch and "NCCL_NET_PLUGIN" not in switch


def test_every_fabric_setting_carries_its_source() -> None:
    spark = load_from_dicts(ring())
    worker = spark.host("spark-3")
    notes = worker.environment_notes()
    nccl_keys = {k for k in worker.cluster_environment(spark.head) if k.startswith("NCCL_IB")}

    assert nccl_keys | {"NCCL_NET_PLUGIN", "NCCL_SOCKET_IFNAME"} <= set(notes)
    assert "spark_cluster_setup.py" in notes["NCCL_IB_SUBNET_AWARE_ROUTING"]
    assert "PR#35" in load_from_dicts(boxes(2)).head.environment_notes()["NCCL_IB_MERGE_NICS"]


def test_a_cluster_lane_over_a_ring_is_refused_before_contact() -> None:
    hosts = ring()
    hosts["spark-1"]["lanes"] = [
        {
            "name": "big",
            "image": "nvcr.io/nvidia/vllm:26.04-py3",
            "model": "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
            "served_name": "qwen3-235b-a22b",
            "port": 10103,
            "memory_fraction": 0.5,
            "max_model_len": 40960,
            "tensor_parallel_size": 3,
        }
    ]
    for worker in ("spark-2", "spark-3"):
        hosts[worker]["lanes"] = []

    problems = refusal(hosts)

    assert any(
        p.startswith("spark-1: lanes: big: tensor_parallel_size: 3 makes a cluster lane, and this")
        and "ring3" in p
        for p in problems
    ), problems


def test_a_rings_rendezvous_is_the_heads_management_address_vllm_each_boxs_own() -> None:
    spark = load_from_dicts(ring())
    for name in MANAGEMENT:
        environment = spark.host(name).cluster_environment(spark.head)
        assert environment["MASTER_ADDR"] == "10.0.0.21", name
        assert environment["VLLM_HOST_IP"] == MANAGEMENT[name], name
    notes = spark.host("spark-2").environment_notes()
    assert "spark_cluster_setup.py" in notes["MASTER_ADDR"]


def test_off_a_ring_the_management_address_changes_nothing() -> None:
    hosts = boxes(2)
    plain = load_from_dicts(hosts)
    for name, address in (("spark-1", "10.0.0.21"), ("spark-2", "10.0.0.22")):
        hosts[name]["management_address"] = address
    given = load_from_dicts(hosts)

    for name in ("spark-1", "spark-2"):
        environment = given.host(name).cluster_environment(given.head)
        assert environment == plain.host(name).cluster_environment(plain.head)
    assert environment["MASTER_ADDR"] == "192.168.100.10"  # the head's first twin
    assert "MASTER_ADDR" not in given.head.environment_notes()


def test_a_ring_box_without_a_management_address_is_refused_naming_it() -> None:
    hosts = ring()
    del hosts["spark-3"]["management_address"]

    (problem,) = refusal(hosts)

    assert problem.startswith("spark-3: management_address: missing; a ring's rendezvous"), problem
    assert "`ip -4 -br address show enP7s7`" in problem


def test_a_management_address_that_is_no_ipv4_address_is_refused() -> None:
    hosts = ring()
    hosts["spark-2"]["management_address"] = "10.0.0.22/24"

    problems = refusal(hosts)

    assert any("'10.0.0.22/24' is not an IPv4 address A.B.C.D" in p for p in problems), problems


@pytest.mark.parametrize("ports", [[-1], [2], [1, 1]])
def test_switch_ports_other_than_a_sparks_two_are_refused_naming_host_and_field(ports) -> None:
    problems = refusal(boxes(4, fabric_topology="switch", fabric_switch_ports=ports))
    assert problems and all(
        "fabric_switch_ports" in line and "use [1], [0] or [1, 0]" in line for line in problems
    ), problems
    assert any(line.startswith("spark-1: ") for line in problems), problems


# Independent boxes: not a cluster, each its own server.


def independent(count: int, **data: Any) -> dict[str, dict[str, Any]]:
    """``count`` boxes in one inventory, none of them a cluster member, no role given."""
    return merged(
        {f"gx10-{n}": {"fabric_topology": "independent", **data} for n in range(1, count + 1)}
    )


def test_independent_boxes_take_no_twin_and_are_each_their_own_head() -> None:
    assert topology.ports("independent") == ()
    assert topology.derived("independent", 1, 3) == {}

    spark = load_from_dicts(independent(3))

    assert spark.independent
    assert [(host.name, host.role, host.fabric) for host in spark.hosts] == [
        ("gx10-1", "head", ()),
        ("gx10-2", "head", ()),
        ("gx10-3", "head", ()),
    ]
    assert spark.cluster_lane is None
    assert not load_from_dicts(boxes(2)).independent


def test_an_independent_box_with_a_worker_role_or_fabric_addresses_is_refused() -> None:
    hosts = independent(3)
    hosts["gx10-2"]["spark_role"] = "worker"
    hosts["gx10-3"]["fabric_addresses"] = {"enp1s0f1np1": "192.168.100.12/24"}

    assert refusal(hosts) == [
        "gx10-2: spark_role: 'worker', but fabric_topology 'independent' makes every box its"
        " own server (its own head); remove spark_role",
        "gx10-3: fabric_addresses: given, but fabric_topology 'independent' makes every box its"
        " own server, using no fabric; remove them, or set the fabric_topology the boxes are"
        " cabled as",
    ]


def test_a_cluster_lane_on_an_independent_box_is_refused() -> None:
    hosts = independent(3)
    lane = hosts["gx10-1"]["lanes"][0] | {"tensor_parallel_size": 2}
    hosts["gx10-1"]["lanes"] = [lane]

    assert refusal(hosts) == [
        f"gx10-1: lanes: {lane['name']}: tensor_parallel_size: 2 makes a cluster lane, but"
        " fabric_topology 'independent' makes every box its own server; set 1, or set the"
        " fabric_topology the boxes are cabled as (a head and its workers)"
    ]


def test_independent_and_cabled_boxes_in_one_inventory_are_refused() -> None:
    hosts = independent(3)
    hosts["gx10-1"] |= {"spark_role": "head"}
    hosts["gx10-3"] |= {"fabric_topology": "pair", "spark_role": "worker"}

    assert refusal(hosts) == [
        "gx10-3: fabric_topology: the hosts differ (gx10-1: independent [1], gx10-2:"
        " independent [1], gx10-3: pair [1]); set one fabric_topology (and fabric_switch_ports)"
        " in group_data for every host"
    ]


def test_independent_boxes_need_not_agree_where_a_clusters_must() -> None:
    """A cluster's boxes share one MTU (the head's is the reference); servers of their own do
    not: nothing of one reaches the other."""
    hosts = independent(2)
    hosts["gx10-2"] |= {"fabric_mtu": 9100, "nccl_test": False}

    spark = load_from_dicts(hosts)

    assert [host.mtu for host in spark.hosts] == [9000, 9100]

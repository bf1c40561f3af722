"""Properties of spark/inventory/ over generated inventories (hypothesis)."""

from __future__ import annotations

from ipaddress import IPv4Interface, IPv4Network
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark.inventory import ConfigError, HostSettings, load_from_dicts
from spark.topology import PORT_TWINS

from .test_config import group_defaults

# No example database: nothing is written into the repository. No deadline: an example's time
# on a loaded 2-core CI machine says nothing about the property (one went past hypothesis' 200 ms).
SETTINGS = settings(
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow],
)
DEFAULTS = group_defaults()
IFNAMES = ["enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0", "enP2p1s0f0np0"]


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    """A valid switched inventory of 2..8 hosts: the twins of the switch's ports on every
    host, one subnet per twin."""
    size = draw(st.integers(2, 8))
    ports = draw(st.sampled_from([[1], [0], [1, 0]]))
    twins = [ifname for port in ports for ifname in PORT_TWINS[port]]
    prefix = draw(st.integers(16, 28))  # room for 8 hosts besides network and broadcast
    octets = draw(
        st.lists(st.integers(0, 255), min_size=len(twins), max_size=len(twins), unique=True)
    )
    offsets = {
        twin: draw(
            st.lists(
                st.integers(1, 2 ** (32 - prefix) - 2), min_size=size, max_size=size, unique=True
            )
        )
        for twin in twins
    }
    head = draw(st.integers(0, size - 1))
    mtu = draw(st.integers(9000, 9216))  # below 9000 needs fabric_mtu_below_9000_because
    gid_index = draw(st.integers(0, 255))  # like the MTU, one for every box of a cluster
    hcas = {ifname: f"roce{index}" for index, ifname in enumerate(IFNAMES)}
    hosts = {}
    for index in range(size):
        addresses = {}
        for twin, octet in zip(twins, octets, strict=True):
            network = IPv4Network(f"10.{octet}.0.0/{prefix}")
            addresses[twin] = f"{network.network_address + offsets[twin][index]}/{prefix}"
        hosts[f"spark-{index + 1}"] = DEFAULTS | {
            "spark_role": "head" if index == head else "worker",
            "fabric_topology": "switch",
            "fabric_switch_ports": ports,
            "fabric_addresses": addresses,
            "fabric_hcas": hcas,
            "fabric_mtu": mtu,
            "roce_gid_index": gid_index,
            "nccl_debug": draw(st.booleans()),
        }
    return hosts


@SETTINGS
@given(clusters())
def test_any_valid_cluster_is_accepted(hosts: dict[str, dict[str, Any]]) -> None:
    spark = load_from_dicts(hosts)

    (head_name,) = [name for name, data in hosts.items() if data["spark_role"] == "head"]
    assert spark.head.name == head_name
    head_ip = str(IPv4Interface(next(iter(hosts[head_name]["fabric_addresses"].values()))).ip)
    for host in spark.hosts:
        environment = host.cluster_environment(spark.head)
        first = next(iter(hosts[host.name]["fabric_addresses"].values()))
        assert environment["VLLM_HOST_IP"] == str(IPv4Interface(first).ip)
        assert environment["MASTER_ADDR"] == head_ip
        assert environment["NCCL_IB_HCA"].count(",") == len(host.fabric) - 1
        assert ("NCCL_DEBUG" in environment) == hosts[host.name]["nccl_debug"]


@SETTINGS
@given(clusters(), st.data())
def test_a_duplicate_address_is_refused_naming_both_hosts(
    hosts: dict[str, dict[str, Any]], data: st.DataObject
) -> None:
    names = list(hosts)
    owner, thief = data.draw(st.lists(st.sampled_from(names), min_size=2, max_size=2, unique=True))
    twin = data.draw(st.sampled_from(list(hosts[owner]["fabric_addresses"])))
    address = hosts[owner]["fabric_addresses"][twin]
    hosts[thief] = hosts[thief] | {
        "fabric_addresses": hosts[thief]["fabric_addresses"] | {twin: address}
    }

    try:
        load_from_dicts(hosts)
    except ConfigError as error:
        ip = address.split("/")[0]
        lines = [line for line in error.problems if f" {ip} is used by" in line]
        assert len(lines) == 1, error.problems
        assert f"{owner} ({twin})" in lines[0] and f"{thief} ({twin})" in lines[0]
    else:
        raise AssertionError(f"{thief} took {owner}'s {address} and was accepted")


@SETTINGS
@given(st.sampled_from(list(HostSettings.model_fields)), st.data())
def test_a_key_missing_one_letter_gets_a_suggestion(key: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(key) - 1))
    typo = key[:cut] + key[cut + 1 :]
    hosts = {"spark-1": DEFAULTS | {typo: 1}}

    try:
        load_from_dicts(hosts)
    except ConfigError as error:
        (problem,) = error.problems
        assert problem.startswith(f"spark-1: {typo}: unknown key; did you mean {key}?")
    else:
        raise AssertionError(f"{typo!r} was accepted")


# Printable text: a name with a line break in it is no host or key anyone writes.
printable = st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"))
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(printable, max_size=30)
    | st.sampled_from(["192.168.100.10/24", "10.0.0.1/32", "head", "worker", "580", "1.19.0-1"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(printable, max_size=16), inner, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(list(HostSettings.model_fields)) | st.text(
    printable, min_size=1, max_size=20
)


@SETTINGS
@given(
    st.dictionaries(
        st.text(printable, min_size=1, max_size=10),
        st.dictionaries(keys, values, max_size=6),
        max_size=4,
    )
)
def test_any_data_is_either_accepted_or_refused_line_by_line(
    overrides: dict[str, dict[str, Any]],
) -> None:
    """Whatever a user writes, the answer is a config or a ConfigError, never a crash."""
    try:
        load_from_dicts({name: DEFAULTS | data for name, data in overrides.items()})
    except ConfigError as error:
        assert error.problems
        assert all("\n" not in line for line in error.problems)
        assert all(": " in line and "; " in line for line in error.problems), error.problems

"""The lab's cabling, without booting: which twins each host has a cable in, and how the switch
is wired on port 1, port 0 or both (one L2 segment per twin of each cabled port, as the planner
gives each its own /24: spark/topology.py links and subnet)."""

from __future__ import annotations

import pytest

from tests.simlab import __main__ as cli
from tests.simlab import lab as simlab

# A Spark's twins and RDMA devices by port (docs/reference.md, "A cluster, step by step"; port 0's
# in CONTRIBUTING.md's lab table).
PORT1 = [("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")]
PORT0 = [("enp1s0f0np0", "rocep1s0f0"), ("enP2p1s0f0np0", "roceP2p1s0f0")]


def switch(count: int, ports: tuple[int, ...]) -> simlab.Lab:
    hosts = [simlab.Host(f"spark-{i}", i) for i in range(1, count + 1)]
    return simlab.Lab(hosts, "switch", ports)


@pytest.mark.parametrize(
    ("ports", "twins"), [((1,), PORT1), ((0,), PORT0), ((1, 0), PORT1 + PORT0)]
)
def test_a_switch_cables_the_ports_it_is_given(ports, twins) -> None:
    lab = switch(4, ports)
    assert lab.ports == ports
    assert all(lab.twins(host) == twins for host in lab.hosts)


def test_a_host_with_a_port_unplugged_keeps_the_other_ports_twins() -> None:
    lab = switch(2, (1, 0))
    lab.hosts[0].unplugged.append(1)
    assert lab.twins(lab.hosts[0]) == PORT0
    assert lab.twins(lab.hosts[1]) == PORT1 + PORT0


def test_the_other_cablings_keep_their_own_ports() -> None:
    assert simlab.Lab([], "pair", (0,)).ports == (1,)  # switch ports mean nothing there
    assert simlab.Lab([], "pair-dual").ports == (1, 0)


def test_the_switch_has_one_bridge_per_twin_of_each_cabled_port() -> None:
    assert simlab.switch_segments(switch(2, (1, 0))) == [
        ("fabric10", "enp1s0f1np1"),
        ("fabric11", "enP2p1s0f1np1"),
        ("fabric00", "enp1s0f0np0"),
        ("fabric01", "enP2p1s0f0np0"),
    ]
    assert simlab.switch_segments(switch(2, (0,))) == [
        ("fabric00", "enp1s0f0np0"),
        ("fabric01", "enP2p1s0f0np0"),
    ]


def test_wiring_a_switch_puts_each_hosts_twin_on_its_segments_bridge(monkeypatch) -> None:
    commands: list[tuple[str, ...]] = []
    monkeypatch.setattr(simlab, "run", lambda *args, **_: commands.append(args))
    simlab.wire_fabric(switch(2, (1, 0)))
    ns = simlab.SWITCH_NS
    # The switch's end of each veth, made a port of its segment's bridge.
    enslaved = {
        cmd[7]: cmd[-2] for cmd in commands if cmd[:4] == ("ip", "netns", "exec", ns)
        and "master" in cmd
    }  # fmt: skip
    # Each host's end of a twin's veth is renamed to the twin, inside the host's namespace.
    renamed = [(cmd[3], cmd[-1]) for cmd in commands if cmd[4:8] == ("ip", "link", "set", "sltmp")]
    assert enslaved == {
        "fabric10h1": "fabric10", "fabric10h2": "fabric10",
        "fabric11h1": "fabric11", "fabric11h2": "fabric11",
        "fabric00h1": "fabric00", "fabric00h2": "fabric00",
        "fabric01h1": "fabric01", "fabric01h2": "fabric01",
    }  # fmt: skip
    twins = ["enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0", "enP2p1s0f0np0"]
    assert sorted(renamed) == sorted(
        (f"{simlab.PREFIX}-spark-{i}", twin) for i in (1, 2) for twin in twins
    )


@pytest.mark.parametrize(
    ("cabling", "ports"), [("pair", (0,)), ("switch", (0, 1)), ("switch", (2,))]
)
def test_switch_ports_other_than_a_switchs_1_0_or_both_are_refused_before_anything(
    cabling, ports, monkeypatch
) -> None:
    monkeypatch.setattr(simlab, "ensure_host_tools", lambda: pytest.fail("went on"))
    with pytest.raises(SystemExit, match=r"only a switch takes ports, \[1\] or \[0\] or \[1, 0\]"):
        simlab.up(2, cabling=cabling, switch_ports=ports)


def test_the_command_line_takes_the_ports_as_the_inventory_names_them() -> None:
    assert cli.switch_ports("1,0") == (1, 0)
    assert cli.switch_ports("0") == (0,)
    assert cli.switch_ports(None) is None
    with pytest.raises(SystemExit):  # argparse refuses a port a Spark does not have
        cli.main(["up", "--switch-ports", "2"])

"""The fabric peer check: each twin reaches the same twin of the other boxes with jumbo frames.

Captures:
- lab-fabric-peers-answer.txt: FabricPeers' command on lab host spark-1 after a deploy (both
  twins answer 8972-byte unfragmented pings).
- lab-fabric-peers-cut.txt: the same on spark-1 with spark-2's enP2p1s0f1np1 cut (every frame
  arriving on it dropped).
The check command that runs when a peer is silent is run below in a real shell, against
stand-ins for ping, cat (the carrier file) and sleep.
"""

from __future__ import annotations

import os
import subprocess
from ipaddress import IPv4Interface
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_state

from operations import preflight
from tests.unit.harness import FakeHost, captured, process, run_op

A, B = "enp1s0f1np1", "enP2p1s0f1np1"
PEERS = [(A, "spark-2", "192.168.100.11"), (B, "spark-2", "192.168.101.11")]
PAIRS = ((A, "192.168.100.11"), (B, "192.168.101.11"))


def check(outputs: str | None, failed: tuple[str, ...] = ()) -> tuple[list[str], FakeHost]:
    """The commands fabric_peers yields for spark-1 with this FabricPeers output, while pyinfra
    counts `failed` boxes as failed in the run."""
    facts = {} if outputs is None else {preflight.FabricPeers: outputs}
    host = FakeHost(facts)
    host.name = "spark-1"
    run_state = SimpleNamespace(failed_hosts=[SimpleNamespace(name=name) for name in failed])
    with ctx_state.use(run_state):
        return run_op(preflight.fabric_peers, PEERS, mtu=9000, host=host), host


def test_fact_reads_each_twin_and_address() -> None:
    assert process(preflight.FabricPeers, captured("lab-fabric-peers-answer.txt")) == {
        (A, "192.168.100.11"): True,
        (B, "192.168.101.11"): True,
    }
    assert process(preflight.FabricPeers, captured("lab-fabric-peers-cut.txt")) == {
        (A, "192.168.100.11"): True,
        (B, "192.168.101.11"): False,
    }
    command = preflight.FabricPeers().command(pairs=PAIRS, size=8972)
    assert "-M do -s 8972 -I enP2p1s0f1np1 192.168.101.11" in command
    assert command.endswith("2>/dev/null || true")


def test_every_peer_answering_yields_nothing() -> None:
    commands, host = check(captured("lab-fabric-peers-answer.txt"))
    assert commands == []
    assert host.noops == ["every twin reaches its peers with 9000-byte frames"]


def test_a_silent_twin_gets_the_check_that_names_box_twin_and_peer() -> None:
    commands, _host = check(captured("lab-fabric-peers-cut.txt"))
    assert len(commands) == 1
    assert "spark-1: fabric twin enP2p1s0f1np1 gets no answer from spark-2" in commands[0]
    assert "-I enp1s0f1np1" not in commands[0]  # the twin that answers is not asked again


def test_a_box_failed_in_this_run_is_left_out() -> None:
    commands, host = check(None, failed=("spark-2",))  # no fact read at all
    assert commands == []
    assert host.noops == [
        "every twin reaches its peers with 9000-byte frames (spark-2 failed in this run:"
        " not checked)"
    ]


def test_a_single_box_has_no_peer_to_reach() -> None:
    host = FakeHost({})
    assert run_op(preflight.fabric_peers, [], host=host) == []
    assert host.noops == ["no other box in the inventory: no fabric peer to reach"]


def test_peers_are_the_same_twin_on_every_other_box() -> None:
    boxes = [
        SimpleNamespace(
            name=f"spark-{n}",
            fabric=[
                SimpleNamespace(ifname=twin, address=IPv4Interface(f"192.168.{net}.{9 + n}/24"))
                for twin, net in ((A, 100), (B, 101))
            ],
        )
        for n in (1, 2, 3)
    ]
    assert preflight.peers_of(boxes[0], boxes) == [
        (A, "spark-2", "192.168.100.11"),
        (A, "spark-3", "192.168.100.12"),
        (B, "spark-2", "192.168.101.11"),
        (B, "spark-3", "192.168.101.12"),
    ]


STUBS = {
    # Answers a ping when its size is allowed: $PING_SIZES holds the sizes that get through.
    "ping": 'for a; do [ "$p" = -s ] && s=$a; p=$a; done\n'
    'case " $PING_SIZES " in *" $s "*) exit 0;; esac; exit 1\n',
    "cat": 'echo "$CARRIER"\n',
    "sleep": "exit 0\n",
}


@pytest.mark.parametrize(
    ("carrier", "sizes", "hint"),
    [
        ("0", "", "enP2p1s0f1np1 has no link: check the QSFP-DD cable at both ends"),
        ("1", "56", "smaller pings do get through: a hop below MTU 9000"),
        ("1", "", "enP2p1s0f1np1 has link but nothing answers: check on spark-2 that"),
    ],
)
def test_check_command_says_what_to_look_at(
    tmp_path: Path, carrier: str, sizes: str, hint: str
) -> None:
    for name, body in STUBS.items():
        (tmp_path / name).write_text("#!/bin/sh\n" + body)
        (tmp_path / name).chmod(0o755)
    commands, _host = check(captured("lab-fabric-peers-cut.txt"))
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", CARRIER=carrier)
    failing = subprocess.run(
        ["sh", "-c", commands[0]], env=env | {"PING_SIZES": sizes}, capture_output=True, text=True
    )
    assert failing.returncode == 1
    assert failing.stderr.startswith(
        "spark-1: fabric twin enP2p1s0f1np1 gets no answer from spark-2 (192.168.101.11 on its"
        " enP2p1s0f1np1) to 9000-byte unfragmented pings; "
    )
    assert hint in failing.stderr
    # The peer answering in time (a profile just brought up) passes.
    answering = subprocess.run(["sh", "-c", commands[0]], env=env | {"PING_SIZES": "8972"})
    assert answering.returncode == 0

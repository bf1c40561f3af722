"""The link-rate check: each twin the topology uses exists and links at its expected rate.

Captures:
- host-link-speeds-eth0-lo-no-port0.txt: LinkSpeeds' command run on the development machine
  for eth0, lo and enp1s0f0np0 (eth0 reads -1 without a rate, lo's file fails, which prints
  nothing after the name, and there is no enp1s0f0np0: left out).
- link-speeds-pair-200g.sample.txt, link-speeds-switch-autoneg-100g.sample.txt: hand-written
  in the command's format, as a Spark's twins read at 200G, and one behind a switch port that
  auto-negotiated 100G (no real Spark capture yet).
The command itself is run in a real shell below.
"""

from __future__ import annotations

import logging
import subprocess

import pytest
from pyinfra.api.exceptions import OperationError

from operations import preflight
from tests.unit.harness import FakeHost, captured, process, run_op

PORT1 = [("enp1s0f1np1", 1), ("enP2p1s0f1np1", 1)]
PORT0 = [("enp1s0f0np0", 0), ("enP2p1s0f0np0", 0)]


def check(output: str, twins=PORT1, expected: int = 200000, low: str = "refuse"):
    host = FakeHost({preflight.LinkSpeeds: output})
    host.name = "spark-2"
    return run_op(preflight.link_speeds, twins, expected, low=low, host=host), host


def test_fact_reads_rates_linkless_and_absent_interfaces() -> None:
    assert process(preflight.LinkSpeeds, captured("host-link-speeds-eth0-lo-no-port0.txt")) == {
        "eth0": -1,
        "lo": -1,
    }
    assert process(preflight.LinkSpeeds, captured("link-speeds-pair-200g.sample.txt")) == {
        "enp1s0f1np1": 200000,
        "enP2p1s0f1np1": 200000,
    }


def test_fact_command_runs_in_a_shell_and_never_fails() -> None:
    command = preflight.LinkSpeeds().command(("lo", "no-such-if0"))
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("lo ") and "no-such-if0" not in result.stdout


def test_twins_at_their_rate_need_nothing() -> None:
    commands, host = check(captured("link-speeds-pair-200g.sample.txt"))
    assert commands == []
    assert host.noops == ["every twin links at 200000 Mb/s or more"]


def test_a_switch_port_at_100g_is_refused_naming_twin_speed_and_causes() -> None:
    with pytest.raises(OperationError) as error:
        check(captured("link-speeds-switch-autoneg-100g.sample.txt"))
    message = str(error.value)
    assert message.startswith(
        "spark-2: fabric twin enp1s0f1np1 links at 100000 Mb/s, below the 200000 expected;"
    )
    assert "auto-negotiation" in message and "PR#108" in message
    assert "enP2p1s0f1np1" not in message


def test_a_100g_switch_expects_100g() -> None:
    commands, _ = check(captured("link-speeds-switch-autoneg-100g.sample.txt"), expected=100000)
    assert commands == []


def test_warn_logs_loudly_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        commands, host = check("enp1s0f1np1 10000\nenP2p1s0f1np1 10000\n", low="warn")
    assert commands == []
    assert "enp1s0f1np1 links at 10000 Mb/s" in caplog.text
    assert "enP2p1s0f1np1 links at 10000 Mb/s" in caplog.text
    assert "going on" in host.noops[0]


def test_a_linkless_twin_is_named() -> None:
    with pytest.raises(OperationError, match="enP2p1s0f1np1 has no link"):
        check("enp1s0f1np1 200000\nenP2p1s0f1np1 -1\n")


def test_a_port_without_interfaces_is_no_cable_even_in_warn_mode() -> None:
    with pytest.raises(OperationError) as error:
        check(captured("link-speeds-pair-200g.sample.txt"), twins=PORT1 + PORT0, low="warn")
    assert str(error.value).startswith(
        "spark-2: no cable on port 0 (or its ConnectX missing): enp1s0f0np0 and enP2p1s0f0np0"
        " do not exist"
    )

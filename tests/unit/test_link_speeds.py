"""The link-rate check: each twin the topology uses exists and links at its expected rate.

Captures:
- host-link-speeds-eth0-lo-no-port0.txt: LinkSpeeds' command run on the development machine
  for eth0, lo and enp1s0f0np0 (eth0 reads -1 without a rate, lo's file fails, which prints
  nothing after the name, and there is no enp1s0f0np0: left out).
- link-speeds-pair-200g.sample.txt, link-speeds-switch-autoneg-100g.sample.txt: hand-written
  in the command's format, as a Spark's twins read at 200G, and one behind a switch port that
  auto-negotiated 100G. No public capture of a Spark's /sys/class/net/*/speed was found: the
  public ones are ethtool's view of the same kernel value ("Speed: 200000Mb/s" on a cabled
  twin, dgx-spark-playbooks multi-sparks-through-switch; "Speed: Unknown!" on one without).
The fact's command, and the rate check's wait for a twin with no rate yet, are run in a real
shell below (the wait against stand-ins for cat and sleep).
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host

from operations import preflight
from tests.unit.harness import FakeHost, captured, process, refusal, run_op

PORT1 = [("enp1s0f1np1", 1), ("enP2p1s0f1np1", 1)]
PORT0 = [("enp1s0f0np0", 0), ("enP2p1s0f0np0", 0)]
TWINS = [ifname for ifname, _ in PORT1]


def check(output: str, expected: int = 200000, low: str = "refuse", ifnames=TWINS):
    host = FakeHost({preflight.LinkSpeeds: output})
    host.name = "spark-2"
    return run_op(preflight.link_speeds, ifnames, expected, low=low, host=host), host


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
    message = refusal(check(captured("link-speeds-switch-autoneg-100g.sample.txt"))[0])
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


def test_a_twin_without_a_rate_yet_gets_a_runtime_check() -> None:
    commands, _ = check("enp1s0f1np1 200000\nenP2p1s0f1np1 -1\n")
    (command,) = commands
    assert "/sys/class/net/enP2p1s0f1np1/speed" in command
    assert "enp1s0f1np1/speed" not in command
    assert command.endswith('[ "$failed" = 0 ]')


def rate_check(tmp_path: Path, readings: list[str], low: str = "refuse"):
    """The runtime check run in a shell where `cat` prints the next of ``readings`` (the last
    one again once they run out; "" fails as sysfs does without a link) and `sleep` returns."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "readings").write_text("\n".join(readings) + "\n")
    (bin_dir / "cat").write_text(
        '#!/bin/sh\nf=$SIMFILE; s=$(head -n 1 "$f"); [ $(wc -l < "$f") -gt 1 ] &&'
        ' sed -i 1d "$f"; [ -n "$s" ] || exit 1; echo "$s"\n'
    )
    (bin_dir / "sleep").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("cat", "sleep"):
        (bin_dir / tool).chmod(0o755)
    with ctx_host.use(SimpleNamespace(name="spark-2")):
        command = preflight._rate_command(["enp1s0f1np1"], 200000, low)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
               SIMFILE=str(tmp_path / "readings"))  # fmt: skip
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)


def test_the_runtime_check_waits_for_the_rate(tmp_path: Path) -> None:
    result = rate_check(tmp_path, ["", "", "200000"])
    assert (result.returncode, result.stderr) == (0, "")


def test_the_runtime_check_names_a_twin_with_no_link(tmp_path: Path) -> None:
    result = rate_check(tmp_path, [""])
    assert result.returncode == 1
    assert result.stderr.startswith("spark-2: fabric twin enp1s0f1np1 reports no link rate")


def test_the_runtime_check_names_a_slow_twin_and_warn_goes_on(tmp_path: Path) -> None:
    result = rate_check(tmp_path, ["100000"], low="warn")
    assert result.returncode == 0
    assert "enp1s0f1np1 links at 100000 Mb/s, below the 200000 expected" in result.stderr


def test_a_port_without_interfaces_is_no_cable() -> None:
    host = FakeHost({preflight.LinkSpeeds: captured("link-speeds-pair-200g.sample.txt")})
    host.name = "spark-2"
    message = refusal(run_op(preflight.fabric_ports_cabled, PORT1 + PORT0, host=host))
    assert message.startswith(
        "spark-2: no cable on port 0 (or its ConnectX missing): enp1s0f0np0 and enP2p1s0f0np0"
        " do not exist"
    )


def test_every_twin_there_is_nothing_to_do() -> None:
    host = FakeHost({preflight.LinkSpeeds: captured("link-speeds-pair-200g.sample.txt")})
    assert run_op(preflight.fabric_ports_cabled, PORT1, host=host) == []
    assert host.noops == ["every twin is there (enp1s0f1np1, enP2p1s0f1np1)"]

"""What the robustness tests do to a deploy and to the lab's boxes, and read from a run's output:
start the deploy as a user does, cut a box's power and bring it back, sort pyinfra's output by
box and outcome, and the bar every such test ends on (`converged`)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter

from tests.conftest import PYINFRA, pyinfra
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab
from tests.simlab.paths import REPO, STATE

INVENTORY = "inventories/sim.py"
HOST_RESULT = re.compile(r"^\s+\[([^\]]+)\] (Success|No changes|Error)", re.M)


def plain(text: str) -> str:
    """pyinfra's output without its colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def output_of(result: subprocess.CompletedProcess) -> str:
    return plain(result.stdout + result.stderr)


def host_results(output: str) -> dict[str, Counter[str]]:
    """Per box, how many operations ended in Success (a change), No changes, or Error."""
    results: dict[str, Counter[str]] = {}
    for box, outcome in HOST_RESULT.findall(output):
        results.setdefault(box, Counter())[outcome] += 1
    return results


def errors(output: str) -> list[str]:
    """pyinfra's error lines: an operation that failed on a box, a box it could not reach."""
    return [
        line.strip()
        for line in output.splitlines()
        if re.search(r"\] Error|Could not connect|--> pyinfra error", line)
    ]


def start_deploy() -> subprocess.Popen:
    """The deploy as a user starts it, its output (stdout and stderr) read as it comes."""
    env = dict(os.environ, SIMLAB_STATE=str(STATE))
    return subprocess.Popen(
        [PYINFRA, "-y", INVENTORY, "deploy.py"], cwd=REPO, env=env, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def power_cut(host: simlab.Host) -> None:
    lab = simlab.Lab.load()
    simlab.stop(lab.host(host.name))
    lab.save()


def power_on(host: simlab.Host) -> None:
    """Boot a box whose power was cut, its disk as the cut left it (what a reboot does to its
    NICs included)."""
    lab = simlab.Lab.load()
    host = lab.host(host.name)
    simlab.power_cycle_nics(host)
    simlab.boot(host, simlab.spark_base())
    lab.save()
    simlab.wait_ready(host, time.monotonic() + simlab.BOOT_TIMEOUT)


def converged() -> None:
    """The run after changes nothing and every compliance check passes."""
    again = pyinfra(INVENTORY, "deploy.py")
    assert changes(again) == 0, again.stdout
    code, table, output = compliance()
    assert code == 0 and not_passing(table) == {}, output

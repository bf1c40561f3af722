"""Runs cut off anywhere converge: the deploy killed in every operation of a run from bare hosts,
and a box's power cut while dpkg installs.

Where the kills land is chosen by progress, so stages added to deploy.py are covered without
touching this file: operation after operation, pyinfra is killed (SIGKILL: the laptop dies, the
connection is gone) FIRST s after it starts the n-th operation, or as the next one starts if
that comes sooner; when the n-th was still running (a package install, a service start, a lane
loading), once more DEEPER s into it. So every operation is cut into or right after, and the
long ones twice. A killed run leaves its remote command running on the box (sshd does not end
it), as a lost connection does. (^C is not used: pyinfra 3.10's SIGINT handler may let the run
go on, or hang it in an SFTP upload until a second ^C; what it leaves on the boxes is no
different.)

The kills form a chain on one pair of bare hosts (a from-bare run per kill would cost far more
than the CI budget): each run resumes where the previous one was cut off, must get there without
an error, and is cut off one step further; the first run not cut off must finish without an
error, the run after it must change nothing, and the compliance suite must pass. A kill whose
damage later runs do not repair fails one of these.

Tests in this module run in order: the power cut starts from the lab the chain left converged.
"""

from __future__ import annotations

import queue
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass

import pytest

from operations.toolkit import PACKAGES
from tests.conftest import pyinfra, reimage_all, run_on
from tests.e2e.runs import (
    INVENTORY,
    converged,
    errors,
    host_results,
    output_of,
    plain,
    power_cut,
    power_on,
    start_deploy,
)
from tests.simlab import lab as simlab

pytestmark = pytest.mark.lab

FIRST, DEEPER = 0.4, 1.5  # seconds after pyinfra announces the operation
OPERATION = re.compile(r"^--> Starting operation: (.*?)\s*$", re.M)


@dataclass
class Cut:
    target: int  # the operation (1-based) the kill was timed from
    delay: float
    hit: int  # the operation pyinfra had last started when it was killed
    name: str  # its name
    into: float  # seconds after pyinfra started it

    def __str__(self) -> str:
        return f"op {self.target} +{self.delay:g} s: op {self.hit} +{self.into:.1f} s, {self.name}"


def _read(process: subprocess.Popen, lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)


def deploy_cut_in(operation: int, delay: float) -> tuple[str, Cut | None]:
    """The deploy's output, killed `delay` s after pyinfra starts its `operation`-th operation,
    or as it starts the next one if that comes first; the cut, or None when the run ended."""
    process = start_deploy()
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read, args=(process, lines), daemon=True).start()
    output, started, deadline, last_start = [], 0, None, 0.0
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            break  # still in the operation at the deadline
        if line is None:
            break
        output.append(line)
        if OPERATION.match(plain(line)):
            started, last_start = started + 1, time.monotonic()
            if started == operation:
                deadline = last_start + delay
            elif started > operation:
                break  # the operation ended before the deadline: cut as the next one starts
    killed = process.poll() is None
    if killed:
        process.kill()
        into = time.monotonic() - last_start
    process.wait(timeout=60)
    while line is not None:
        line = lines.get(timeout=60)
        output.append(line or "")
    text = plain("".join(output))
    if not killed:
        return text, None
    names = OPERATION.findall(text)
    return text, Cut(operation, delay, len(names), names[-1], into)


@pytest.fixture(scope="module")
def bare(lab: simlab.Lab) -> simlab.Lab:
    return reimage_all(lab)


def test_killed_in_every_operation_the_next_runs_finish(bare: simlab.Lab) -> None:
    cuts: list[Cut] = []
    operation, delay = 1, FIRST
    while True:
        output, cut = deploy_cut_in(operation, delay)
        assert errors(output) == [], f"after {len(cuts)} cuts:\n{output}"
        if cut is None:
            break
        cuts.append(cut)
        if delay == FIRST and cut.hit == operation:
            delay = DEEPER
        else:
            operation, delay = operation + 1, FIRST
    print(f"\n{len(cuts)} cuts, then a run that finished:", *cuts, sep="\n  ")
    assert "Grand total" in output, output
    operations = len(OPERATION.findall(output))
    # Every operation had its cut (the last one may end before it comes).
    assert {cut.target for cut in cuts} >= set(range(1, operations)), [str(c) for c in cuts]
    assert len(cuts) >= 24, [str(cut) for cut in cuts]
    converged()


# dpkg runs its post-invoke hooks through `sh -c` after each run, with DPKG_HOOK_ACTION naming
# it (dpkg(1)); apt unpacks new packages in one dpkg run and configures them in the next. So this
# hook holds dpkg, lock taken and packages unpacked but not configured, for as long as the flag
# in /run exists: until the power cut empties /run. No race: dpkg waits for the test.
FREEZE_CFG = "/etc/dpkg/dpkg.cfg.d/zz-freeze"
FREEZE_AFTER_UNPACK = (
    'post-invoke=if [ "$DPKG_HOOK_ACTION" = unpack ] && [ -e /run/freeze-dpkg ];'
    " then touch /run/dpkg-frozen; while [ -e /run/freeze-dpkg ]; do sleep 1; done; fi"
)


def test_power_cut_during_dpkg_is_repaired(bare: simlab.Lab) -> None:
    # On the lab the test before left converged: spark-2 loses its container toolkit, so that
    # the deploy installs it again; once dpkg has unpacked it, dpkg is held there and the box's
    # power is cut.
    spark_2 = bare.hosts[1]
    packages = " ".join(PACKAGES)
    run_on(spark_2, f"sudo apt-get purge -qq -y --allow-change-held-packages {packages}")
    run_on(
        spark_2,
        f"echo {shlex.quote(FREEZE_AFTER_UNPACK)} | sudo tee {FREEZE_CFG} >/dev/null"
        " && sudo touch /run/freeze-dpkg",
    )
    deploy = start_deploy()
    frozen = run_on(
        spark_2,
        "timeout 600 sh -c 'until [ -e /run/dpkg-frozen ]; do sleep 0.2; done' && echo frozen"
        " || echo 'dpkg never reached the hook'",
        check=False,
    )
    assert frozen.strip() == "frozen", (frozen, deploy.poll())
    power_cut(spark_2)
    output = plain(deploy.communicate(timeout=900)[0])

    # pyinfra names the box it lost; the other one went on, with nothing to do, up to the
    # NCCL test, which waits for spark-2.
    assert deploy.returncode == 1, output
    assert re.search(r"\[spark-2\] .*(Error|Could not|closed|EOF)", output, re.I), output
    assert host_results(output)["spark-1"]["Error"] == 1, output
    assert host_results(output)["spark-1"]["Success"] == 0, output
    refusal = "spark-1: the NCCL test runs a rank on every box: it waits for spark-2, stopped at"
    assert refusal in output, output

    power_on(spark_2)
    run_on(spark_2, f"sudo rm {FREEZE_CFG}")  # its flag in /run went with the power
    audit = run_on(spark_2, "sudo dpkg --audit", check=False)
    assert "not yet configured" in audit or "reinstalled" in audit, audit
    repaired = pyinfra(INVENTORY, "deploy.py")
    assert errors(output_of(repaired)) == []
    assert run_on(spark_2, "sudo dpkg --audit", check=False) == ""
    converged()

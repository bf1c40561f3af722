"""A box's problem stops that box alone (issue 26): four boxes through the lab's switch, one
lane each; a listener already holds the lane's port on spark-4. The run stops spark-4 at its
lane with pyinfra's own error lines and no traceback; the other three bring up their lane and
front, and Ray (head and two workers: none of them needs spark-4), and then stop where the
cluster needs spark-4 (the NCCL test runs a rank on every box), saying so; the run exits 1 and
ends with the table of the boxes. With the listener gone, the next run converges all four.
Then, on the same boot, spark-2 drifts to driver branch 590: it stops at its host layer, the
others converge on their own and wait for it, until its owner purges 590 and the next run
converges it and changes nothing on the others. Last, spark-3 powered off: pyinfra cannot
connect to it; the others have nothing to change and wait for it at the NCCL test, the table
saying so.

The first run's table (its lines wrapped here):

    --> Boxes:
        spark-1  converged on its own; stopped at Cluster | NCCL test: NET/IB on every twin,
                 all_gather at 0.005 GB/s or more at 4194304 B: the NCCL test runs a rank on
                 every box: it waits for spark-4, stopped at Lanes and front | Lane coder:
                 qwen3-coder-next on port 10101: port 10101 of lane coder is taken by python3;
                 stop that service or give the lane another port in group_data `lanes`; it runs
                 once every box is back
        spark-2  (as spark-1)
        spark-3  (as spark-1)
        spark-4  stopped at Lanes and front | Lane coder: qwen3-coder-next on port 10101: port
                 10101 of lane coder is taken by python3; ...
    --> pyinfra error: No hosts remaining!

then "converged" for all four; with spark-3 off, spark-3 "stopped at connecting: not reached
(pyinfra's error above)" and the others "converged on its own; stopped at Cluster | NCCL
test: ...: it waits for spark-3,
stopped at connecting: ...". Times (2-core machine, in three module runs): the run with the port
taken 37-40 s, the one with it free 22-30 s, the one with spark-3 off 8-11 s; the module 2 min
18 s to 2 min 47 s (two lab boots, the --dry run, the four runs).

Tests in this module run in order: the third removes the listener, the last cuts spark-3's
power (the next module's reimage_all boots the session's boxes again).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Any

import pytest

from operations import ray
from tests.conftest import PYINFRA, cabled, pyinfra, run_on
from tests.e2e.runs import host_results, output_of, power_cut
from tests.e2e.test_lanes import key_of, request
from tests.e2e.test_switch import BOXES
from tests.simlab import lab as simlab
from tests.simlab.paths import REPO, STATE

pytestmark = [pytest.mark.lab, pytest.mark.recabled]

INVENTORY = "tests/e2e/one_lane_inventory.py"
LANE = {"name": "coder", "port": 10101, "served_name": "qwen3-coder-next"}  # group_data's first
LISTENER = "taken-port"  # the transient unit holding the lane's port on spark-4
TAKEN = (
    f"port {LANE['port']} of lane coder is taken by python3; stop that service or give the lane"
    " another port in group_data `lanes`"
)
# The operations' names, as deploy.py gives them, the lane's with its served name and port.
LANE_OP = f"Lane coder: {LANE['served_name']} on port {LANE['port']}"
NCCL_OP = "NCCL test: NET/IB on every twin, all_gather at 0.005 GB/s or more at 4194304 B"


def deploy() -> tuple[subprocess.CompletedProcess, str, float]:
    start = time.monotonic()
    result = pyinfra(INVENTORY, "deploy.py", check=False)
    output = output_of(result)
    print(output[output.find("--> Boxes:") :])  # the table (with -s), for the docstring
    return result, output, time.monotonic() - start


def boxes_table(output: str) -> dict[str, str]:
    """The table summary.py prints at the end of the run: each box's outcome."""
    assert "--> Boxes:" in output, output
    lines = output.split("--> Boxes:\n", 1)[1].splitlines()
    rows = [re.match(r"^    (\S+)  +(.+)$", line) for line in lines]
    return {row[1]: row[2] for row in rows[: next(i for i, r in enumerate(rows) if not r)]}


def alive(head: simlab.Host, count: int) -> str:
    """What spark-ray-nodes says on the head of ``count`` nodes (it waits up to 2 minutes)."""
    return run_on(head, f"sudo {ray.NODES_COMMAND} {count} 120 2>&1").strip().splitlines()[-1]


def serves(host: simlab.Host) -> bool:
    """Whether the box's lane answers through its front, with its key."""
    url = f"http://{host.mgmt_ip}:{LANE['port']}/v1/models"
    status, listing = request(url, key_of(host, LANE))
    return status == 200 and [model["id"] for model in listing["data"]] == [LANE["served_name"]]


@pytest.fixture(scope="module")
def taken(lab: simlab.Lab) -> dict[str, Any]:
    switch_lab = cabled(lab, "switch", count=BOXES)
    spark_4 = switch_lab.hosts[-1]
    run_on(spark_4, f"sudo systemd-run --unit={LISTENER} python3 -m http.server {LANE['port']}")
    port = f"'sport = :{LANE['port']}'"
    run_on(spark_4, f"for i in $(seq 50); do ss -Hltn {port} | grep -q . && break; sleep 0.2; done")
    # The plan first, as the README shows it: --dry without -y, so pyinfra prepares (and its
    # operations look at the boxes) without running a command.
    dry = subprocess.run(
        [PYINFRA, INVENTORY, "deploy.py", "--dry"], cwd=REPO, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=600, env=dict(os.environ, SIMLAB_STATE=str(STATE)),
    )  # fmt: skip
    result, output, seconds = deploy()
    print(f"isolation: the run with spark-4's port taken took {seconds:.0f} s")
    return {"lab": switch_lab, "dry": dry, "result": result, "output": output}


def test_the_dry_run_says_where_the_box_would_stop(taken: dict[str, Any]) -> None:
    dry = taken["dry"]
    output = output_of(dry)
    spark_4 = taken["lab"].hosts[-1].name
    assert dry.returncode == 0, output
    assert f"[{spark_4}] would stop here: {spark_4}: {TAKEN}" in output, output
    assert "Traceback" not in output and "--> Boxes:" not in output, output  # nothing ran


def test_the_box_stops_alone_naming_why_and_the_run_exits_1(taken: dict[str, Any]) -> None:
    output = taken["output"]
    names = [host.name for host in taken["lab"].hosts]
    assert taken["result"].returncode == 1, output
    assert "Traceback" not in output, output
    # Every box stopped (the other three where they wait for spark-4): pyinfra ends so.
    assert re.findall(r"--> pyinfra error: .*", output) == [
        "--> pyinfra error: No hosts remaining!"
    ]
    # pyinfra's own lines for the failed command: the box, the message on stderr.
    assert f"[{names[3]}] {names[3]}: {TAKEN}" in output, output
    results = host_results(output)
    assert set(results) == set(names), output  # every box ran its operations
    assert [results[name]["Error"] for name in names] == [1, 1, 1, 1], output
    # An operation's name starts with its stage ("Stage | "): the lane's in the lanes' stage,
    # the NCCL test in the cluster's, after the box's own stages (which converged).
    lane = f"Lanes and front | {LANE_OP}: {TAKEN}"
    waits = (
        f"Cluster | {NCCL_OP}: the NCCL test runs a rank on every box: it waits for {names[3]},"
        f" stopped at {lane}; it runs once every box is back"
    )
    table = boxes_table(output)
    assert table == {
        **{name: f"converged on its own; stopped at {waits}" for name in names[:3]},
        names[3]: f"stopped at {lane}",
    }, output
    # The three boxes whose own lanes serve are listed for clients; spark-4 is not.
    serving = output.split("--> Lanes serving:\n", 1)[1].split("    OpenCode")[0]
    assert [line.split()[0] for line in serving.splitlines()[1:]] == names[:3], output


def test_the_other_boxes_serve_their_lane_and_are_one_ray_cluster(taken: dict[str, Any]) -> None:
    hosts = taken["lab"].hosts
    assert [serves(host) for host in hosts[:3]] == [True, True, True]
    assert alive(hosts[0], 3) == "3 of 3 Ray nodes are alive"


def test_with_the_port_free_the_next_run_converges_all_four(taken: dict[str, Any]) -> None:
    hosts = taken["lab"].hosts
    run_on(hosts[-1], f"sudo systemctl stop {LISTENER}")
    result, output, seconds = deploy()
    print(f"isolation: the run with the port free took {seconds:.0f} s")
    assert result.returncode == 0, output
    assert boxes_table(output) == {host.name: "converged" for host in hosts}
    assert serves(hosts[-1])
    assert alive(hosts[0], BOXES) == f"{BOXES} of {BOXES} Ray nodes are alive"


# Drift on spark-2: someone lifted the hold and the pin and installed branch 590 (the lab's
# stand-in of DGX OS's nvidia-driver-590-open), which the deploy refuses and never downgrades.
DRIFT_590 = (
    "sudo rm -f /etc/apt/preferences.d/nvidia-driver-branch.pref"
    " && sudo apt-mark unhold $(apt-mark showhold) >/dev/null"
    " && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nvidia-driver-590-open"
)
# And what its owner does about it: branch 590's packages purged (the deploy puts 580 back).
BACK_TO_580 = (
    "sudo DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq"
    " $(dpkg-query -W -f='${Package}\\n' '*590*' 2>/dev/null)"
)


def test_a_box_on_another_driver_branch_stops_alone_until_its_owner_mends_it(
    taken: dict[str, Any],
) -> None:
    hosts = taken["lab"].hosts
    names = [host.name for host in hosts]
    run_on(hosts[1], DRIFT_590)
    result, output, seconds = deploy()
    print(f"isolation: the run with spark-2 on branch 590 took {seconds:.0f} s")
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    table = boxes_table(output)
    driver = "Host layer | Driver branch 580: installed, held, apt pinned: driver packages not on"
    assert table[names[1]].startswith(f"stopped at {driver} branch 580 are installed: "), table
    assert "nvidia-driver-590-open 590.48-0ubuntu1" in table[names[1]], table
    for name in (names[0], names[2], names[3]):
        assert table[name].startswith(
            f"converged on its own; stopped at Cluster | {NCCL_OP}: the NCCL test runs a rank on"
            f" every box: it waits for {names[1]}, stopped at {driver}"
        ), table
    assert [serves(host) for host in (hosts[0], hosts[2], hosts[3])] == [True, True, True]
    run_on(hosts[1], BACK_TO_580)
    result, output, seconds = deploy()
    print(f"isolation: the run after the owner purged 590 took {seconds:.0f} s")
    assert result.returncode == 0, output
    assert boxes_table(output) == {name: "converged" for name in names}
    # The other three had nothing to change: their operations all said "No change".
    results = host_results(output)
    assert [results[name]["Success"] for name in (names[0], names[2], names[3])] == [0, 0, 0]
    assert serves(hosts[1])


def test_a_box_powered_off_is_named_and_the_others_wait_for_it(taken: dict[str, Any]) -> None:
    hosts = taken["lab"].hosts
    power_cut(hosts[2])
    result, output, seconds = deploy()
    print(f"isolation: the run with spark-3 off took {seconds:.0f} s")
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    assert f"[{hosts[2].name}] Could not connect" in output, output
    unreached = "connecting: not reached (pyinfra's error above)"
    waits = (
        f"{NCCL_OP}: the NCCL test runs a rank on every box: it waits for {hosts[2].name},"
        f" stopped at {unreached}; it runs once every box is back"
    )
    table = boxes_table(output)
    assert list(table) == [host.name for host in hosts], output
    assert table[hosts[2].name] == f"stopped at {unreached}"
    for host in (hosts[0], hosts[1], hosts[3]):
        assert table[host.name] == f"converged on its own; stopped at Cluster | {waits}", table

"""The cluster over the fabric: the firewall's table loaded as the deploy renders it; on Ray, each
box's Ray unit running, every box joined (as each box sees it), the token root-only, and the
cluster lane (on the head) serving with every node in; on vLLM's own multi-node mode (executor
mp), every box's rank unit running, joined to the head's rendezvous, and the head serving; the
NCCL test's last verdict a pass made on what the box has now. Boxes of a one-box inventory have
no cluster, and a ring has no Ray yet (docs/reference.md, Fabric shapes): there only the NCCL test
is checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from operations import firewall, lanes, nccl, ray
from spark.ports import BACKEND_PORTS, MASTER_PORT

if TYPE_CHECKING:
    from tests.compliance.conftest import Box


# What a box without a firewall (a ring: no address reaches every box) has of the cluster: the
# NCCL test (spark/plan.py cluster).
WITHOUT_A_FIREWALL = {"test_nccl_test"}


@pytest.fixture(autouse=True)
def _cluster_only(box: Box, request: pytest.FixtureRequest) -> None:
    if box.plan.cluster is None:
        alone = "an independent server" if box.plan.independent else "a single box"
        pytest.skip(f"{alone}: no Ray cluster")
    if box.plan.cluster.firewall is None and request.node.originalname not in WITHOUT_A_FIREWALL:
        pytest.skip(
            "a ring: no Ray cluster yet, nor its firewall (docs/reference.md: Fabric shapes)"
        )


def _on_mp(box: Box) -> bool:
    return box.cluster_lane is not None and box.cluster_lane.cluster_executor == "mp"


@pytest.fixture
def _ray_only(box: Box) -> None:
    if _on_mp(box):
        pytest.skip("no Ray: the cluster lane runs on vLLM's own multi-node mode (executor mp)")


@pytest.mark.usefixtures("_ray_only")
def test_ray_unit(box: Box, found: Callable[[object], None]) -> None:
    """Ray unit enabled and running"""
    state = box.run(f"systemctl is-enabled {ray.UNIT}; systemctl is-active {ray.UNIT}").stdout
    found(" ".join(state.split()) or "no unit")
    assert state.split() == ["enabled", "active"], f"expected {ray.UNIT} enabled, active: {state}"


@pytest.mark.usefixtures("_ray_only")
def test_ray_nodes(box: Box, found: Callable[[object], None]) -> None:
    """Ray nodes all joined"""
    # Asked on every box (any node's `ray status` reads the head's GCS); waits a minute at most
    # for a worker that is (re)joining: it retries every 10 s.
    result = box.run(f"{ray.NODES_COMMAND} {len(box.plan.cluster.members)} 60 2>&1")
    said = result.stdout.strip().splitlines()[0] if result.stdout.strip() else f"rc {result.rc}"
    found(said)
    assert result.rc == 0, (
        f"expected {len(box.plan.cluster.members)} Ray nodes alive, found: {said}"
    )


def test_nccl_test(box: Box, found: Callable[[object], None]) -> None:
    """NCCL test passed"""
    if box.plan.cluster is None or box.plan.cluster.nccl_test is None:
        pytest.skip("nccl_test is off")
    state = nccl.NcclTestState()
    now = state.process(box.run(state.command()).stdout.splitlines())
    kept = now["kept"]
    # Why the deploy would run it again, as the deploy itself decides (None: passed as it is).
    due = nccl.why_due(kept, now["key"])
    if kept and not kept["passed"]:
        found("; ".join(kept["problems"]))  # NCCL's words, as the deploy printed them
    else:
        found(due or nccl.summary(kept))
    assert due is None, (
        f"expected a passing verdict of {nccl.COMMAND} on what the box has now; {due}: {kept}"
    )


def test_firewall_table(box: Box, found: Callable[[object], None]) -> None:
    """firewall table as deployed"""
    low, high = box.run("cat /proc/sys/net/ipv4/ip_local_port_range").stdout.split()
    assert box.plan.cluster is not None and box.plan.cluster.firewall is not None
    planned = box.plan.cluster.firewall
    ports = [*planned.ports, *BACKEND_PORTS]
    rules = firewall.ruleset(planned.fabric, firewall.merged([*ports, (int(low), int(high))]))
    want = firewall.DIGEST.search(rules)[1]
    loaded = firewall.DIGEST.search(box.run(f"nft list table {firewall.TABLE}").stdout)
    # The comment alone would pass a flushed chain: the rules themselves are compared with
    # what the deployed file gives, and the file with what the deploy renders.
    on_disk = firewall.DIGEST.search(box.run(f"cat {firewall.PATH}").stdout)
    rules = box.run(firewall.rules_check()).stdout.strip().removeprefix("rules ")
    unit = box.run(f"systemctl is-enabled {firewall.UNIT}").stdout.strip() or "no unit"
    state = (
        f"table {'absent' if loaded is None else loaded[1][:12]}, rules {rules},"
        f" file {'absent' if on_disk is None else on_disk[1][:12]}, unit {unit}"
    )
    found(state)
    assert (
        loaded
        and loaded[1] == want
        and on_disk
        and on_disk[1] == want
        and rules == "as-file"
        and unit == "enabled"
    ), (
        f"expected table {firewall.TABLE} with digest {want[:12]}, its rules as {firewall.PATH}"
        f" gives them, and its unit enabled, found {state}"
    )


@pytest.mark.usefixtures("_ray_only")
def test_ray_token(box: Box, found: Callable[[object], None]) -> None:
    """Ray token root-only"""
    if not box.config.ray.auth:
        pytest.skip("ray_auth is off")
    file = box.host.file(ray.TOKEN_PATH)
    state = f"{file.user}:{file.group} {file.mode:04o}" if file.exists else "absent"
    found(state)
    assert state == "root:root 0600", f"expected {ray.TOKEN_PATH} root:root 0600, found {state}"


def test_cluster_lane(box: Box, found: Callable[[object], None]) -> None:
    """cluster lane active, all nodes in"""
    if _on_mp(box):
        return _mp_ranks_joined(box, found)
    lane = next((lane for lane in box.config.lanes if lane.is_cluster), None)
    if lane is None:  # nothing of it to be on this box: a worker holds only Ray's ranks
        found("none on this box" if box.plan.role == "head" else "served from the head")
        return
    unit = lanes.unit_name(lane.name)
    active = box.run(f"systemctl is-active {unit}").stdout.strip() or "no unit"
    health = box.run(
        f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 http://127.0.0.1:{lane.backend_port}/health"
    ).stdout.strip()
    nodes = box.run(f"{ray.NODES_COMMAND} {lane.tensor_parallel_size} 60 2>&1").stdout.strip()
    said = nodes.splitlines()[-1] if nodes else "no answer"
    state = f"{lane.name} {active}, /health {health or 'no answer'}, {said}"
    found(state)
    assert (
        active == "active"
        and health == "200"
        and said.startswith(f"{lane.tensor_parallel_size} of {lane.tensor_parallel_size}")
    ), f"expected {unit} active, /health 200 and every Ray node alive, found: {state}"


def _mp_ranks_joined(box: Box, found: Callable[[object], None]) -> None:
    """Executor mp: this box's unit of the cluster lane active, connected on the head's master
    port with every other rank's box (the head with all, the others with the head), and the head
    serving /health."""
    lane = box.cluster_lane
    assert lane is not None
    unit = lanes.unit_name(lane.name)
    active = box.run(f"systemctl is-active {unit}").stdout.strip() or "no unit"
    listing = box.run(
        f"ss -Htn state established '( sport = :{MASTER_PORT} or dport = :{MASTER_PORT} )'"
    ).stdout
    # The head's store listens on [::] (torch's TCPStore): IPv4 ranks show as [::ffff:a.b.c.d].
    peers = {
        line.split()[3].rpartition(":")[0].strip("[]").removeprefix("::ffff:")
        for line in listing.splitlines()
        if line.split()
    }
    assert box.plan.cluster is not None and box.plan.cluster.lane is not None
    served = box.plan.cluster.lane.served
    assert served is not None  # on mp every box has the rank's unit
    want = set(served.peers)
    joined = ", ".join(sorted(peers)) or "none"
    state = f"{lane.name} {active}, rendezvous {MASTER_PORT} with {joined}"
    healthy = True
    if box.plan.role == "head":
        health = box.run(
            f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 10"
            f" http://127.0.0.1:{lane.backend_port}/health"
        ).stdout.strip()
        state += f", /health {health or 'no answer'}"
        healthy = health == "200"
    found(state)
    assert active == "active" and want <= peers and healthy, (
        f"expected {unit} active, joined on port {MASTER_PORT} with {', '.join(sorted(want))}"
        f"{' and /health 200' if box.plan.role == 'head' else ''}, found: {state}"
    )

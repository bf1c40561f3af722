"""A converged box that reboots comes back serving with no deploy: the worker first, then the
head, each by its own `systemctl reboot` (the lab powering it back as its power would). So does
one whose docker is restarted (an upgrade, a toolkit change): its lanes and Ray, which require
docker, are restarted with it, the lanes one after the other.

Back means: the fabric profiles up at MTU 9000, the firewall loaded before Ray listens, the
memory guard running, the lanes started one after the other and serving, Ray's two nodes joined
again; compliance passes and a deploy then changes nothing.
"""

from __future__ import annotations

import pytest

from tests.conftest import Deployed, run_on
from tests.e2e.runs import converged
from tests.e2e.test_lanes import A, B, container_id, key_of, request, show
from tests.simlab import lab as simlab
from tests.simlab.waits import until

pytestmark = pytest.mark.lab


def started_at(host: simlab.Host, unit: str, prop: str) -> int:
    return int(run_on(host, f"systemctl show -p {prop} --value {unit}").strip())


def came_back(host: simlab.Host, head: simlab.Host) -> None:
    for twin, _hca in simlab.FABRIC_TWINS:
        assert run_on(host, f"cat /sys/class/net/{twin}/mtu").strip() == "9000", twin
        state = run_on(host, f"nmcli -g GENERAL.STATE connection show fabric-{twin}")
        assert state.strip() == "activated", twin
    # The firewall was loaded before Ray's container started, so Ray never listened unguarded.
    firewall = started_at(host, "spark-firewall.service", "ActiveEnterTimestampMonotonic")
    ray_start = started_at(host, "spark-ray.service", "ExecMainStartTimestampMonotonic")
    assert 0 < firewall <= ray_start
    assert run_on(host, "systemctl is-active spark-memguard.service").strip() == "active"
    a, b = (show(host, lane, "ActiveState", "ActiveEnterTimestampMonotonic",
                 "ExecMainStartTimestampMonotonic") for lane in (A, B))  # fmt: skip
    assert (a["ActiveState"], b["ActiveState"]) == ("active", "active")
    assert int(b["ExecMainStartTimestampMonotonic"]) >= int(a["ActiveEnterTimestampMonotonic"])
    for lane in (A, B):
        health = f"http://{host.mgmt_ip}:{lane['port']}/health"
        assert request(health, key_of(host, lane))[0] == 200, lane["name"]
    # Both Ray nodes alive again, as the head sees them (the lanes' own check, one try a second).
    run_on(head, "sudo /usr/local/sbin/spark-ray-nodes 2 120")


def test_the_worker_then_the_head_reboot_and_come_back_serving(deployed_lab: Deployed) -> None:
    head, worker = deployed_lab.lab.hosts
    for host in (worker, head):
        booted = "systemctl show -p UserspaceTimestampMonotonic --value"  # the host's systemd
        before = int(run_on(host, booted))
        simlab.reboot(host.name)
        assert int(run_on(host, booted)) > before  # a systemd started anew: it did reboot
        came_back(host, head)
    converged()


def test_a_docker_restart_restarts_ray_and_the_lanes_in_order(deployed_lab: Deployed) -> None:
    head, worker = deployed_lab.lab.hosts
    before = {lane["name"]: container_id(worker, lane) for lane in (A, B)}
    # Requires=docker.service: an explicit restart of docker restarts what requires it, in one
    # transaction; the lanes' After= chain and their turn keep them loading one at a time.
    run_on(worker, "sudo systemctl restart docker")

    def serving() -> bool:
        return all(show(worker, lane, "ActiveState")["ActiveState"] == "active" for lane in (A, B))

    until(serving, 180, "both lanes serving again after docker's restart")
    for lane in (A, B):
        assert container_id(worker, lane) not in ("", before[lane["name"]]), lane["name"]
    came_back(worker, head)
    converged()

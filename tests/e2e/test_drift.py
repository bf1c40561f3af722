"""Hidden drift on the deployed lab (issue 37): the eight changes an owner made by hand there,
and a twin set down, each on one box, each put back by one deploy, after which the next deploy
changes nothing.

Each change names its box and the field it changes; its reading is what the box shows of that
field, taken before the change (as the deploy left it), after it (it must differ: the change was
made), after one deploy (it must be as before) and the second deploy reports no change on any
box. The changes run in the order below on the shared deployed lab (tests/conftest.py
`deployed_lab`), docker's restart last: it restarts every container of the box.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from operations import front, memguard, toolkit
from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import INVENTORY, host_results, output_of
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab

pytestmark = pytest.mark.lab

(TWIN_1, _), (TWIN_2, _) = simlab.FABRIC_TWINS
ENV = "/etc/spark/cluster.env"


@dataclass(frozen=True)
class Change:
    """A hand change to one field of one box, and how that field reads there."""

    box: str
    field: str
    make: str  # run on the box as its admin user
    reading: str  # prints the field's state; runs after each step

    @property
    def id(self) -> str:
        return f"{self.box}:{self.field}".replace(" ", "-")


CHANGES = [
    Change(
        "spark-2",
        f"twin {TWIN_2} live MTU",
        f"sudo ip link set dev {TWIN_2} mtu 1500",
        f"cat /sys/class/net/{TWIN_2}/mtu",
    ),
    # Not among issue 37's eight, of the same kind: NetworkManager still shows the profile
    # "activated" on a twin set down by hand; only the link tells.
    Change(
        "spark-2",
        f"twin {TWIN_1} link up",
        f"sudo ip link set dev {TWIN_1} down",
        f"ip -br link show dev {TWIN_1} | grep -ow UP",
    ),
    Change(
        "spark-1",
        f"profile fabric-{TWIN_1} MTU",
        f"sudo nmcli connection modify fabric-{TWIN_1} 802-3-ethernet.mtu 1500"
        f" && sudo nmcli connection up fabric-{TWIN_1} >/dev/null",
        f"nmcli -g 802-3-ethernet.mtu connection show fabric-{TWIN_1};"
        f" cat /sys/class/net/{TWIN_1}/mtu",
    ),
    Change(
        "spark-2",
        "lane fast",
        "sudo systemctl stop spark-lane-fast",
        "systemctl is-active spark-lane-fast",
    ),
    Change(
        "spark-1",
        "driver hold",
        "sudo apt-mark unhold nvidia-driver-580-open >/dev/null",
        "apt-mark showhold",
    ),
    Change(
        "spark-2",
        "cluster env NCCL_IB_HCA",
        f"sudo sed -i '/^NCCL_IB_HCA=/d' {ENV}",
        f"grep '^NCCL_IB_HCA=' {ENV}",
    ),
    Change(
        "spark-1",
        "front lane file",
        f"sudo truncate -s 0 {front.SITE}",
        f"sudo sha256sum {front.SITE}",
    ),
    Change(
        "spark-2",
        "memory guard",
        f"sudo systemctl stop {memguard.SERVICE}",
        f"systemctl is-active {memguard.SERVICE}",
    ),
    Change(
        "spark-1",
        "docker nvidia runtime",
        f"echo '{{}}' | sudo tee {toolkit.DAEMON_JSON} >/dev/null && sudo systemctl restart docker",
        "sudo docker info --format '{{json .Runtimes}}' | grep -o '\"nvidia\"';"
        f" sudo cat {toolkit.DAEMON_JSON}",
    ),
]


def read(lab: simlab.Lab, change: Change) -> str:
    return run_on(lab.host(change.box), change.reading, check=False)


@pytest.mark.parametrize("change", CHANGES, ids=[change.id for change in CHANGES])
def test_one_deploy_puts_it_back_and_the_next_changes_nothing(
    deployed_lab: Deployed, change: Change
) -> None:
    lab = deployed_lab.lab
    deployed = read(lab, change)
    run_on(lab.host(change.box), change.make)
    changed = read(lab, change)
    assert changed != deployed, f"{change.box}: {change.field} not changed by `{change.make}`"

    repair = output_of(pyinfra(INVENTORY, "deploy.py"))
    repaired = read(lab, change)
    results = host_results(repair)
    print(
        f"{change.id}: {deployed.strip()!r} -> {changed.strip()!r} -> {repaired.strip()!r};"
        f" operations changed: { ({box: counts['Success'] for box, counts in results.items()}) }"
    )
    assert repaired == deployed, (
        f"{change.box}: {change.field} not put back by the deploy: reads {repaired!r}, was"
        f" {deployed!r}\n{repair}"
    )
    assert results[change.box]["Success"] >= 1, f"{change.box}: nothing changed\n{repair}"

    again = pyinfra(INVENTORY, "deploy.py")
    assert changes(again) == 0, (
        f"after {change.box}'s {change.field} was put back, the next deploy changed"
        f" {host_results(output_of(again))}\n{output_of(again)}"
    )

"""One box down: the run names it, brings the other box's host layer, own lanes and what of the
cluster stage needs no other box (its firewall, the Ray head) to the end, and stops that box
where the cluster needs the missing one (the NCCL test), naming it; the box, powered on again,
converges.

Tests in this module run in order: the second one powers the box back on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from operations import firewall, ray
from tests.conftest import pyinfra, reimage_all, run_on
from tests.e2e.runs import INVENTORY, converged, host_results, output_of, power_cut, power_on
from tests.e2e.test_compliance import compliance, not_passing
from tests.simlab import lab as simlab

pytestmark = pytest.mark.lab

COMPLIANCE = Path(__file__).parents[1] / "compliance"
# The compliance checks of what a box does alone (host layer, its own lanes); the cluster's
# checks need every box.
ALONE = ("test_driver.py", "test_environment.py", "test_fabric.py", "test_hygiene.py",
         "test_toolkit.py", "test_lanes.py")  # fmt: skip


def alone_compliance(*args: str) -> tuple[int, dict, str]:
    others = [path for path in COMPLIANCE.glob("test_*.py") if path.name not in ALONE]
    return compliance(*args, *(f"--ignore={path}" for path in others))


@pytest.fixture(scope="module")
def one_down(lab: simlab.Lab) -> simlab.Lab:
    reimage_all(lab)
    power_cut(lab.hosts[1])
    return lab


def test_the_run_names_the_box_and_stops_the_other_where_it_needs_it(one_down: simlab.Lab) -> None:
    spark_1, spark_2 = one_down.hosts
    refusal = (
        f"{spark_1.name}: the NCCL test runs a rank on every box: it waits for {spark_2.name},"
        " stopped at connecting: not reached (pyinfra's error above); it runs once every box is"
        " back"
    )
    for _ in range(2):  # the first run from bare, the second on what the first left
        result = pyinfra(INVENTORY, "deploy.py", check=False)
        output = output_of(result)
        assert result.returncode == 1, output
        assert f"[{spark_2.name}] Could not connect" in output, output
        assert spark_2.name not in host_results(output), output  # no operation ran there
        assert host_results(output)[spark_1.name]["Error"] == 1, output
        assert refusal in output, output
        code, table, checks = alone_compliance("--limit", spark_1.name)
        assert code == 0 and not_passing(table) == {}, checks
        assert {box for row in table.values() for box in row} == {spark_1.name}
    # What of the cluster stage needs no other box ran on spark-1: its firewall, the Ray head.
    units = f"systemctl list-unit-files --no-legend {firewall.UNIT} {ray.UNIT}"
    listed = [line.split()[0] for line in run_on(spark_1, units).splitlines()]
    assert sorted(listed) == sorted([firewall.UNIT, ray.UNIT]), listed


def test_the_box_powered_on_again_converges(one_down: simlab.Lab) -> None:
    power_on(one_down.hosts[1])
    pyinfra(INVENTORY, "deploy.py")
    converged()

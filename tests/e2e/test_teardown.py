"""teardown.py and a box leaving the cluster, on the deployed pair: spark-2 torn down (pyinfra
asks first), compliance naming what spark-2 no longer has, then the inventory without it
deployed (spark-1 serves alone: no Ray, no firewall; a lane of a model outside the catalog; an
older container toolkit), and the pair deployed again (the toolkit moved to group_data's newer
one)."""

from __future__ import annotations

import shlex

import pytest

from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import INVENTORY, output_of
from tests.e2e.test_compliance import compliance, not_passing
from tests.simlab import lab as simlab

pytestmark = pytest.mark.lab

ALONE = "tests/e2e/without_spark2_inventory.py"
# The container toolkit's four packages (operations/toolkit.py PACKAGES) as `name version`, held.
TOOLKIT = (
    "dpkg-query -W -f='${Package} ${Version}\\n' nvidia-container-toolkit"
    " nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1"
    " && apt-mark showhold"
)
# Every unit, container, file and table the deploy puts on a box of the pair (stages/teardown.py
# names where each comes from), one `kind name` line each where it is left.
LEFT = r"""
systemctl list-units --all --plain --no-legend 'spark-*' | awk '{print "unit " $1}'
ls /etc/systemd/system | grep '^spark-' | sed 's/^/unit-file /'
docker ps -a --format '{{.Names}}' | grep '^spark-' | sed 's/^/container /'
for p in /etc/spark /usr/local/lib/spark /usr/local/sbin/spark-lane-turn /run/spark \
  /etc/nginx/conf.d/spark-lanes.conf /etc/nginx/spark-keys /etc/nginx/conf.d/spark-metrics.conf \
  /etc/profile.d/spark-cluster-env.sh /var/lib/spark/ray /var/lib/spark/nccl-test; do
  [ -e "$p" ] && echo "path $p"
done
nft list table inet spark >/dev/null 2>&1 && echo 'table inet spark'
ss -Hltn | awk '{print $4}' | grep -E ':(10101|10102|9100|6379)$' | sed 's/^/listening /'
true
"""


def left_on(host: simlab.Host) -> list[str]:
    return run_on(host, f"sudo sh -c {shlex.quote(LEFT)}").splitlines()


def toolkit(host: simlab.Host) -> tuple[str, bool]:
    """The toolkit's version (the same for all four packages) and whether all four are held."""
    lines = run_on(host, TOOLKIT).splitlines()
    versions = {line.split()[1] for line in lines[:4]}
    assert len(versions) == 1, lines
    return versions.pop(), set(lines[4:]) >= {line.split()[0] for line in lines[:4]}


def test_teardown_of_a_box_leaving_the_cluster_then_the_pair_again(
    deployed_lab: Deployed,
) -> None:
    spark_1, spark_2 = deployed_lab.lab.hosts
    assert "unit spark-ray.service" in left_on(spark_2)  # what is there to take off
    # With -y and without the confirmation, nothing is touched.
    refused = pyinfra(INVENTORY, "teardown.py", "--limit", spark_2.name, check=False)
    assert refused.returncode != 0
    assert "a teardown with -y needs --data teardown_confirm=true" in output_of(refused)
    assert "unit spark-ray.service" in left_on(spark_2)
    # As the README shows it: pyinfra shows what would change and waits for Enter.
    torn = output_of(pyinfra(INVENTORY, "teardown.py", "--limit", spark_2.name, typed=True))
    assert "Press enter to execute" in torn
    assert f"{spark_2.name}  torn down" in torn
    assert left_on(spark_2) == []
    # What the teardown leaves unless asked: the models, the driver's pin, the fabric profiles.
    kept = "ls -d /var/lib/spark/models /etc/apt/preferences.d/nvidia-driver-branch.pref"
    assert len(run_on(spark_2, kept).split()) == 2
    assert "fabric-enp1s0f1np1" in run_on(spark_2, "nmcli -g NAME connection show")
    # Compliance of the pair's inventory: spark-2's lanes and secrets are absent.
    code, table, output = compliance()
    assert code != 0
    found = not_passing(table)
    for check in ("lanes enabled, serving, in order", "lane secrets root 0600"):
        assert found[(spark_2.name, check)].startswith("FAIL"), output
        assert (spark_1.name, check) not in found, output

    alone = output_of(pyinfra(ALONE, "deploy.py"))
    assert f"{spark_1.name}  converged" in alone
    on_1 = left_on(spark_1)
    assert not [line for line in on_1 if "spark-ray" in line or "firewall" in line], on_1
    assert "table inet spark" not in on_1
    # Its lanes now: group_data's first and the README's model outside the catalog.
    assert {"container spark-lane-coder", "container spark-lane-small"} <= set(on_1)
    assert "container spark-lane-fast" not in on_1
    # The alone inventory's older toolkit (1.18.0-1), held ...
    assert toolkit(spark_1) == ("1.18.0-1", True)
    # Through the front with its key (a header read from stdin: the key in no argv).
    models = run_on(
        spark_1,
        'sudo sh -c \'printf "Authorization: Bearer %s" "$(cat /etc/spark/secrets/small.key)"'
        " | curl -s -H @- http://127.0.0.1:10103/v1/models'",
    )
    assert '"qwen3-0.6b"' in models, models

    again = output_of(pyinfra(INVENTORY, "deploy.py"))
    assert f"{spark_1.name}  converged" in again and f"{spark_2.name}  converged" in again
    # ... and group_data's newer one after it, held again: a newer toolkit is a raised
    # toolkit_version (docs/reference.md: "A newer container toolkit").
    assert toolkit(spark_1) == ("1.19.0-1", True)

"""Measure every lane of every box against the field's figures (issue 16), deliberately: it
loads each lane for about a minute, so deploy.py never runs it.

    pyinfra -y inventories/lab.py lane_bench.py [--limit HOST]      (or: make lane-bench)

On each box, for each lane it serves (a cluster lane on the head), one lane after the other, the
probe the deploy wrote (/usr/local/sbin/spark-lane-bench, templates/spark-lane-bench.j2) measures
the lane's vLLM on loopback and prints its table and a JSON line; the model catalog's figures
for the lane's model (spark/data/model-catalog.json) go with it. A lane that does not answer
fails on its box, saying why; the box's other lanes are measured all the same.
"""

# ruff: noqa: E402 - the check below must run before this collection's own modules are imported
import shlex
from pathlib import Path

from pyinfra import host, inventory, state
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations import server

COLLECTION = Path(__file__).resolve().parent
if Path.cwd().resolve() != COLLECTION:
    raise PyinfraError(
        f"start pyinfra in {COLLECTION} (cd there, or add --chdir {COLLECTION}): it reads"
        " group_data/ from the directory it starts in"
    )

from operations import lanes
from stages import settings

spark = settings.load(inventory)  # the deploy's own validation: the same lanes, ports and models
me = spark.host(host.name)
state.print_output = True  # the probe's tables are what this is run for

for lane in me.lanes:
    spec = lane.spec
    figures = spec.throughput.for_probe() if spec and spec.throughput else "{}"
    probe = [lanes.BENCH_COMMAND, lane.name, str(lane.backend_port), "--figures", figures]
    server.shell(
        name=f"Lane {lane.name}: throughput of {lane.served_name}",
        commands=[
            f"[ -x {lanes.BENCH_COMMAND} ] || {{ echo '{lanes.BENCH_COMMAND} is not on this"
            " box: deploy first'; exit 1; }; " + " ".join(shlex.quote(arg) for arg in probe)
        ],
        _continue_on_error=True,
    )

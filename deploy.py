"""Turn freshly imaged DGX Sparks (or one) into LLM servers: the story of a box.

    pyinfra inventories/lab.py deploy.py [--dry] [--limit HOST]

Every box's data is validated and its plan computed before any operation or fact reaches a
box (spark/inventory/, spark/plan.py; `make plan` prints the plans): a bad value stops the
run, naming the box and the key, and nothing is changed. Then each box goes through four
stages, each executing its part of the box's plan:

1. the host layer: dpkg whole, the 580 driver held and running, the container toolkit, hygiene;
2. the fabric: its twins cabled, configured at MTU 9000, their rates, RoCE entries and peers
   checked; the cluster environment file;
3. its own lanes and their front: the memory guard, each lane after the one before, nginx;
4. the cluster, with several boxes: the firewall, Ray or vLLM's own ranks, the NCCL test, the
   cluster lane. It needs every box: it comes after each box has done what it can alone;
5. on the router's box (and the failover's), the fleet's router, holding every lane's key;
   on every other box, a router left from an earlier deploy removed.
"""

# ruff: noqa: E402 - the check below must run before this collection's own modules are imported
from pathlib import Path

from pyinfra import host, inventory, state
from pyinfra.api.exceptions import PyinfraError

# pyinfra reads group_data/ from the directory it starts in, and imports this
# collection's modules from there: started anywhere else, the deploy would run on defaults
# nobody checked, so it refuses.
COLLECTION = Path(__file__).resolve().parent
if Path.cwd().resolve() != COLLECTION:
    raise PyinfraError(
        f"start pyinfra in {COLLECTION} (cd there, or add --chdir {COLLECTION}): it reads"
        " group_data/ from the directory it starts in, and without it the"
        " deploy would run on defaults nobody checked"
    )

from operations import asked
from stages import (
    ahead,
    cluster,
    deploy_file,
    detected,
    fabric,
    host_layer,
    lanes_front,
    router,
    run_summary,
    runmode,
    settings,
)

deploy_file.known_to_inspect(__file__)  # pyinfra's stack walk per operation finds it at once
run_summary.register(state)  # after the run, one line per box: converged, or where it stopped
fleet = settings.plan(inventory)  # every box's plan, computed once per run
box = fleet.box(host.name)
runmode.check(state)  # --serial, --no-wait, a small --parallel: refused for several boxes
asked.register(state)  # without -y: what change detection found unchanged is not asked again

# Every stage's questions said before the first stage runs (pyinfra's change detection runs each
# operation as its stage is prepared): a box with nothing to change is asked them in one command.
ahead.say_every_stage(box, fleet.fleet)

once = [detected.still_to_run]
host_layer.host_layer(box, _if=once)
fabric.fabric(box, _if=once)
lanes_front.lanes_and_front(box, _if=once)
cluster.cluster(box, _if=once)
router.fleet_router(box, fleet.fleet, _if=once)

# Clients reach a box at the address the inventory connects to.
run_summary.report_endpoints(state, settings.load(inventory).host(host.name), address=box.address)

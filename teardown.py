"""Take off a box everything the deploy put there, asking first.

    pyinfra inventories/lab.py teardown.py [--limit BOX] [--data teardown_driver=true]
        [--data teardown_fabric=true] [--data teardown_weights=true]

Without -y pyinfra shows, box by box, what would change and waits for Enter; with -y the run
needs --data teardown_confirm=true. stages/teardown.py says what goes and what stays (the driver
and toolkit holds and pins, the fabric's profiles and the models stay unless asked).
"""

from pyinfra import host, inventory, state

from stages import run_summary, settings
from stages.teardown import options, teardown_box

run_summary.register(state, "torn down")  # after the run, one line per box
# pyinfra asks before it acts only when it looks for changes first (without -y).
teardown_box(
    settings.plan(inventory).box(host.name),
    options(host.data.dict()),
    asked=state.should_check_for_changes(),
)

"""A run without -y asks each box its questions once: an operation pyinfra's change detection
ran to its end without a command is not run again at execution, while nothing has changed since.

pyinfra 3.10 runs an operation's generator twice in a run without -y: during change detection
(pyinfra/api/operation.py: ``_wrap_operation``, when ``State.check_for_changes``) and again at
execution (pyinfra/api/operations.py: ``_run_host_op``); every fact it reads runs its command
each time (pyinfra/api/facts.py: ``_get_fact``; pyinfra keeps no fact cache). A generator's path
is a function of the plan and of the answers it reads. When detection ran it to its end without
a command, and no operation of this run has changed anything since, execution would read the same
answers and yield nothing again. ``still_to_run`` is the stages' ``_if`` (pyinfra's own global
argument, evaluated at execution before the generator runs: operation.py ``command_generator``),
so such an operation ends "No changes" without asking anything again.

Whenever in doubt it runs the operation, as pyinfra does:

- with -y (no detection pass: nothing is known);
- where detection found the operation changing something on any box;
- once any operation of this run changed something or failed, on any box, or any box failed.

It looks at every box, not only this one: a box's answers can depend on another's (a peer
answering a ping over the fabric, the head holding the model a worker copies, the boxes a
cluster's operation finds stopped: operations/util.py ``missing``).
"""

from __future__ import annotations

from pyinfra import host, state

from operations import asked


def still_to_run() -> bool:
    """Whether the operation pyinfra is about to execute on this box must run (its ``_if``):
    False only when change detection found it changing nothing on every box and nothing has
    changed or failed since."""
    if not state.should_check_for_changes() or state.failed_hosts:
        return True
    op_hash = host.nested_executing_op_hash or host.executing_op_hash
    executed = asked.following(state)
    if op_hash is None or executed is None or executed.generation(state) > 0:
        return True
    # OperationMeta.will_change: what detection found (it runs the generator only without it).
    metas = [ops[op_hash].operation_meta for ops in state.ops.values() if op_hash in ops]
    return any(meta.will_change for meta in metas)

"""The parts of pyinfra's own objects that this collection reads beyond its documented API, each
checked by a test named after it, on a real run of the pinned pyinfra (its local connector:
tests/unit/local_run.py). operations/asked.py and stages/detected.py (the ask-once layer),
operations/util.py (a failed box's operation) and stages/run_summary.py (the table after the run)
read them; a pyinfra that moves one fails here by its name, before the layer quietly asks more or
reports less. CONTRIBUTING.md ("Moving the pyinfra pin") says what to do then.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback, State, StateStage
from pyinfra.context import ctx_host, ctx_state

from tests.unit.local_run import Run

REPO = Path(__file__).resolve().parents[2]
# The pyinfra whose internals this file was written against, read from its source
# (pyinfra/api/host.py, state.py, operation.py, operations.py).
READ_AT = "3.10.0"


@pytest.fixture(autouse=True)
def contexts_restored() -> Iterator[None]:
    """pyinfra's run stopped by "No hosts remaining!" leaves its state as the context's
    (pyinfra/context.py ``use`` restores only on a normal exit): the next test gets it back."""
    state, host = ctx_state.get(), ctx_host.get()
    yield
    ctx_state.set(state)
    ctx_host.set(host)


@operation()
def noting(seen: dict, fail: bool = False):
    """Notes what pyinfra's host says while this operation's generator runs; fails its box with
    ``fail``."""
    seen.setdefault("current", []).append(host.current_op_hash)
    seen.setdefault("executing", []).append(host.executing_op_hash)
    seen.setdefault("nested", []).append(host.nested_executing_op_hash)
    yield "false" if fail else "true"


class Noted(BaseStateCallback):
    """Each callback the layer overrides, with the arguments pyinfra passes it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def operation_host_success(self, state, host, op_hash, retry_count=0) -> None:
        self.calls.append(("success", host.name, op_hash, retry_count))

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0) -> None:
        self.calls.append(("error", host.name, op_hash, retry_count, max_retries))

    def host_disconnect(self, state, host) -> None:
        self.calls.append(("disconnect", host.name, state.current_stage))


def test_the_pinned_pyinfra_is_the_one_this_file_read() -> None:
    pinned = re.search(r"^pyinfra==(\S+)$", (REPO / "requirements.txt").read_text(), re.M)
    assert pinned is not None and pinned[1] == version("pyinfra") == READ_AT, (
        f"pyinfra pinned at {pinned and pinned[1]}, installed {version('pyinfra')}, read at"
        f" {READ_AT}: CONTRIBUTING.md, Moving the pyinfra pin"
    )


def test_host_current_op_hash_is_the_operation_whose_generator_runs(tmp_path: Path) -> None:
    # asked.py: an answer is given once per (pass, box, operation), this hash naming the last.
    seen: dict = {}
    run = Run(tmp_path, once=False)
    meta = run.add_plain(noting, seen=seen)
    run.execute()
    # Change detection runs the generator, then execution again: the same hash both times.
    assert seen["current"] == [meta._hash, meta._hash]
    assert run.host.current_op_hash is None  # and none outside it


def test_host_executing_op_hash_is_the_operation_executing(tmp_path: Path) -> None:
    # detected.py: the operation whose _if pyinfra evaluates (nested_executing_op_hash inside
    # another operation's, None here).
    seen: dict = {}
    run = Run(tmp_path, once=False)
    meta = run.add_plain(noting, seen=seen)
    run.execute()
    assert seen["executing"] == [None, meta._hash]  # not during detection, then this one
    assert seen["nested"] == [None, None]
    assert (run.host.executing_op_hash, run.host.nested_executing_op_hash) == (None, None)


def test_state_ops_holds_each_boxs_operation_meta_by_hash(tmp_path: Path) -> None:
    # detected.py reads what detection found (will_change) there; util.failed_operation, a
    # failed operation's output.
    run = Run(tmp_path, once=False)
    meta = run.add_plain(noting, seen={}, fail=True)
    assert run.state.ops[run.host][meta._hash].operation_meta is meta
    assert meta.will_change is True  # detection ran the generator: it yields a command
    assert run.state.get_op_data_for_host(run.host, meta._hash).operation_meta is meta
    assert run.state.get_op_order() == [meta._hash]
    assert run.state.get_op_meta(meta._hash).names == {
        "test_pyinfra_internals.noting"
    }  # module.operation, unnamed
    with pytest.raises(PyinfraError, match="No hosts remaining!"):  # its only box failed
        run.execute()
    assert (meta.is_complete(), meta.did_succeed(), meta.did_change()) == (True, False, False)
    assert (meta.stdout_lines, meta.stderr_lines) == ([], [])


def test_state_should_check_for_changes_is_false_with_yes(tmp_path: Path) -> None:
    # detected.still_to_run: with -y there is no detection, nothing is known.
    assert Run(tmp_path, once=False).state.should_check_for_changes() is True
    assert Run(tmp_path, yes=True).state.should_check_for_changes() is False


def test_state_callback_handlers_lists_the_handlers_added(tmp_path: Path) -> None:
    # asked.following and run_summary.register find their handler there.
    run = Run(tmp_path)
    noted = Noted()
    run.state.add_callback_handler(noted)
    assert run.state.callback_handlers[-1] is noted


def test_state_callbacks_are_called_with_the_arguments_asked_takes(tmp_path: Path) -> None:
    # asked.Asked counts changes from operation_host_success and _error; the summaries print
    # from host_disconnect. Their signatures are pyinfra's BaseStateCallback's.
    for name, parameters in (
        ("operation_host_success", ["state", "host", "op_hash", "retry_count"]),
        ("operation_host_error", ["state", "host", "op_hash", "retry_count", "max_retries"]),
        ("host_disconnect", ["state", "host"]),
    ):
        said = list(inspect.signature(getattr(BaseStateCallback, name)).parameters)
        assert said == parameters, name
    run = Run(tmp_path, yes=True)
    noted = Noted()
    run.state.add_callback_handler(noted)
    passing = run.add_plain(noting, seen={})
    failing = run.add_plain(noting, seen={}, fail=True)
    # Its only box failed: pyinfra stops the run in Execute (run_summary prints from there).
    with pytest.raises(PyinfraError, match="No hosts remaining!"):
        run.execute()
    assert noted.calls == [
        ("success", "@local", passing._hash, 0),
        ("error", "@local", failing._hash, 0, 0),
    ]
    assert run.state.failed_hosts == {run.host}
    assert run.state.current_stage is StateStage.Execute


def test_the_profiles_phases_are_pyinfras_functions_run_calls() -> None:
    # bench/profile_run.py reads each phase's CPU from these functions' cumulative time.
    from pyinfra.api import connect, operations
    from pyinfra_cli import cli, inventory, util

    from bench import profile_run

    functions = {
        "pyinfra_cli/inventory.py": inventory.make_inventory,
        "pyinfra/api/connect.py": connect.connect_all,
        "pyinfra_cli/util.py": util.load_deploy_file,
        "pyinfra/api/operations.py": operations.run_ops,
    }
    assert list(profile_run.PHASES.values()) == [
        (path, function.__name__) for path, function in functions.items()
    ]
    for path, function in functions.items():
        assert function.__code__.co_filename.endswith(path)
    # The command line calls them, in this order (deploy.py's loading by way of a helper).
    main = inspect.getsource(cli._main)
    calls = ["make_inventory(", "connect_all(", "_handle_commands(", "run_ops("]
    assert sorted(calls, key=main.find) == calls and -1 not in map(main.find, calls)
    assert "load_deploy_file(state, filename)" in inspect.getsource(cli._prepare_deploy_operations)


def test_each_operation_call_walks_its_stack_through_inspect() -> None:
    # stages/deploy_file.py: pyinfra reads every frame's source line for each operation, which
    # asks inspect.getmodule for the frame's module (the walk deploy.py is registered for).
    from pyinfra.api import util
    from pyinfra.api.operation import solve_operation_consistency

    called = inspect.getsource(solve_operation_consistency)  # for each operation a box is given
    assert "op_order = get_operation_order_from_stack(state)" in called
    walk = inspect.getsource(util.get_operation_order_from_stack)
    assert "stack()" in walk and "getframeinfo(" in walk


def test_the_deploy_file_runs_under_the_name_pyinfra_is_given(tmp_path: Path) -> None:
    # pyinfra_cli/util.py exec_file: its frames' file is the name given, which is its __file__
    # (what deploy.py registers).
    from pyinfra_cli.util import exec_file

    deploy = tmp_path / "a_deploy.py"
    deploy.write_text("import sys\nframe_file = sys._getframe().f_code.co_filename\n")
    with ctx_state.use(State()):
        ran = exec_file(str(deploy), return_locals=True)
    assert ran["__file__"] == str(deploy)
    assert ran["frame_file"] == str(deploy)

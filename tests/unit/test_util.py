"""operations/util.py: the pieces several operations share."""

from __future__ import annotations

import hashlib
from io import StringIO
from types import SimpleNamespace

import pytest
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_host, ctx_state
from pyinfra.operations import files

from operations import util
from tests.unit.harness import (
    Box,
    FakeHost,
    captured,
    file_facts,
    refusal,
    run_op,
    run_state,
)


def test_a_unit_written_anew_is_reloaded_enabled_and_restarted() -> None:
    assert util.unit_started(
        "x.service", unit_changed=True, enabled=None, running=False, changed=True
    ) == ["systemctl daemon-reload", "systemctl enable x.service", "systemctl restart x.service"]


def test_a_stopped_unit_is_started_and_a_running_one_as_written_left_alone() -> None:
    stopped = util.unit_started(
        "x.service", unit_changed=False, enabled="enabled", running=False, changed=False
    )
    assert stopped == ["systemctl start x.service"]
    assert (
        util.unit_started(
            "x.service", unit_changed=False, enabled="enabled", running=True, changed=False
        )
        == []
    )


def test_own_start_and_restart_commands() -> None:
    kwargs = {"unit_changed": False, "enabled": "enabled", "start": "go", "restart": "again"}
    assert util.unit_started("x.service", running=False, changed=False, **kwargs) == ["go"]
    assert util.unit_started("x.service", running=True, changed=True, **kwargs) == ["again"]


@pytest.mark.parametrize(
    ("capeff", "capability", "held"),
    [("000001ffffffffff", 24, True), ("00000000a80425fb", 24, False), ("", 24, False)],
)
def test_has_capability(capeff: str, capability: int, held: bool) -> None:
    # 000001ffffffffff: root on a host; 00000000a80425fb: docker's default set (hand-written).
    assert util.has_capability(capeff, capability) is held


def test_container_rights() -> None:
    assert util.container_rights({"rdma": "", "capeff": "000001ffffffffff"}) == {
        "rdma": True,
        "unlimited_memlock": True,
    }
    assert util.container_rights({}) == {"rdma": False, "unlimited_memlock": False}


def test_docker_run_adds_memlock_and_devices_where_the_box_has_them() -> None:
    assert util.docker_run("c", ["--x", "1"], rdma=False, unlimited_memlock=False) == [
        "/usr/bin/docker", "run", "--rm", "--name", "c", "--gpus", "all",
        "--network", "host", "--ipc", "host", "--x", "1",
    ]  # fmt: skip
    full = util.docker_run("c", [], rdma=True, unlimited_memlock=True)
    assert full[-4:] == ["--ulimit", "memlock=-1", "--device", "/dev/infiniband"]


def test_template_is_root_owned_and_empty_when_the_file_is_as_rendered() -> None:
    dest = "/etc/x.conf"
    written = SimpleNamespace(_inner=lambda: util.template("logind-removeipc.conf.j2", dest))
    host = FakeHost(file_facts({dest: None}))
    commands = run_op(written, host=host)
    assert commands[0].startswith("FileUploadCommand(") and dest in commands[0]
    assert any("chown root:root" in command for command in commands)
    # The template's text, written out: a file that reads so is as rendered.
    rendered = (
        "# Managed by pyinfra (operations/hygiene.py): the deploy rewrites this file.\n"
        "# logind's default RemoveIPC=yes removes a user's System V and POSIX IPC objects"
        " (semaphores,\n# shared memory) when their last session ends, which hangs a Ray/vLLM"
        " worker started from it.\n[Login]\nRemoveIPC=no\n"
    )
    assert host.uploads[dest] == rendered
    assert run_op(written, host=FakeHost(file_facts({dest: rendered}))) == []


def test_template_renders_as_pyinfras_files_template() -> None:
    # The text pyinfra's own files.template would write, and util.template's, for a file absent.
    dest, name = "/etc/x.env", "cluster.env.j2"
    variables = {"variables": [("A", "1", None), ("B", "'two words'", "a note")]}
    theirs = SimpleNamespace(
        _inner=lambda: files.template._inner(
            src=str(util.TEMPLATES / name), dest=dest, user="root", group="root", **variables
        )
    )
    ours = SimpleNamespace(_inner=lambda: util.template(name, dest, **variables))
    pyinfras, own = FakeHost(file_facts({dest: None})), FakeHost(file_facts({dest: None}))
    run_op(theirs, host=pyinfras)
    run_op(ours, host=own)
    assert own.uploads[dest] == pyinfras.uploads[dest] and "two words" in own.uploads[dest]


def test_root_files_reads_owner_group_mode_and_sha1_of_each_path_in_one_answer() -> None:
    # host-rootfiles-debian-version-apt.txt: RootFiles' command for /etc/debian_version and
    # /etc/apt (a directory), run on the development machine (Debian 12).
    fact = util.RootFiles()
    fact.command(("/etc/debian_version", "/etc/apt", "/etc/none"))
    lines = captured("host-rootfiles-debian-version-apt.txt").splitlines()
    assert fact.process(lines) == {
        "/etc/debian_version": {
            "user": "root",
            "group": "root",
            "mode": "644",
            "sha1": "c791f7c21e07224d1277523ba1ab7ccb0d14ce72",
        },
        "/etc/apt": None,  # not a regular file
        "/etc/none": None,  # no line for it: not known, left to pyinfra's files.put
    }
    # A line that does not read as owner, group, mode and SHA-1: not known either.
    assert fact.process(["/etc/debian_version\troot 644 c791f7c2"])["/etc/debian_version"] is None


def test_a_file_as_it_should_be_costs_one_question() -> None:
    # Only RootFiles answers: files.put's own facts would fail the test as unexpected.
    dest, text = "/etc/x.conf", "a = 1\n"
    digest = hashlib.sha1(text.encode()).hexdigest()
    host = FakeHost({util.RootFiles: f"{dest}\troot root 600 {digest}"})
    written = SimpleNamespace(_inner=lambda: util.put(StringIO(text), dest, "600"))
    assert run_op(written, host=host) == []
    assert host.noops == [f"file {dest} is already uploaded"]


@pytest.mark.parametrize(("mode", "text"), [("644", "a = 2\n"), ("600", "a = 1\n")])
def test_a_file_not_as_it_should_be_is_left_to_pyinfras_files_put(mode: str, text: str) -> None:
    # On the box: root:root 0644 holding ``text`` (file_facts answers RootFile the same way).
    dest = "/etc/x.conf"
    written = SimpleNamespace(_inner=lambda: util.put(StringIO("a = 1\n"), dest, mode))
    host = FakeHost(file_facts({dest: text}))
    commands = run_op(written, host=host)
    if text == "a = 1\n":  # the text is right, the mode is not
        assert commands == [f"chmod 600 {dest}"]
    else:
        assert commands[0].startswith("FileUploadCommand(") and host.uploads[dest] == "a = 1\n"


# --- a box stopped on its own problem, and where another box stopped ---------------------------


def refused_in(stage: SimpleNamespace, message: str) -> tuple[list[str], list[str]]:
    """The commands util.refused yields in a run at this stage, and what it logged."""
    logged: list[str] = []
    host = FakeHost({})
    host.log = lambda text, log_func=None: logged.append(text)  # type: ignore[method-assign]
    with ctx_state.use(stage), ctx_host.use(host):
        return list(util.refused(message)), logged


def test_a_refusal_is_one_command_that_prints_the_message_and_fails() -> None:
    # Quotes, a line break and shell words stay text: sh prints them as given and exits 1.
    message = "spark-test: it's $(broken)\n  a table's line; `x`"
    commands, logged = refused_in(run_state(), message)
    assert refusal(commands) == message
    # While the operations run, the failed command says it (pyinfra prints its stderr).
    assert logged == []


def test_before_the_run_a_refusal_is_logged_too() -> None:
    # pyinfra's change detection and --dry run no command: the message is logged then.
    prepare = SimpleNamespace(is_executing=False, failed_hosts=[])
    commands, logged = refused_in(prepare, "spark-test: port 10101 is taken")
    assert logged == ["would stop here: spark-test: port 10101 is taken"]
    assert refusal(commands) == "spark-test: port 10101 is taken"


def test_where_a_box_stopped_is_its_failed_operation_and_the_first_line_it_said() -> None:
    stopped = {
        "spark-2": ("Lanes and front | Lane coder", "spark-2: port 10101 is taken\nsecond line"),
        "spark-3": None,  # never reached
    }
    run = run_state(stopped)
    spark_2, spark_3 = run.failed_hosts
    assert util.stopped_at(run, spark_2) == "Lanes and front | Lane coder: port 10101 is taken"
    assert util.stopped_at(run, spark_3) == "connecting: not reached (pyinfra's error above)"


def test_a_failed_command_that_said_nothing_on_stderr_is_named_by_its_last_stdout_line() -> None:
    meta = OperationMeta("op0", is_change=True)
    output = [OutputLine("stdout", "E: first"), OutputLine("stdout", "E: Unable to locate x")]
    meta.set_complete(False, ["apt-get install x"], CommandOutput(output))
    done = OperationMeta("op1", is_change=True)
    done.set_complete(True, ["true"], CommandOutput([]))
    box = Box("spark-1")
    run = SimpleNamespace(
        ops={box: {"op0": SimpleNamespace(operation_meta=meta)}},
        get_op_order=lambda: ["op0", "op1"],
        get_op_meta=lambda op_hash: SimpleNamespace(names={"apt"}),
    )
    assert util.stopped_at(run, box) == "apt: E: Unable to locate x"
    meta = OperationMeta("op0", is_change=True)
    meta.set_complete(False, ["false"], CommandOutput([]))
    run.ops[box]["op0"] = SimpleNamespace(operation_meta=meta)
    assert util.stopped_at(run, box) == "apt: a command failed"


def test_missing_names_the_other_stopped_boxes_of_those_asked_and_waits_for_says_where() -> None:
    stopped = {
        "spark-4": ("Cluster | Ray", "spark-4: the image has no Ray"),
        "spark-1": ("Host layer | Driver", "spark-1: driver 590 loaded"),
        "spark-9": None,  # another cluster's box
    }
    host = FakeHost({})
    host.name = "spark-1"  # this box: never waits for itself
    with ctx_state.use(run_state(stopped)), ctx_host.use(host):
        missing = util.missing(["spark-1", "spark-2", "spark-4"])
        assert missing == {"spark-4": "Cluster | Ray: the image has no Ray"}
        assert util.missing(["spark-2"]) == {}
    both = {"spark-2": "connecting: not reached", "spark-4": "Cluster | Ray: no Ray"}
    assert util.waits_for(both) == (
        "waits for spark-2, stopped at connecting: not reached; waits for spark-4, stopped at"
        " Cluster | Ray: no Ray"
    )

"""operations/util.py: the pieces several operations share."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from operations import util
from tests.unit.harness import FakeHost, file_facts, run_op


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
    same = FakeHost(file_facts({dest: host.uploads[dest]}))
    assert run_op(written, host=same) == []

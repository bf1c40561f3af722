"""Host hygiene: logind keeps IPC, the running sshd is spared by the OOM killer.

Captures:
- lab-sshd-oom-no-cap-sys-resource.txt: SshdOomScore's command on lab host spark-2 (Debian 12 in
  systemd-nspawn on a machine whose capability bounding set lacks CAP_SYS_RESOURCE): sshd could
  not lower its own score there.
- lab-logind-running-{remove,keep}.txt: LogindRunningRemoveIpc's command on lab host spark-2
  freshly reimaged (logind's default, RemoveIPC=yes) and on spark-1 after a deploy.
- sshd-oom-*.sample.txt: written by hand in the same "<pid> <oom_score_adj> <CapEff>" line, with
  a root shell's full capability set; the command itself runs below against a stand-in systemctl.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from operations import hygiene
from tests.unit.harness import FakeHost, captured, file_facts, process, refusal, run_op

DROP_IN = "/etc/systemd/logind.conf.d/spark-keep-ipc.conf"
RESTART = (
    "systemctl reload-or-restart systemd-logind.service"
    " || { sleep 2; systemctl is-active --quiet systemd-logind.service; }"
)
LOGIND = hygiene.LogindRemoveIpc
RUNNING = hygiene.LogindRunningRemoveIpc


def logind_host(
    drop_in: str | None,
    config: str = "lab-logind-cat-config.txt",
    running: str = "lab-logind-running-keep.txt",
) -> FakeHost:
    facts = {LOGIND: captured(config), RUNNING: captured(running)}
    return FakeHost(file_facts({DROP_IN: drop_in}) | facts)


def drop_in_text() -> str:
    host = logind_host(None)
    run_op(hygiene.logind_keep_ipc, host=host)
    return host.uploads[DROP_IN]


def test_fresh_host_gets_the_drop_in_and_logind_rereads_it() -> None:
    host = logind_host(None)
    commands = run_op(hygiene.logind_keep_ipc, host=host)
    assert commands[0].startswith("FileUploadCommand(") and DROP_IN in commands[0]
    assert commands[-1] == RESTART
    assert host.uploads[DROP_IN].endswith("\n[Login]\nRemoveIPC=no\n")


def test_drop_in_in_place_yields_nothing() -> None:
    host = logind_host(drop_in_text())
    assert run_op(hygiene.logind_keep_ipc, host=host) == []


def test_drop_in_in_place_but_logind_not_on_it_gets_the_reload() -> None:
    # A run cut off between writing the drop-in and the reload leaves the box so.
    host = logind_host(drop_in_text(), running="lab-logind-running-remove.txt")
    assert run_op(hygiene.logind_keep_ipc, host=host) == [RESTART]


def test_running_logind_fact() -> None:
    assert process(RUNNING, captured("lab-logind-running-remove.txt")) is True
    assert process(RUNNING, captured("lab-logind-running-keep.txt")) is False
    assert process(RUNNING, "") is None  # logind does not answer: nothing to reload
    assert RUNNING().command().endswith("2>/dev/null || true")


def test_an_edited_drop_in_is_rewritten_and_reread() -> None:
    host = logind_host("[Login]\nRemoveIPC=yes\n")
    commands = run_op(hygiene.logind_keep_ipc, host=host)
    assert commands[0].startswith("FileUploadCommand(") and commands[-1] == RESTART


def test_logind_fact_reads_each_setting_with_its_file() -> None:
    # Captured on lab host spark-2 (systemd 252) after a deploy, with a later drop-in added.
    assert process(LOGIND, captured("lab-logind-cat-config-overridden.txt")) == [
        (DROP_IN, "no"),
        ("/etc/systemd/logind.conf.d/zz-local.conf", "yes"),
    ]
    assert process(LOGIND, captured("lab-logind-cat-config.txt")) == [(DROP_IN, "no")]
    assert process(LOGIND, "") == []


def test_a_later_drop_in_turning_removeipc_back_on_is_refused_by_name() -> None:
    host = logind_host(drop_in_text(), "lab-logind-cat-config-overridden.txt")
    assert re.search(
        r"spark-test: .*zz-local\.conf sets RemoveIPC=yes",
        refusal(run_op(hygiene.logind_keep_ipc, host=host)),
    )


def test_on_a_fresh_host_a_drop_in_named_to_be_read_later_is_refused_too() -> None:
    fresh = "# /etc/systemd/logind.conf\n[Login]\n\n# /etc/systemd/logind.conf.d/zz.conf\n"
    host = FakeHost(file_facts({DROP_IN: None}) | {LOGIND: fresh + "[Login]\nRemoveIPC=yes\n"})
    assert re.search(
        r"zz\.conf sets RemoveIPC=yes", refusal(run_op(hygiene.logind_keep_ipc, host=host))
    )
    earlier = fresh.replace("zz.conf", "10-vendor.conf") + "[Login]\nRemoveIPC=yes\n"
    host = FakeHost(file_facts({DROP_IN: None}) | {LOGIND: earlier})
    assert run_op(hygiene.logind_keep_ipc, host=host)[-1] == RESTART


def test_sshd_oom_score_fact() -> None:
    assert process(hygiene.SshdOomScore, captured("sshd-oom-protected.sample.txt")) == {
        "pid": 812,
        "oom_score_adj": -1000,
        "can_lower": True,
    }
    lab = process(hygiene.SshdOomScore, captured("lab-sshd-oom-no-cap-sys-resource.txt"))
    assert lab == {"pid": 59, "oom_score_adj": 0, "can_lower": False}
    assert process(hygiene.SshdOomScore, "") is None


@pytest.mark.parametrize("main_pid", ["self", "0", "garbage"])
def test_sshd_oom_score_command_with_a_stand_in_systemctl(main_pid: str, tmp_path: Path) -> None:
    pid = str(os.getpid()) if main_pid == "self" else main_pid
    systemctl = tmp_path / "systemctl"
    asked = "show -p MainPID --value ssh.service"
    systemctl.write_text(f'#!/bin/sh\n[ "$*" = "{asked}" ] && echo {pid}\n')
    systemctl.chmod(0o755)
    command = hygiene.SshdOomScore().command(unit="ssh.service")
    result = subprocess.run(
        ["sh", "-c", command],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    if main_pid == "self":
        score = int(Path("/proc/self/oom_score_adj").read_text())
        status = Path("/proc/self/status").read_text()
        capabilities = int(status.split("CapEff:")[1].split()[0], 16)
        assert process(hygiene.SshdOomScore, result.stdout) == {
            "pid": int(pid),
            "oom_score_adj": score,
            "can_lower": bool(capabilities & 1 << 24),
        }
    else:
        assert result.stdout == "" and result.stderr == ""


def test_protected_sshd_yields_nothing() -> None:
    host = FakeHost({hygiene.SshdOomScore: captured("sshd-oom-protected.sample.txt")})
    assert run_op(hygiene.sshd_oom_protected, host=host) == []
    assert host.noops == ["sshd (812) is protected from the OOM killer"]


def test_unprotected_sshd_is_protected_in_place_without_a_restart() -> None:
    host = FakeHost({hygiene.SshdOomScore: captured("sshd-oom-unprotected.sample.txt")})
    assert run_op(hygiene.sshd_oom_protected, host=host) == ["echo -1000 > /proc/812/oom_score_adj"]


def test_where_no_score_can_be_lowered_it_is_left_alone() -> None:
    host = FakeHost({hygiene.SshdOomScore: captured("lab-sshd-oom-no-cap-sys-resource.txt")})
    assert run_op(hygiene.sshd_oom_protected, host=host) == []
    assert host.noops == ["no CAP_SYS_RESOURCE here (a container?): sshd (59) stays as it is"]


def test_no_running_sshd_yields_nothing() -> None:
    host = FakeHost({hygiene.SshdOomScore: ""})
    assert run_op(hygiene.sshd_oom_protected, host=host) == []
    assert "ssh.service has no running sshd" in host.noops[0]

"""Waiting in the lab (waits.until) and the lab's waits built on it: one slow answer is no
failure, only the deadline is. No lab needed: the answers are given here (ssh's words as
OpenSSH's ssh prints them, written by hand)."""

from __future__ import annotations

import subprocess
import urllib.error

import pytest

from tests.simlab import lab
from tests.simlab.waits import patiently, until


def answers(*given: object):
    """An answer function giving ``given`` in turn, raising those that are exceptions."""
    left = list(given)

    def answer() -> object:
        found = left.pop(0)
        if isinstance(found, BaseException):
            raise found
        return found

    return answer


def test_an_answer_that_does_not_come_is_asked_again() -> None:
    slow = subprocess.TimeoutExpired(["ssh", "spark-1"], 60)
    got = until(answers(slow, ConnectionRefusedError(111, "refused"), "", "running"), 60, "up",
                every=0)  # fmt: skip
    assert got == "running"


def test_the_deadline_fails_the_wait_naming_what_and_the_last_answer() -> None:
    with pytest.raises(TimeoutError, match=r"^spark-1 up: not within 0 s \(last answer: ''\)$"):
        until(answers(""), 0, "spark-1 up", every=0)
    refused = ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(TimeoutError, match=r"last answer: ConnectionRefusedError: \[Errno 111\]"):
        until(answers(refused), 0, "spark-1 up", every=0)


def test_a_hopeless_wait_fails_at_once() -> None:
    with pytest.raises(RuntimeError, match=r"^hub: exited: no port \(last answer: False\)$"):
        until(answers(False), 60, "hub", every=0, hopeless=lambda: "exited: no port")


def test_errors_not_retried_go_through() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        until(answers(subprocess.TimeoutExpired(["ssh"], 1)), 60, "x", every=0, retried=())


def test_a_request_that_timed_out_is_sent_again_and_any_other_answer_is_the_answer() -> None:
    slow = urllib.error.URLError(TimeoutError("timed out"))
    assert patiently(answers(slow, TimeoutError("read"), (200, "")), 60, "/health") == (200, "")
    assert patiently(answers(None), 60, "/health") is None  # an answer, though falsy
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    with pytest.raises(urllib.error.URLError, match="Connection refused"):
        patiently(answers(refused), 60, "/health")
    with pytest.raises(TimeoutError, match=r"^/health: an answer in time: not within 0 s"):
        patiently(answers(subprocess.TimeoutExpired(["curl"], 20)), 0, "/health")


HOST = lab.Host(name="spark-1", index=1)


def ssh_said(monkeypatch: pytest.MonkeyPatch, *said: tuple[int, str, str]) -> list[list[str]]:
    """lab.ssh's ssh runs answering ``said`` (returncode, stdout, stderr) in turn; the
    commands it ran."""
    ran: list[list[str]] = []
    left = list(said)

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        code, out, err = left.pop(0)
        return subprocess.CompletedProcess(argv, code, out, err)

    monkeypatch.setattr(lab.subprocess, "run", run)
    monkeypatch.setattr(lab.time, "sleep", lambda _: None)
    return ran


def test_ssh_tries_a_connection_again_that_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = ssh_said(
        monkeypatch,
        (255, "", "ssh: connect to host 10.77.0.11 port 22: Connection timed out\n"),
        (255, "", "Connection timed out during banner exchange\n"),
        (0, "running\n", ""),
    )
    assert lab.ssh(HOST, "systemctl is-system-running") == "running\n"
    assert len(ran) == 3


def test_ssh_never_runs_a_command_again_whose_session_began(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran = ssh_said(monkeypatch, (255, "", "Connection to 10.77.0.11 closed by remote host.\n"))
    assert lab.ssh(HOST, "sudo systemctl reboot", check=False) == ""
    assert len(ran) == 1


def test_a_boot_whose_first_answer_did_not_come_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The CI run's failure: one ssh timeout on a loaded machine while systemd inside already
    # said "running" was taken for a boot that locked the admin out.
    said = iter(["", "running\n"])
    monkeypatch.setattr(lab, "ssh", lambda *_, **__: next(said))
    monkeypatch.setattr(lab, "inside", lambda *_: "running\n")
    monkeypatch.setattr(lab.time, "sleep", lambda _: None)
    lab.wait_ready(HOST, lab.time.monotonic() + 60)


def test_a_boot_that_never_lets_the_admin_in_says_so_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lab, "ssh", lambda *_, **__: "")
    monkeypatch.setattr(lab, "inside", lambda _, command: "running\n")
    monkeypatch.setattr(lab, "console", lambda _: "")
    with pytest.raises(RuntimeError, match=r"^spark-1: booted, but the admin's ssh fails:"):
        lab.wait_ready(HOST, lab.time.monotonic())


def test_a_boot_still_starting_is_up_only_when_its_end_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A boot held up by a unit that may take hours (a fetch after a reboot): `systemctl
    is-system-running` says "starting" (systemctl(1)); asked without --wait, that is up when
    the boot's end is not waited for, and not up when it is."""
    asked: list[str] = []

    def ssh(_host: object, command: str, **_: object) -> str:
        asked.append(command)
        return "starting\n"

    monkeypatch.setattr(lab, "ssh", ssh)
    monkeypatch.setattr(lab, "inside", lambda *_: "starting\n")
    monkeypatch.setattr(lab, "console", lambda _: "")
    monkeypatch.setattr(lab.time, "sleep", lambda _: None)
    lab.wait_ready(HOST, lab.time.monotonic() + 60, finished=False)
    assert asked == ["systemctl is-system-running"]
    with pytest.raises(RuntimeError, match=r"^spark-1: did not come up"):
        lab.wait_ready(HOST, lab.time.monotonic())

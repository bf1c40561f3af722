"""Settings the field learned the hard way: logind RemoveIPC, sshd OOM protection."""

from __future__ import annotations

import posixpath
import re
import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import util
from operations.asked import Question, answer, question
from operations.util import CAP_SYS_RESOURCE

OOM_PROTECTED = -1000  # the OOM killer never picks the process

LOGIND_DROPIN = "/etc/systemd/logind.conf.d/spark-keep-ipc.conf"
SSHD = "ssh.service"


class LogindRemoveIpc(FactBase):
    """Every RemoveIPC= setting logind reads, in the order it reads them, with its file.

    .. code:: python

        [("/etc/systemd/logind.conf.d/spark-keep-ipc.conf", "no")]
    """

    default = list

    def command(self) -> str:
        return "systemd-analyze cat-config systemd/logind.conf 2>/dev/null || true"

    def process(self, output: list[str]) -> list[tuple[str, str]]:
        settings, current = [], ""
        for line in output:
            if line.startswith("# /"):  # cat-config heads each file with its path
                current = line[2:].strip()
            elif match := REMOVE_IPC.match(line):
                settings.append((current, match.group(1)))
        return settings


REMOVE_IPC = re.compile(r"^\s*RemoveIPC\s*=\s*(\S*)")


class LogindRunningRemoveIpc(FactBase):
    """Whether the running logind removes a logged-out user's IPC objects (its RemoveIPC
    property on D-Bus); None when logind does not answer.

    .. code:: python

        False
    """

    def command(self) -> str:
        return (
            "busctl get-property org.freedesktop.login1 /org/freedesktop/login1"
            " org.freedesktop.login1.Manager RemoveIPC 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> bool | None:
        value = output[0].strip() if output else ""
        return {"b true": True, "b false": False}.get(value)


def _read_after(settings: list[tuple[str, str]], path: str) -> list[tuple[str, str]]:
    """The settings logind reads after our drop-in: drop-ins are read in the order of their
    file names, whichever directory holds them (systemd.syntax(7))."""
    files = [file for file, _value in settings]
    if path in files:
        return settings[len(files) - files[::-1].index(path) :]
    name = posixpath.basename(path)
    return [(f, v) for f, v in settings if ".conf.d/" in f and posixpath.basename(f) > name]


@operation()
def logind_keep_ipc(path: str = LOGIND_DROPIN):
    """
    Keep a user's IPC objects when their last session ends (logind ``RemoveIPC=no``).

    + path: the logind.conf drop-in

    logind reads it when it starts: when the drop-in changed, or the running logind still removes
    IPC (a run cut off between the two leaves it so), logind is reloaded where it supports
    that, restarted otherwise (an Xorg session on the box may not survive a logind restart:
    systemd/systemd#18484; Wayland sessions and SSH logins do).
    """
    later = _read_after(answer(LogindRemoveIpc), path)
    if later and later[-1][1] != "no":
        file, value = later[-1]
        yield from util.refused(
            f"{host.name}: {file} sets RemoveIPC={value} and is read after {path}, so logind"
            " would remove a logged-out worker's semaphores (a hung Ray/vLLM cluster): remove"
            " that setting, then run the deploy again"
        )
        return
    changes = util.template("logind-removeipc.conf.j2", path)
    yield from changes
    if changes or answer(LogindRunningRemoveIpc):
        # A restart whose first start fails (seen in containers: status 219/CGROUP) is retried
        # by the unit itself (Restart=always): what counts is logind running on the new file.
        yield (
            "systemctl reload-or-restart systemd-logind.service"
            " || { sleep 2; systemctl is-active --quiet systemd-logind.service; }"
        )


class SshdOomScore(FactBase):
    """The main PID of the sshd unit, its oom_score_adj, and whether this (root) shell may lower
    it (CAP_SYS_RESOURCE, which a container may lack); None when the unit has no process.

    .. code:: python

        {"pid": 812, "oom_score_adj": -1000, "can_lower": True}
    """

    def command(self, unit: str) -> str:
        return (
            f"pid=$(systemctl show -p MainPID --value {shlex.quote(unit)} 2>/dev/null)"
            ' && [ "${pid:-0}" -gt 0 ] 2>/dev/null'
            ' && echo "$pid $(cat /proc/$pid/oom_score_adj)'
            " $(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)\" || true"
        )

    def process(self, output: list[str]) -> dict[str, int | bool] | None:
        fields = output[0].split() if output else []
        if len(fields) != 3:
            return None
        pid, score, capabilities = fields
        return {
            "pid": int(pid),
            "oom_score_adj": int(score),
            "can_lower": util.has_capability(capabilities, CAP_SYS_RESOURCE),
        }


@operation()
def sshd_oom_protected(unit: str = SSHD):
    """
    Make sure the OOM killer spares the sshd that accepts logins, so a box that ran out of
    memory can still be reached.

    + unit: sshd's unit (Debian and Ubuntu: ssh.service; Ubuntu 24.04 starts it through
      ssh.socket on the first connection, so it runs once anyone, pyinfra too, has logged in)

    OpenSSH on Linux sets its listener to -1000 itself when it starts and gives each login the
    score sshd inherited; so this writes -1000 to the running listener only when it is not there.
    Where nothing may lower a score (a container without CAP_SYS_RESOURCE) it leaves it, as sshd
    and systemd do. It deliberately does not set ``OOMScoreAdjust=-1000`` on the unit: sshd would
    then inherit -1000 and hand it to every login, making whatever is started over SSH (a vLLM
    or Ray run from a shell) unkillable by the OOM killer, which would then kill docker and the
    serving containers, or panic, instead.
    """
    sshd = answer(SshdOomScore, unit=unit)
    if sshd is None:
        host.noop(f"{unit} has no running sshd: it protects itself when it starts")
    elif sshd["oom_score_adj"] == OOM_PROTECTED:
        host.noop(f"sshd ({sshd['pid']}) is protected from the OOM killer")
    elif not sshd["can_lower"]:
        # As systemd does with OOMScoreAdjust= there: nothing can lower a score, so none is.
        host.noop(f"no CAP_SYS_RESOURCE here (a container?): sshd ({sshd['pid']}) stays as it is")
    else:
        yield f"echo {OOM_PROTECTED} > /proc/{sshd['pid']}/oom_score_adj"


def questions() -> list[Question]:
    """What ``logind_keep_ipc`` and ``sshd_oom_protected`` read (operations/asked.py)."""
    return [
        question(LogindRemoveIpc),
        question(util.RootFiles, paths=(LOGIND_DROPIN,)),
        question(LogindRunningRemoveIpc),
        question(SshdOomScore, unit=SSHD),
    ]

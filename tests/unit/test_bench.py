"""The benchmark's counting and reporting (bench/run.py), on what the lab's hosts and pyinfra
really wrote; nothing here is timed.

Captures: lab-bench-sshd-journal.txt is spark-2's sshd journal (LogLevel VERBOSE, ``journalctl -o
cat _COMM=sshd``) during a no-change ``pyinfra -y`` run on the lab with the fact batching of the
time (since retired: each of its commands is one session as any other);
lab-bench-pyinfra-debug.txt is an excerpt of ``pyinfra --debug`` output of a no-change run with
that batching off (pyinfra as it ships) on the same lab (its first operations, both hosts).
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from bench import run

CAPTURED = Path(__file__).parent / "captured"
JOURNAL = (CAPTURED / "lab-bench-sshd-journal.txt").read_text()
DEBUG = (CAPTURED / "lab-bench-pyinfra-debug.txt").read_text()
AUDIT = (
    "dpkg --audit 2>/dev/null; ls /var/lib/dpkg/updates 2>/dev/null | grep -q '^[0-9]'"
    " && echo 'journal pending'; true"
)


def test_sessions_are_counted_once_the_connection_is_over() -> None:
    # Three commands in one connection; the login itself is not a session.
    assert run.count_sessions(JOURNAL) == 3
    unfinished = JOURNAL[: JOURNAL.index("pam_unix(sshd:session): session closed")]
    assert run.count_sessions(unfinished) is None


def test_file_transfers_count_as_sessions() -> None:
    sftp = "Starting session: subsystem 'sftp' for spark from 10.77.5.1 port 50266 id 1\n"
    assert run.count_sessions(sftp + JOURNAL) == 4


def test_fact_commands_are_read_from_the_debug_output_per_host_in_order() -> None:
    sent = run.fact_commands(DEBUG)
    assert sorted(sent) == ["spark-1", "spark-2"]
    assert len(sent["spark-1"]) == 4 and len(sent["spark-2"]) == 3
    # Unwrapped from pyinfra's sudo -H -n sh -c '...': the fact's own command.
    assert sent["spark-1"][0] == sent["spark-2"][0] == AUDIT
    assert sent["spark-1"][2].startswith("nvidia-smi")


def test_a_command_that_is_not_a_fact_read_is_refused() -> None:
    line = "[pyinfra.connectors.ssh] Running command on spark-1: (pty=False) systemctl restart x"
    with pytest.raises(RuntimeError, match="not a fact command"):
        run.fact_commands(line)


def test_the_limit_script_asks_every_question_even_after_a_failure(tmp_path: Path) -> None:
    commands = ["echo one", "false", "cat", "echo 'two words'"]
    argv = shlex.split(run.limit_script(commands))
    assert argv[:5] == ["sudo", "-H", "-n", "sh", "-c"] and argv[6:] == [">/dev/null"]
    # Run here without sudo; stdin is closed for each question (cat does not wait).
    out = subprocess.run(["sh", "-c", argv[5]], input="not for cat", capture_output=True, text=True)
    assert out.stdout == "one\ntwo words\n"


def test_summaries_and_ratios() -> None:
    def runs(*seconds: float, commands: int) -> list[dict]:
        return [{"seconds": s, "sessions": {"spark-1": commands}} for s in seconds]

    def lab(factor: float) -> dict:
        section = {"no_change": run.summarize(runs(4 * factor, 2 * factor, 3 * factor, commands=3)),
                   "no_change_confirm": run.summarize(runs(4, 5, 6, commands=3)),
                   "limit": run.summarize(runs(1.5, 1.0, 2.0, commands=1))}  # fmt: skip
        return section

    two = run.summarize(runs(4, 2, 3, commands=3))
    assert (two["min"], two["median"], two["commands_per_host"]) == (2, 3, [3])
    ratios = run.ratios({"2": lab(1), "8": lab(1.5)})
    assert ratios["no_change / limit, 2 hosts (medians)"] == 2.0  # 3 / 1.5
    assert ratios["no_change, 8 hosts / 2 hosts (medians)"] == 1.5  # 4.5 / 3
    assert ratios["no_change_confirm / no_change, 2 hosts (medians)"] == round(5 / 3, 2)
    assert ratios["no_change_confirm / no_change, 8 hosts (medians)"] == round(5 / 4.5, 2)
    text = run.table({"labs": {"2": lab(1)}, "ratios": ratios})
    assert "no-change re-run, -y " in text and "limit: one SSH session" in text
    # With the questions-only floor: 3 / 1.5 over the limit, the -y run's 3 / 2.5 over it.
    floor = lab(1) | {"questions_only": run.summarize(runs(2.5, 2.0, 3.0, commands=1))}
    ratios = run.ratios({"2": floor})
    assert ratios["questions_only / limit, 2 hosts (medians)"] == round(2.5 / 1.5, 2)
    assert ratios["no_change / questions_only, 2 hosts (medians)"] == round(3 / 2.5, 2)
    assert "pyinfra asking only the questions" in run.table({"labs": {"2": floor}, "ratios": {}})


def test_a_command_of_several_lines_is_read_whole() -> None:
    # By hand, in the form of pyinfra's --debug line: a fact whose command holds a script of
    # two lines (as nmcli.py's netplan reader does) is logged across two lines.
    head = "[pyinfra.connectors.ssh] Running command on spark-1: (pty=False) "
    output = f"{head}sudo -H -n sh -c 'python3 -c \"import sys\n print(1)\"'\nnext line"
    assert run.fact_commands(output) == {"spark-1": ['python3 -c "import sys\n print(1)"']}
    with pytest.raises(RuntimeError, match="a command left open"):
        run.fact_commands(f"{head}sudo -H -n sh -c 'python3")


def test_asking_only_asks_the_box_every_group_said_ahead_in_one_command(tmp_path: Path) -> None:
    # bench/questions_deploy.py's one operation, on this machine through pyinfra's local
    # connector: it reads a, and the box is asked a and b (both said ahead) in one command.
    from pyinfra.context import ctx_host, ctx_state

    from bench.ask_only import answered
    from operations import asked
    from tests.unit.local_run import Read, Run

    box = Run(tmp_path, yes=True)
    first, second = box.path("a", "x"), box.path("b", "y")
    with ctx_state.use(box.state), ctx_host.use(box.host):
        asked.ahead([asked.question(Read, path=first, log=box.log)])
        asked.ahead([asked.question(Read, path=second, log=box.log)])
    meta = box.add_plain(answered, question=asked.question(Read, path=first, log=box.log))
    box.execute()
    assert box.commands() == [["a", "b"]]
    assert meta.did_succeed() and not meta.did_change()

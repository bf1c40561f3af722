"""Cluster environment file and its login-shell export."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from operations import environment
from tests.unit.harness import FakeHost, captured, file_facts, refusal, run_op

ENV = "/etc/spark/cluster.env"
PROFILE = "/etc/profile.d/spark-cluster-env.sh"
VARIABLES = {
    "VLLM_HOST_IP": "192.168.100.10",
    "RAY_memory_monitor_refresh_ms": "0",
    "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
}
# Everything a shell or systemd might read specially, and some that only look special.
AWKWARD = {
    "SPACES": " two  words ",
    "DOUBLE": 'say "hi"',
    "SINGLE": "it's",
    "BACKSLASH": "C:\\new\\\\x\\",
    "DOLLAR": "$HOME ${USER} $(id)",
    "BACKTICK": "`id`",
    "HASH": "#not a comment",
    "EQUALS": "a=b=c",
    "SEMICOLON": "a; rm -rf /",
    "UNICODE": "grüße ✓",
    "PERCENT": "%h %n",
    "EMPTY": "",
}


HEAD = (
    "# Managed by pyinfra (operations/environment.py): edit group_data instead.\n"
    "# Read by systemd units (EnvironmentFile=) and login shells (/etc/profile.d):"
    " world-readable,\n# so never a secret in here.\n"
)
# Both files as a deploy of VARIABLES leaves them (templates/cluster.env.j2,
# profile-cluster-env.sh.j2), written out here.
DEPLOYED = {
    ENV: HEAD
    + 'NCCL_IB_HCA="rocep1s0f1,roceP2p1s0f1"\n'
    + 'RAY_memory_monitor_refresh_ms="0"\n'
    + 'VLLM_HOST_IP="192.168.100.10"\n',
    PROFILE: "# Managed by pyinfra (operations/environment.py): edit group_data instead.\n"
    "# Login shells export the cluster environment that systemd units read with EnvironmentFile=.\n"
    "if [ -r /etc/spark/cluster.env ]; then\n"
    "    set -a\n"
    "    . /etc/spark/cluster.env\n"
    "    set +a\n"
    "fi\n",
}


def rendered(variables: dict[str, str]) -> dict[str, str]:
    host = FakeHost(file_facts({ENV: None, PROFILE: None}))
    run_op(environment.cluster_env, variables, path=ENV, host=host)
    return host.uploads


def test_fresh_host_gets_both_files_root_owned_0644() -> None:
    host = FakeHost(file_facts({ENV: None, PROFILE: None}))
    commands = run_op(environment.cluster_env, VARIABLES, path=ENV, host=host)
    for path in (ENV, PROFILE):
        assert f"chown root:root {path}" in commands and f"chmod 644 {path}" in commands
    assert host.uploads == DEPLOYED


def test_written_files_yield_nothing() -> None:
    host = FakeHost(file_facts(DEPLOYED))
    assert run_op(environment.cluster_env, VARIABLES, path=ENV, host=host) == []
    assert len(host.noops) == 2


def test_a_changed_value_rewrites_the_file_only() -> None:
    host = FakeHost(file_facts(DEPLOYED))
    moved = {**VARIABLES, "VLLM_HOST_IP": "192.168.100.11"}
    commands = run_op(environment.cluster_env, moved, path=ENV, host=host)
    assert commands[0].startswith("FileUploadCommand(") and commands[0].endswith(f", {ENV})")
    assert PROFILE not in host.uploads
    assert 'VLLM_HOST_IP="192.168.100.11"\n' in host.uploads[ENV]


# The plan computes every name, value and note from checked data; given anyway, each stops this
# box alone (a failed command, asking nothing first), never the run.
@pytest.mark.parametrize("key", ["1NCCL", "NCCL-IB", "A B", "", "X=Y", "NCCL\n"])
def test_invalid_names_stop_this_box_alone(key: str) -> None:
    commands = run_op(environment.cluster_env, {key: "1"}, path=ENV, host=FakeHost({}))
    assert refusal(commands) == (
        f"spark-test: the cluster environment: {key!r} is not a valid environment variable name"
    )


@pytest.mark.parametrize("value", ["a\nB=2", "a\r", "a\0"])
def test_values_with_line_breaks_or_nul_stop_this_box_alone(value: str) -> None:
    commands = run_op(environment.cluster_env, {"X": value}, path=ENV, host=FakeHost({}))
    assert refusal(commands) == (
        f"spark-test: the cluster environment: the value of X holds a line break or NUL: {value!r}"
    )


def test_every_problem_is_said_at_once() -> None:
    variables = {"A B": "1", "X": "a\rb"}
    commands = run_op(
        environment.cluster_env, variables, path=ENV, notes={"X": "c\nd"}, host=FakeHost({})
    )
    assert refusal(commands) == (
        "spark-test: the cluster environment: 'A B' is not a valid environment variable name;"
        " the value of X holds a line break or NUL: 'a\\rb'; the note of X holds a line break"
        " or NUL: 'c\\nd'"
    )


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_a_login_shell_reads_back_every_value_exported(shell: str, tmp_path: Path) -> None:
    if not shutil.which(shell):
        pytest.skip(f"no {shell}")
    env_file = tmp_path / "cluster env"  # a space: the profile script quotes the path
    host = FakeHost(file_facts({str(env_file): None, PROFILE: None}))
    run_op(environment.cluster_env, AWKWARD, path=str(env_file), host=host)
    env_file.write_text(host.uploads[str(env_file)])
    profile = tmp_path / "profile.sh"
    profile.write_text(host.uploads[PROFILE])
    # `env` is a child process: it sees only what the profile script exported.
    result = subprocess.run(
        [shell, "-c", '. "$1" && env -0', shell, str(profile)],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "USER": "nobody"},
        capture_output=True,
        check=True,
    )
    seen = dict(item.split("=", 1) for item in result.stdout.decode().split("\0") if item)
    assert {key: seen.get(key) for key in AWKWARD} == AWKWARD


def test_systemd_reads_back_every_value() -> None:
    # Captured on lab host spark-2 (Debian 12, systemd 252): the input file, which must still be
    # what cluster_env renders, was fed to
    # `systemd-run --wait --pipe --collect -p EnvironmentFile=FILE /usr/bin/env -0`.
    assert rendered(AWKWARD)[ENV] == captured("lab-systemd-environmentfile-input.txt")
    output = captured("lab-systemd-environmentfile-env0.txt")
    seen = dict(item.split("=", 1) for item in output.split("\0") if item)
    assert {key: seen.get(key) for key in AWKWARD} == AWKWARD


def test_notes_go_above_their_variable_and_change_nothing_once_written() -> None:
    notes = {"NCCL_IB_HCA": "every twin in use (dgx-spark-playbooks#102)"}
    host = FakeHost(file_facts({ENV: None, PROFILE: None}))
    run_op(environment.cluster_env, VARIABLES, path=ENV, notes=notes, host=host)
    noted = (
        HEAD + "# every twin in use (dgx-spark-playbooks#102)\n" + DEPLOYED[ENV].removeprefix(HEAD)
    )
    assert host.uploads[ENV] == noted

    again = FakeHost(file_facts({ENV: noted, PROFILE: DEPLOYED[PROFILE]}))
    assert run_op(environment.cluster_env, VARIABLES, path=ENV, notes=notes, host=again) == []


def test_a_note_with_a_line_break_stops_this_box_alone() -> None:
    commands = run_op(
        environment.cluster_env, {"X": "1"}, path=ENV, notes={"X": "a\nY=2"}, host=FakeHost({})
    )
    assert refusal(commands) == (
        "spark-test: the cluster environment: the note of X holds a line break or NUL: 'a\\nY=2'"
    )

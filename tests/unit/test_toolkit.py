"""Container toolkit: repository, packages at one version and held, docker's nvidia runtime.

Captures:
- lab-dpkg-query-toolkit-held.txt: ToolkitPackages' command on lab host spark-2 (Debian 12,
  the lab's stand-in packages) after a deploy: the four packages at 1.19.0-1, held.
- dpkg-query-toolkit-1.18.sample.txt: real dpkg-query 1.21 output of the same command (run with
  --admindir) over a private dpkg status database whose stanzas we wrote: 1.18.0-1, not held.
- docker-daemon-json-nvidia.sample.txt: written by hand after NVIDIA's install guide, which shows
  the daemon.json that `nvidia-ctk runtime configure --runtime=docker` leaves.
- lab-docker-daemon-{bare,deployed,before-hook}.txt: DockerDaemon's command on lab host spark-2
  freshly reimaged (no hook), on spark-1 after a deploy (hook 27 s old, docker 26 s), and on
  spark-2 after `apt-get install --reinstall nvidia-container-toolkit` (hook 2 s, docker 29 s).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pyinfra.facts.files import File

from operations import toolkit
from tests.unit import private_apt
from tests.unit.harness import FakeHost, captured, file_facts, process, refusal, run_op

LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
URL = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
UPDATE = (
    f"apt-get update -o Dir::Etc::sourcelist={LIST} -o Dir::Etc::sourceparts=-"
    " -o APT::Get::List-Cleanup=0"
)
LIST_TEXT = (
    "# Managed by pyinfra (operations/toolkit.py): edit group_data instead.\n"
    f"deb [signed-by={KEYRING}] {URL} /\n"
)
INSTALL_1_19 = (
    "apt-get update -qq && DEBIAN_FRONTEND=noninteractive"
    " apt-get -o DPkg::Lock::Timeout=600 install -y"
    " -o Dpkg::Options::=--force-confdef"
    " -o Dpkg::Options::=--force-confold --allow-downgrades --allow-change-held-packages"
    " nvidia-container-toolkit=1.19.0-1 nvidia-container-toolkit-base=1.19.0-1"
    " libnvidia-container-tools=1.19.0-1 libnvidia-container1=1.19.0-1"
)
# The restart, or docker back by its own Restart= within a minute, or its journal and a failure.
RESTART_DOCKER = (
    "systemctl restart docker.service || timeout 60 sh -c 'until systemctl is-active --quiet"
    " docker.service; do sleep 1; done' || { journalctl -u docker.service -n 30 --no-pager >&2;"
    " exit 1; }"
)
HOLD_ALL = (
    "apt-mark hold nvidia-container-toolkit nvidia-container-toolkit-base"
    " libnvidia-container-tools libnvidia-container1"
)


def keyring(present: bool) -> dict:
    return {
        (File, (("path", KEYRING),)): captured("host-stat-file-root-0644.txt") if present else None
    }


def test_toolkit_packages_reads_versions_and_holds() -> None:
    packages = process(toolkit.ToolkitPackages, captured("lab-dpkg-query-toolkit-held.txt"))
    # The four packages NVIDIA's install guide names for the container toolkit, all held.
    assert packages == {
        "nvidia-container-toolkit": {"version": "1.19.0-1", "held": True},
        "nvidia-container-toolkit-base": {"version": "1.19.0-1", "held": True},
        "libnvidia-container-tools": {"version": "1.19.0-1", "held": True},
        "libnvidia-container1": {"version": "1.19.0-1", "held": True},
    }
    assert process(toolkit.ToolkitPackages, "") == {}


def test_docker_daemon_config() -> None:
    sample = captured("docker-daemon-json-nvidia.sample.txt")
    assert process(toolkit.DockerDaemonConfig, sample)["runtimes"]["nvidia"]["args"] == []
    assert process(toolkit.DockerDaemonConfig, "") == {}
    assert process(toolkit.DockerDaemonConfig, '{"log-driver": "journald",') is None
    assert process(toolkit.DockerDaemonConfig, '["not", "an", "object"]') is None
    assert toolkit.DockerDaemonConfig().command().endswith("2>/dev/null || true")


def test_fresh_repository_writes_list_fetches_key_and_updates_that_list_only() -> None:
    host = FakeHost({**file_facts({LIST: None}), **keyring(False)})
    commands = run_op(toolkit.repository, URL, KEY_URL, host=host)
    assert commands[0].startswith("FileUploadCommand(") and LIST in commands[0]
    assert commands[1:3] == [f"chown root:root {LIST}", f"chmod 644 {LIST}"]
    assert commands[3] == (
        f"curl -fsSL {KEY_URL} -o {KEYRING}.asc && gpg --batch --yes --dearmor -o {KEYRING}"
        f" {KEYRING}.asc && rm -f {KEYRING}.asc"
    )
    assert commands[4:] == [UPDATE]
    assert host.uploads[LIST] == LIST_TEXT


def test_repository_in_place_yields_nothing() -> None:
    host = FakeHost({**file_facts({LIST: LIST_TEXT}), **keyring(True)})
    assert run_op(toolkit.repository, URL, KEY_URL, host=host) == []
    assert f"the signing key is in {KEYRING}" in host.noops


def test_missing_key_alone_is_fetched_and_updated() -> None:
    host = FakeHost({**file_facts({LIST: LIST_TEXT}), **keyring(False)})
    commands = run_op(toolkit.repository, URL, KEY_URL, host=host)
    assert len(commands) == 2 and commands[0].startswith("curl ") and commands[1] == UPDATE


def test_changed_url_rewrites_the_list_and_updates() -> None:
    host = FakeHost({**file_facts({LIST: LIST_TEXT}), **keyring(True)})
    commands = run_op(toolkit.repository, "file:///srv/toolkit/$(ARCH)", KEY_URL, host=host)
    assert commands[0].startswith("FileUploadCommand(") and commands[-1] == UPDATE
    assert "deb [signed-by=" + KEYRING + "] file:///srv/toolkit/$(ARCH) /" in host.uploads[LIST]


def test_fresh_host_installs_all_four_at_the_version_and_holds_them() -> None:
    host = FakeHost({toolkit.ToolkitPackages: ""})
    assert run_op(toolkit.installed, "1.19.0-1", host=host) == [INSTALL_1_19, HOLD_ALL]


def test_installed_and_held_yields_nothing() -> None:
    host = FakeHost({toolkit.ToolkitPackages: captured("lab-dpkg-query-toolkit-held.txt")})
    assert run_op(toolkit.installed, "1.19.0-1", host=host) == []
    assert host.noops == ["the container toolkit is at 1.19.0-1 and held"]


def test_other_version_is_moved_and_held() -> None:
    host = FakeHost({toolkit.ToolkitPackages: captured("dpkg-query-toolkit-1.18.sample.txt")})
    assert run_op(toolkit.installed, "1.19.0-1", host=host) == [INSTALL_1_19, HOLD_ALL]


def test_right_version_not_held_is_only_held() -> None:
    output = captured("lab-dpkg-query-toolkit-held.txt").replace(
        "hi \tlibnvidia-container1", "ii \tlibnvidia-container1"
    )
    host = FakeHost({toolkit.ToolkitPackages: output})
    assert run_op(toolkit.installed, "1.19.0-1", host=host) == [
        "apt-mark hold libnvidia-container1"
    ]


def daemon(name: str) -> str:
    return captured(f"lab-docker-daemon-{name}.txt")


def test_docker_daemon_fact() -> None:
    runc = ["io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "runc"]
    assert process(toolkit.DockerDaemon, daemon("bare")) == {
        "runtimes": runc,
        "started_before_hook": False,
    }
    assert process(toolkit.DockerDaemon, daemon("deployed")) == {
        "runtimes": [*runc[:2], "nvidia", "runc"],
        "started_before_hook": False,
    }
    assert process(toolkit.DockerDaemon, daemon("before-hook"))["started_before_hook"] is True
    # docker does not answer
    assert process(toolkit.DockerDaemon, "null") == {"runtimes": None, "started_before_hook": False}
    assert toolkit.DockerDaemon().command(service="docker.service").endswith(" true")


def test_docker_without_the_runtime_gets_it_then_a_restart() -> None:
    for daemon_json in ("", '{"log-driver": "journald"}'):
        # The running daemon is not asked: it is restarted whatever it has.
        host = FakeHost({toolkit.DockerDaemonConfig: daemon_json})
        commands = run_op(toolkit.docker_runtime, host=host)
        assert commands == ["nvidia-ctk runtime configure --runtime=docker", RESTART_DOCKER]


def test_docker_with_the_runtime_yields_nothing() -> None:
    sample = captured("docker-daemon-json-nvidia.sample.txt")
    host = FakeHost({toolkit.DockerDaemonConfig: sample, toolkit.DockerDaemon: daemon("deployed")})
    assert run_op(toolkit.docker_runtime, host=host) == []
    assert host.noops == ["docker has the nvidia runtime and --gpus"]


def test_a_daemon_without_the_runtime_or_older_than_the_hook_gets_the_restart() -> None:
    # A run cut off between nvidia-ctk and the restart leaves the runtime out of the daemon; a
    # box booted while the toolkit was half installed, or a toolkit installed again, leaves a
    # daemon without --gpus (both seen in the lab); a docker that does not answer is started.
    sample = captured("docker-daemon-json-nvidia.sample.txt")
    for running in (daemon("bare"), daemon("before-hook"), "null"):
        host = FakeHost({toolkit.DockerDaemonConfig: sample, toolkit.DockerDaemon: running})
        assert run_op(toolkit.docker_runtime, host=host) == [RESTART_DOCKER]


def test_docker_config_that_is_not_json_is_refused() -> None:
    host = FakeHost({toolkit.DockerDaemonConfig: '{"runtimes": {'})
    assert re.search(
        r"spark-test: /etc/docker/daemon\.json is not a JSON",
        refusal(run_op(toolkit.docker_runtime, host=host)),
    )


# repository()'s own commands under real apt, curl and gpg (see private_apt): the key fetched
# from a file: URL and dearmored, the list naming the repository with $(ARCH) and signed-by,
# the update of that list alone; apt then trusts the repository's signed packages.


def test_repository_commands_work_with_real_apt(tmp_path: Path) -> None:
    private_apt.require_tools()
    repo = private_apt.build_repo(tmp_path, [(name, "1.19.0-1", "") for name in toolkit.PACKAGES])
    apt = private_apt.PrivateApt(tmp_path / "apt", sources="")
    key = tmp_path / "keyring.gpg"
    listed = tmp_path / "apt/etc/sources.list.d/nvidia-container-toolkit.list"
    host = FakeHost({**file_facts({str(listed): None}), (File, (("path", str(key)),)): None})
    commands = run_op(
        toolkit.repository,
        f"file:{repo}/$(ARCH)",
        f"file://{tmp_path}/key.asc",
        keyring=str(key),
        list_path=str(listed),
        host=host,
    )
    listed.write_text(host.uploads[str(listed)])
    fetch_key, update = commands[-2:]
    apt.run(fetch_key)
    assert key.stat().st_size > 0 and not key.read_bytes().startswith(b"-----BEGIN")  # binary
    assert not Path(f"{key}.asc").exists()
    apt.run(update)
    assert "Candidate: 1.19.0-1" in apt.run("apt-cache policy nvidia-container-toolkit")
    # The signature is checked: with a key that did not sign the repository, no update.
    stranger = private_apt.build_repo(tmp_path / "stranger", [])
    apt.run(fetch_key.replace(str(tmp_path / "key.asc"), str(stranger.parent / "key.asc")))
    refused = apt.run(update, check=False)
    assert "NO_PUBKEY" in refused, refused


def restart_with(tmp_path: Path, active_after: int | None) -> subprocess.CompletedProcess:
    """The restart command against a fake systemctl whose `restart` fails (dockerd exited at
    start) and whose `is-active` answers yes from its `active_after`-th call (None: never), and
    a fake journalctl; the wait cut to 3 s so that "never" ends soon."""
    calls = tmp_path / "calls"
    (tmp_path / "systemctl").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        '[ "$1" = restart ] && exit 1\n'
        f'[ "$1" = is-active ] && [ {active_after or 10**6} -le "$(grep -c is-active {calls})" ]\n'
    )
    (tmp_path / "journalctl").write_text("#!/bin/sh\necho 'dockerd: failed to start daemon'\n")
    for fake in ("systemctl", "journalctl"):
        (tmp_path / fake).chmod(0o755)
    command = RESTART_DOCKER.replace("timeout 60 ", "timeout 3 ")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)


def test_a_failed_docker_restart_waits_for_dockers_own_restart(tmp_path: Path) -> None:
    result = restart_with(tmp_path, active_after=2)
    assert result.returncode == 0 and result.stderr == ""
    assert (tmp_path / "calls").read_text().splitlines()[0] == "restart docker.service"


def test_a_docker_that_never_comes_back_fails_with_its_journal(tmp_path: Path) -> None:
    result = restart_with(tmp_path, active_after=None)
    assert result.returncode == 1
    assert "dockerd: failed to start daemon" in result.stderr

"""Install NVIDIA's container toolkit and register its docker runtime."""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.facts.files import File

from operations import util
from operations.asked import Question, answer, question
from operations.debpkg import PackageStates, apt_install

# NVIDIA's documented install line names these four, each at the same version.
PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
DAEMON_JSON = "/etc/docker/daemon.json"
DOCKER = "docker.service"
KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
LIST_PATH = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
HOOK = "nvidia-container-runtime-hook"  # docker looks it up in its PATH when it starts


class ToolkitPackages(PackageStates):
    """The installed PACKAGES, with version and hold.

    .. code:: python

        {"nvidia-container-toolkit": {"version": "1.19.0-1", "held": True}}
    """

    patterns = PACKAGES


class DockerDaemonConfig(FactBase):
    """/etc/docker/daemon.json, parsed: {} when absent, None when it is not a JSON object.

    .. code:: python

        {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    """

    default = dict

    def command(self) -> str:
        return f"cat {DAEMON_JSON} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict | None:
        text = "\n".join(output)
        if not text.strip():
            return {}
        try:
            config = json.loads(text)
        except ValueError:
            return None
        return config if isinstance(config, dict) else None


class DockerDaemon(FactBase):
    """The running docker daemon: its runtimes (None when it does not answer), and whether it
    started before the toolkit's HOOK was installed. Docker registers the driver behind
    ``--gpus`` only when it finds that hook as it starts, so such a daemon has the nvidia runtime
    and still fails ``--gpus`` ('could not select device driver "" with capabilities: [[gpu]]').

    .. code:: python

        {"runtimes": ["io.containerd.runc.v2", "nvidia", "runc"], "started_before_hook": False}
    """

    def command(self, service: str) -> str:
        # The ages in seconds of the hook's inode (ctime: set when dpkg installs it) and of
        # the daemon's process, when both exist.
        return (
            "docker info --format '{{json .Runtimes}}' 2>/dev/null || echo null;"
            f" pid=$(systemctl show -p MainPID --value {shlex.quote(service)} 2>/dev/null);"
            f" hook=$(command -v {HOOK});"
            ' if [ -n "$hook" ] && [ "${pid:-0}" -gt 0 ] 2>/dev/null; then'
            ' echo "$(( $(date +%s) - $(stat -c %Z "$hook") )) $(ps -o etimes= -p "$pid")"; fi;'
            " true"
        )

    def process(self, output: list[str]) -> dict[str, list[str] | bool | None]:
        try:
            runtimes = json.loads(output[0]) if output else None
        except ValueError:
            runtimes = None
        ages = output[1].split() if len(output) > 1 else []
        return {
            "runtimes": sorted(runtimes) if isinstance(runtimes, dict) else None,
            # A second's slack: the two ages are whole seconds, read one after the other.
            "started_before_hook": len(ages) == 2 and int(ages[1]) > int(ages[0]) + 1,
        }


@operation()
def repository(
    url: str,
    key_url: str,
    keyring: str = KEYRING,
    list_path: str = LIST_PATH,
):
    """
    Add NVIDIA's container toolkit apt repository, signed by its own key only.

    + url: the flat repository, as NVIDIA names it, e.g.
      https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) (apt itself puts the
      machine's architecture for $(ARCH), in URIs too) or a file: URL
    + key_url: the armored signing key (https:// or file://, fetched with curl)
    + keyring: where the dearmored key goes; fetched only when missing (a key rotated at the same
      URL needs this file removed)
    + list_path: the sources list naming the repository

    Updates the package lists of this repository alone, and only when the list or the key
    changed.
    """
    list_changes = util.template(
        "nvidia-container-toolkit.list.j2", list_path, url=url, keyring=keyring
    )
    yield from list_changes
    key_missing = answer(File, path=keyring) is None
    if key_missing:
        armored = shlex.quote(f"{keyring}.asc")
        yield (
            f"curl -fsSL {shlex.quote(key_url)} -o {armored}"
            f" && gpg --batch --yes --dearmor -o {shlex.quote(keyring)} {armored}"
            f" && rm -f {armored}"
        )
    else:
        host.noop(f"the signing key is in {keyring}")
    if list_changes or key_missing:
        yield (
            f"apt-get update -o Dir::Etc::sourcelist={shlex.quote(list_path)}"
            " -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0"
        )


@operation()
def installed(version: str):
    """
    Install the container toolkit's PACKAGES at one version, and hold them there.

    + version: the Debian version of all four, e.g. 1.19.0-1 (moving to another one, up or down,
      is this operation's job)

    They are held so that `apt upgrade` leaves the box at the version that group_data names
    (a toolkit upgrade may change how containers see the GPU); a fix, say for a toolkit CVE,
    comes by raising the version there.
    """
    current = answer(ToolkitPackages)
    install = any(current.get(name, {}).get("version") != version for name in PACKAGES)
    if install:
        yield apt_install(
            "--allow-downgrades",
            "--allow-change-held-packages",
            *(f"{name}={version}" for name in PACKAGES),
        )
    unheld = [name for name in PACKAGES if install or not current[name]["held"]]
    if unheld:
        yield f"apt-mark hold {' '.join(unheld)}"
    else:
        host.noop(f"the container toolkit is at {version} and held")


@operation()
def docker_runtime(service: str = DOCKER):
    """
    Register the toolkit's ``nvidia`` runtime in docker's daemon.json (with nvidia-ctk) and make
    sure the running docker has it, and ``--gpus``.

    + service: docker's unit, restarted when the running daemon lacks either

    Docker reads daemon.json, and looks for the toolkit's hook, only when it starts. So the
    restart follows a change of the file, and also comes on its own when the running daemon
    lacks the runtime or started before the hook was installed: a run cut off between install,
    nvidia-ctk and restart, or a box that booted while the toolkit was half installed, leaves it
    so, and a later run must still finish the job.

    **Example:**

    .. code:: python

        toolkit.docker_runtime(name="docker's nvidia runtime")
    """
    config = answer(DockerDaemonConfig)
    if config is None:
        yield from util.refused(
            f"{host.name}: {DAEMON_JSON} is not a JSON object, so docker cannot start with it"
            " either and nvidia-ctk cannot add to it: fix or remove it, then run the deploy again"
        )
        return
    runtimes = config.get("runtimes")
    if isinstance(runtimes, dict) and "nvidia" in runtimes:
        daemon = answer(DockerDaemon, service=service)
        running = daemon["runtimes"] or []
        if "nvidia" in running and not daemon["started_before_hook"]:
            host.noop("docker has the nvidia runtime and --gpus")
            return
    else:
        yield "nvidia-ctk runtime configure --runtime=docker"
    # Also when docker does not answer at all: a restart starts it, with the runtime. A dockerd
    # whose start fails (seen once on the lab, the run after one cut off during this restart)
    # is started again by its unit's own Restart= (docker.service: Restart=always): wait for
    # that, and show dockerd's journal when it does not come.
    unit = shlex.quote(service)
    yield (
        f"systemctl restart {unit} || timeout 60 sh -c 'until systemctl is-active --quiet {unit};"
        f" do sleep 1; done' || {{ journalctl -u {unit} -n 30 --no-pager >&2; exit 1; }}"
    )


def questions() -> list[Question]:
    """What ``repository``, ``installed`` and ``docker_runtime`` read (operations/asked.py)."""
    return [
        question(util.RootFiles, paths=(LIST_PATH,)),
        question(File, path=KEYRING),
        question(ToolkitPackages),
        question(DockerDaemonConfig),
        question(DockerDaemon, service=DOCKER),
    ]

"""Install NVIDIA's container toolkit and register its docker runtime."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.api.exceptions import OperationError
from pyinfra.facts.files import File
from pyinfra.operations import files

from operations.debpkg import PackageStates, apt_install

# NVIDIA's documented install line names these four, each at the same version.
PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
LIST_TEMPLATE = Path(__file__).parents[1] / "templates" / "nvidia-container-toolkit.list.j2"
DAEMON_JSON = "/etc/docker/daemon.json"


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


class DockerRuntimes(FactBase):
    """The runtimes of the running docker daemon, or None when it does not answer.

    .. code:: python

        ["io.containerd.runc.v2", "nvidia", "runc"]
    """

    def command(self) -> str:
        return "docker info --format '{{json .Runtimes}}' 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str] | None:
        try:
            runtimes = json.loads("\n".join(output))
        except ValueError:
            return None
        return sorted(runtimes) if isinstance(runtimes, dict) else None


@operation()
def repository(
    url: str,
    key_url: str,
    keyring: str = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg",
    list_path: str = "/etc/apt/sources.list.d/nvidia-container-toolkit.list",
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
    list_changes = list(
        files.template._inner(
            src=str(LIST_TEMPLATE),
            dest=list_path,
            user="root",
            group="root",
            mode="644",
            url=url,
            keyring=keyring,
        )
    )
    yield from list_changes
    key_missing = host.get_fact(File, path=keyring) is None
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
    current = host.get_fact(ToolkitPackages)
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
def docker_runtime(service: str = "docker.service"):
    """
    Register the toolkit's ``nvidia`` runtime in docker's daemon.json (with nvidia-ctk) and make
    sure the running docker has it.

    + service: docker's unit, restarted when the running daemon lacks the runtime

    Docker reads daemon.json only when it starts, so the restart follows a change of the file, and
    also comes on its own when the file has the runtime and the daemon does not: a run cut off
    between the two leaves the box so, and a later run must still finish the job.

    **Example:**

    .. code:: python

        toolkit.docker_runtime(name="docker's nvidia runtime")
    """
    config = host.get_fact(DockerDaemonConfig)
    if config is None:
        raise OperationError(
            f"{host.name}: {DAEMON_JSON} is not a JSON object, so docker cannot start with it"
            " either and nvidia-ctk cannot add to it: fix or remove it, then run the deploy again"
        )
    runtimes = config.get("runtimes")
    if isinstance(runtimes, dict) and "nvidia" in runtimes:
        running = host.get_fact(DockerRuntimes)
        if running is not None and "nvidia" in running:
            host.noop("docker has the nvidia runtime")
            return
    else:
        yield "nvidia-ctk runtime configure --runtime=docker"
    # Also when docker does not answer at all: a restart starts it, with the runtime.
    yield f"systemctl restart {shlex.quote(service)}"

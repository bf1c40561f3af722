"""Real apt over a repository of stand-in packages, with a configuration of its own.

Packages are built with dpkg-deb and indexed with apt-ftparchive into a flat repository
(``<base>/repo/amd64``, named in sources with ``$(ARCH)`` as NVIDIA's toolkit list does);
apt-get and apt-cache read only the files under their root (APT_CONFIG points every other
configuration file there), so nothing of this machine's apt is read or changed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.simlab.standins import gnupg_home
from tests.unit.harness import needs_tools

TOOLS = ("apt-get", "apt-cache", "apt-ftparchive", "dpkg-deb", "gpg")
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def require_tools() -> None:
    needs_tools(*TOOLS)


def build_repo(base: Path, packages: list[tuple[str, str, str]]) -> Path:
    """A flat repository of (name, version, depends) stand-ins, its Release signed by a key of
    its own (armored public key at ``<base>/key.asc``). Returns the repository's $(ARCH) parent."""
    pool = base / "repo" / "amd64"
    pool.mkdir(parents=True)
    for name, version, depends in packages:
        control = base / "build" / f"{name}_{version}" / "DEBIAN" / "control"
        control.parent.mkdir(parents=True)
        control.write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@t>\n"
            "Description: stand-in\n" + (f"Depends: {depends}\n" if depends else "")
        )
        package = pool / f"{name}_{version}_all.deb"
        run(
            "dpkg-deb",
            "--root-owner-group",
            "-Zgzip",
            "--build",
            str(control.parents[1]),
            str(package),
        )
    for index in ("packages", "release"):
        (pool / index.capitalize()).write_text(run("apt-ftparchive", index, ".", cwd=pool))
    # Its home is reached through a short link: pytest's tmp_path (deeper under xdist) can pass
    # the 107 bytes a gpg-agent socket path may have.
    with gnupg_home(base / "gnupg") as home:
        env = {"GNUPGHOME": str(home)}
        run(
            "gpg",
            "--batch",
            "--passphrase",
            "",
            "--quick-gen-key",
            "lab <lab@example.invalid>",
            "ed25519",
            "sign",
            "never",
            env=env,
        )
        (base / "key.asc").write_text(run("gpg", "--armor", "--export", env=env))
        run(
            "gpg",
            "--batch",
            "--clearsign",
            "-o",
            str(pool / "InRelease"),
            str(pool / "Release"),
            env=env,
        )
    return base / "repo"


def run(*argv: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        argv, cwd=cwd, env={**ENV, **(env or {})}, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


class PrivateApt:
    """apt-get/apt-cache with sources, preferences and dpkg status of their own under root."""

    def __init__(self, root: Path, sources: str, preferences: str = "", status: str = "") -> None:
        self.root = root
        etc = root / "etc"
        for sub in ("apt.conf.d", "sources.list.d", "preferences.d"):
            (etc / sub).mkdir(parents=True)
        for sub in ("lists/partial", "cache/archives/partial"):
            (root / sub).mkdir(parents=True)
        (etc / "sources.list").write_text(sources)
        (etc / "preferences").write_text(preferences)
        (root / "status").write_text(status)
        self.config = root / "apt.conf"
        self.config.write_text(
            f'Dir::Etc "{etc}"; Dir::Etc::Parts "apt.conf.d"; Dir::Etc::Main "none";'
            f' Dir::State "{root}"; Dir::State::Lists "lists"; Dir::State::status "{root}/status";'
            f' Dir::Cache "{root}/cache"; APT::Architecture "amd64"; APT::Architectures "amd64";'
            ' Debug::NoLocking "true"; APT::Sandbox::User "root";'
        )

    def run(self, command: str, check: bool = True) -> str:
        """Run a shell command line with this apt's configuration; stdout and stderr."""
        result = subprocess.run(
            ["sh", "-c", command],
            env={**ENV, "APT_CONFIG": str(self.config), "GNUPGHOME": str(self.root / "gnupg")},
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0 or not check, result.stdout + result.stderr
        return result.stdout + result.stderr

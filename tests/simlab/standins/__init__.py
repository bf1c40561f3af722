"""Stand-ins for NVIDIA's apt packages, served to the lab's hosts from local signed repositories.

The lab's hosts reach no registry, so flat apt repositories take the place of NVIDIA's:
`dgx/` of the DGX OS archive (driver branches 580 and 590 and the metapackage that follows the
newest branch), `dgx-updates/` of a later state of that archive (a newer build of branch 580,
signed with the same key, in no host's sources until a test adds it) and
`nvidia-container-toolkit/` of NVIDIA's container-toolkit repository (two releases, so that
pinning one means something). The packages carry the real names, versions and
relationships; their programs (files/) answer like the real ones where the deploy looks. Each
repository is signed with its own throwaway key, made on the first build and kept beside it.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.simlab.paths import log
from tests.simlab.rootfs import ensure_host_tools

FILES = Path(__file__).parent / "files"
DGX = "dgx"
DGX_UPDATES = "dgx-updates"
TOOLKIT = "nvidia-container-toolkit"
# Driver branch -> (package version, CUDA version its nvidia-smi reports).
DRIVER_BRANCHES = {"580": ("580.142-0ubuntu1", "13.0"), "590": ("590.48-0ubuntu1", "13.1")}
# The newer 580 build dgx-updates/ serves: 580.159.03, the driver a real DGX Spark reports in
# tests/unit/captured/public-nvidia-smi-gb10-query.txt, after 580.142 (both NVIDIA open kernel
# module releases, packaged as nvidia-open-gpu-kernel-modules 580.142 and 580.159.x).
DRIVER_UPDATES = {"580": ("580.159.03-0ubuntu1", "13.0")}
# Where the stand-in nvidia-smi reads the version of the "loaded kernel module": absent after a
# boot (the module loaded is the installed one); an upgrade writes the version it replaced
# (the postinst below), as the running module stays until the box reboots (/run is a tmpfs).
LOADED_MODULE = "/run/simlab-nvidia-module"
# Where the stand-in nvidia-smi records the clock range it locked (-lgc) and removes it (-rgc),
# for the lab's tests alone: the real lock has no reading (NVML has no getter), and a reboot
# drops it as /run is a tmpfs, as a real GPU's lock goes with its power.
GPU_CLOCK_RECORD = "/run/simlab-gpu-clock"
DRIVER_POSTINST = f"""#!/bin/sh
set -e
# configure <version replaced>: an upgrade or downgrade leaves the module loaded before it.
if [ "$1" = configure ] && [ -n "$2" ] && [ ! -e {LOADED_MODULE} ]; then
    echo "${{2%%-*}}" > {LOADED_MODULE}
fi
"""
TOOLKIT_VERSIONS = ["1.19.0-1", "1.18.0-1"]
# Ubuntu packages the deploy installs and a box's archive serves (the firewall's nft, the lanes'
# front): the real Debian packages of this machine's release, which the lab's hosts run.
DISTRIBUTION_PACKAGES = [
    "nftables", "libnftables1", "nginx", "nginx-common", "prometheus-node-exporter",
    # python3-venv for the router's virtualenv (operations/router.py), with what it depends on.
    # python3.11-venv depends on python3.11 at its own version: the archive's newest build of
    # python3.11 comes with it, as an upgrade of the base image's (built from the release's first
    # point releases), as apt does on a box whose archive moved on.
    "python3-venv", "python3.11-venv", "python3-pip-whl", "python3-setuptools-whl",
    "python3-distutils", "python3-lib2to3", "python3.11", "python3.11-minimal",
    "libpython3.11-stdlib", "libpython3.11-minimal",
]  # fmt: skip
# Fixed timestamps make the .debs byte-identical from build to build, so a rebuild never
# changes a package behind a host's cached package lists.
SOURCE_DATE_EPOCH = 1767225600  # 2026-01-01
MAINTAINER = "Spark simulated lab <simlab@example.invalid>"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    summary: str
    section: str
    relations: dict[str, str] = field(default_factory=dict)
    # Path on the host -> stand-in program in files/.
    programs: dict[str, str] = field(default_factory=dict)
    # @TOKEN@ -> value, filled into the programs.
    tokens: dict[str, str] = field(default_factory=dict)
    # Maintainer script name (postinst...) -> its text.
    scripts: dict[str, str] = field(default_factory=dict)


def driver_packages(branches: dict[str, tuple[str, str]]) -> list[Package]:
    """The driver packages of each branch at its version: the library and the driver."""
    packages = []
    for branch, (version, cuda) in branches.items():
        packages.append(
            Package(f"libnvidia-compute-{branch}", version, "NVIDIA libcompute package", "libs")
        )
        packages.append(
            Package(
                f"nvidia-driver-{branch}-open",
                version,
                f"NVIDIA driver (open kernel) metapackage, branch {branch}",
                "x11",
                # One branch at a time: every driver provides and conflicts with the same name.
                relations={
                    "Depends": f"libnvidia-compute-{branch} (= {version})",
                    "Provides": "nvidia-driver-binary",
                    "Conflicts": "nvidia-driver-binary",
                    "Replaces": "nvidia-driver-binary",
                },
                programs={"/usr/bin/nvidia-smi": "nvidia-smi"},
                tokens={
                    "@DRIVER_VERSION@": version.split("-")[0],
                    "@CUDA_VERSION@": cuda,
                    "@LOADED_MODULE@": LOADED_MODULE,
                    "@GPU_CLOCK_RECORD@": GPU_CLOCK_RECORD,
                },
                scripts={"postinst": DRIVER_POSTINST},
            )
        )
    return packages


def dgx_packages() -> list[Package]:
    """The DGX OS archive's driver packages: one per branch, and the newest-branch metapackage."""
    packages = driver_packages(DRIVER_BRANCHES)
    newest = max(DRIVER_BRANCHES, key=int)
    packages.append(
        Package(
            "nvidia-driver-open",
            DRIVER_BRANCHES[newest][0],
            "NVIDIA driver (open kernel) metapackage, newest branch",
            "metapackages",
            relations={"Depends": f"nvidia-driver-{newest}-open"},
        )
    )
    return packages


def toolkit_packages() -> list[Package]:
    """NVIDIA's container-toolkit packages, related as in their debian/control files."""
    packages = []
    for version in TOOLKIT_VERSIONS:
        upstream = {"@VERSION@": version.split("-")[0]}
        packages += [
            Package("libnvidia-container1", version, "NVIDIA container runtime library", "libs"),
            Package(
                "libnvidia-container-tools",
                version,
                "NVIDIA container runtime library (command-line tools)",
                "utils",
                relations={"Depends": f"libnvidia-container1 (>= {version})"},
                programs={"/usr/bin/nvidia-container-cli": "nvidia-container-cli"},
                tokens=upstream,
            ),
            Package(
                "nvidia-container-toolkit-base",
                version,
                "NVIDIA Container Toolkit Base",
                "utils",
                # The stand-in nvidia-ctk is a Python program (the real one is a Go binary).
                relations={"Depends": "python3"},
                programs={
                    "/usr/bin/nvidia-ctk": "nvidia-ctk",
                    "/usr/bin/nvidia-container-runtime": "nvidia-container-runtime",
                },
                tokens=upstream,
            ),
            Package(
                "nvidia-container-toolkit",
                version,
                "NVIDIA Container toolkit",
                "utils",
                relations={
                    "Depends": f"nvidia-container-toolkit-base (= {version}), "
                    f"libnvidia-container-tools (= {version}), "
                    "libnvidia-container-tools (<< 2.0.0)"
                },
                programs={
                    "/usr/bin/nvidia-container-runtime-hook": "nvidia-container-runtime-hook"
                },
            ),
        ]
    return packages


def build_repositories(dest: Path) -> None:
    """(Re)build both signed flat repositories into dest/dgx and dest/nvidia-container-toolkit.

    Keys are made once (dest/.gnupg-<repo>) and kept, so hosts that trust them keep trusting
    them; the repository directories are emptied and refilled in place (not replaced), so the
    bind mounts of running hosts keep seeing them.
    """
    ensure_host_tools()
    dest.mkdir(parents=True, exist_ok=True)
    for repo, packages, origin in [
        (DGX, dgx_packages(), "DGX OS (simulated-lab stand-in)"),
        (DGX_UPDATES, driver_packages(DRIVER_UPDATES), "DGX OS (simulated-lab stand-in)"),
        (TOOLKIT, toolkit_packages(), "NVIDIA container toolkit (simulated-lab stand-in)"),
    ]:
        repo_dir = dest / repo
        repo_dir.mkdir(exist_ok=True)
        for child in repo_dir.iterdir():
            child.unlink()
        log(f"standins: building {len(packages)} packages into {repo_dir}")
        for package in packages:
            _build_deb(package, repo_dir)
        if repo == DGX:
            _download(DISTRIBUTION_PACKAGES, repo_dir)
        # The updates are the DGX OS archive's, signed with its key.
        key_of = DGX if repo == DGX_UPDATES else repo
        with gnupg_home(dest / f".gnupg-{key_of}") as home:
            fingerprint = _signing_key(home, f"{origin} signing key")
            _write_indexes(repo_dir, origin)
            _sign(home, fingerprint, repo_dir)
            if repo in (DGX, DGX_UPDATES):
                # The base image's sources name it in signed-by: a binary keyring.
                _export(home, fingerprint, repo_dir / "archive-keyring.gpg")
            else:
                # Like NVIDIA's gpgkey URL: ASCII-armored, dearmored by whoever installs it.
                _export(home, fingerprint, repo_dir / "gpgkey", "--armor")
        log(f"standins: {repo} signed with key {fingerprint}")


def _download(names: list[str], repo_dir: Path) -> None:
    """This machine's .debs of these packages into repo_dir (apt's lists refreshed if need be)."""
    command = ["apt-get", "download", "-qq", *names]
    quiet = {"stdin": subprocess.DEVNULL, "capture_output": True}
    if subprocess.run(command, cwd=repo_dir, check=False, **quiet).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, **quiet)
        subprocess.run(command, cwd=repo_dir, check=True, **quiet)


def _build_deb(package: Package, repo_dir: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        files = {
            f"/usr/share/doc/{package.name}/README.simlab": (
                f"{package.name} {package.version}: a stand-in built for the simulated lab,"
                " not NVIDIA software.\n",
                0o644,
            )
        }
        for target, source in package.programs.items():
            text = (FILES / source).read_text()
            for token, value in package.tokens.items():
                text = text.replace(token, value)
            files[target] = (text, 0o755)
        for target, (text, mode) in files.items():
            path = stage / target.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(mode)
        control = {
            "Package": package.name,
            "Version": package.version,
            "Architecture": "all",
            "Maintainer": MAINTAINER,
            "Section": package.section,
            "Priority": "optional",
            **package.relations,
            "Description": f"{package.summary} (simulated-lab stand-in)\n"
            " Stands in for the package of this name in a lab without NVIDIA hardware.",
        }
        (stage / "DEBIAN").mkdir()
        (stage / "DEBIAN/control").write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
        for name, text in package.scripts.items():
            (stage / "DEBIAN" / name).write_text(text)
            (stage / "DEBIAN" / name).chmod(0o755)
        for path in [stage, *stage.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
            os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
        deb = repo_dir / f"{package.name}_{package.version}_all.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(stage), str(deb)],
            check=True,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)},
        )


def _gpg(home: Path, *args: str) -> str:
    result = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--yes", "--quiet", *args],
        check=True,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    return result.stdout


@contextmanager
def gnupg_home(home: Path) -> Iterator[Path]:
    """home, reached through a short symlink, with gpg-agent stopped afterwards.

    gpg-agent's sockets live in the home directory when there is no /run/user/<uid>, and a
    socket path may not exceed 107 bytes: deep build directories (pytest's) would go over.
    """
    home.mkdir(mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpg-") as tmp:
        link = Path(tmp) / "home"
        link.symlink_to(home.resolve())
        try:
            yield link
        finally:
            subprocess.run(["gpgconf", "--homedir", str(link), "--kill", "gpg-agent"], check=False)


def _signing_key(home: Path, uid: str) -> str:
    """The fingerprint of the key in home, made there first if there is none."""
    if "\nfpr:" not in "\n" + _gpg(home, "--with-colons", "--list-secret-keys"):
        log(f"standins: generating signing key in {home}")
        _gpg(home, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
    listing = _gpg(home, "--with-colons", "--list-secret-keys")
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def _write_indexes(repo_dir: Path, origin: str) -> None:
    packages = subprocess.run(
        ["apt-ftparchive", "packages", "."], cwd=repo_dir, check=True, capture_output=True
    ).stdout
    (repo_dir / "Packages").write_bytes(packages)
    (repo_dir / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    fields = []
    for name in ("Origin", "Label"):
        fields += ["-o", f"APT::FTPArchive::Release::{name}={origin}"]
    release = subprocess.run(
        ["apt-ftparchive", *fields, "release", "."],
        cwd=repo_dir,
        check=True,
        capture_output=True,
    ).stdout
    (repo_dir / "Release").write_bytes(release)


def _sign(home: Path, fingerprint: str, repo_dir: Path) -> None:
    release = str(repo_dir / "Release")
    signer = ["--local-user", fingerprint, "--digest-algo", "SHA512"]
    _gpg(home, *signer, "--clearsign", "--output", str(repo_dir / "InRelease"), release)
    _gpg(home, *signer, "--armor", "--detach-sign", "--output", str(repo_dir / "Release.gpg"),
         release)  # fmt: skip


def _export(home: Path, fingerprint: str, path: Path, *options: str) -> None:
    _gpg(home, *options, "--output", str(path), "--export", fingerprint)
    path.chmod(0o644)

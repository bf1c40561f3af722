"""Build and cache the lab's root filesystems: a freshly imaged Spark, and the serving image.

Both are Debian 12 (bookworm) trees made by debootstrap from the mirror this machine's own apt
uses. They are built once into the cache directory and reused; a change to what goes into
them (the package list or the files baked in) changes their key and builds them anew.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.simlab.paths import CACHE, HARDWARE_DIR, log

IMAGES = CACHE / "images"  # the stand-in serving images' layers, pushed to each lab's registry

SUITE = "bookworm"
# What a fresh DGX OS install has that the deploy relies on (DGX OS is Ubuntu 24.04; the lab
# uses bookworm because its NetworkManager manages veths inside a container: see the README).
# netplan.io: DGX OS keeps its network in netplan, NetworkManager its renderer (below).
SPARK_PACKAGES = [
    "systemd", "systemd-sysv", "libpam-systemd", "dbus", "network-manager", "openssh-server",
    "iproute2", "sudo", "ca-certificates", "gnupg", "python3", "docker.io", "curl",
    "iputils-ping", "procps", "less", "netplan.io",
]  # fmt: skip
SERVING_PACKAGES = ["python3", "iproute2", "procps", "ca-certificates"]
HOST_TOOLS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "gpg": "gnupg",
    "gpg-agent": "gpg-agent",
    "gpgconf": "gpgconf",
    "gpgv": "gpgv",
    "apt-ftparchive": "apt-utils",
    "dpkg-deb": "dpkg",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "nft": "nftables",
    "unshare": "util-linux",  # the unit tests' nft check runs in a namespace of its own
    "openssl": "openssl",  # the lab's registry's certificates (registry.py ensure_authority)
    "curl": "curl",  # tests/e2e/test_cluster.py asks a lane from this machine
    # llama-server's build (llama_build.py: CMakeLists.txt's generator and compiler)
    "cmake": "cmake",
    "g++": "g++",
    "make": "make",
    "strip": "binutils",  # the serving image's Ray executables (serving/__init__.py _slim_ray)
}
# Modules this machine's python3 needs (tests/unit/test_nmcli.py runs the box's netplan reader
# with it, as a Spark's python3 with netplan's python3-yaml does).
HOST_MODULES = {"yaml": "python3-yaml"}
ADMIN_USER = "spark"


def ensure_host_tools() -> None:
    """Install the Debian packages the lab (and its stand-in builds) need on this machine;
    labs started side by side (`make test`'s workers) take turns, as apt would refuse the
    second one its lock (its own lock file: the build lock may be held by the caller)."""
    if not _missing_host_packages():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".host-tools.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if missing := _missing_host_packages():
            _install_host_packages(missing)


def _missing_host_packages() -> list[str]:
    tools = {pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None}
    modules = {
        pkg
        for module, pkg in HOST_MODULES.items()
        if subprocess.run(["python3", "-c", f"import {module}"], capture_output=True).returncode
        != 0
    }
    return sorted(tools | modules)


def _install_host_packages(missing: list[str]) -> None:
    log(f"installing host packages: {' '.join(missing)}")
    subprocess.run(["apt-get", "update", "-qq"], check=True, stdin=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
        check=True,
        stdin=subprocess.DEVNULL,
        env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def prometheus_binaries() -> Path:
    """The directory holding `prometheus` and `promtool` of the distribution's prometheus
    package, unpacked into the cache once (not installed: its service would start on this
    machine); the generated configuration and rules are checked, and the lab scraped, with
    them."""
    return unpacked_package("prometheus") / "usr/bin"


def unpacked_package(package: str) -> Path:
    """The tree of a Debian package of this machine's distribution, unpacked into the cache
    once (not installed: a service it ships would start on this machine)."""
    target = CACHE / package
    if not target.exists():
        with building(target) as needed:
            if needed:
                staging = CACHE / f"{package}.staging"
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir(parents=True)
                quiet = {"stdin": subprocess.DEVNULL, "capture_output": True}
                download = ["apt-get", "download", "-qq", package]
                if subprocess.run(download, cwd=staging, check=False, **quiet).returncode:
                    subprocess.run(["apt-get", "update", "-qq"], check=True, **quiet)
                    subprocess.run(download, cwd=staging, check=True, **quiet)
                deb = next(staging.glob(f"{package}_*.deb"))
                subprocess.run(["dpkg-deb", "-x", str(deb), str(staging / "tree")], check=True)
                (staging / "tree").rename(target)
                shutil.rmtree(staging)
    return target


def debian_mirror() -> str:
    """The Debian mirror this machine's apt already uses (deb822 or one-line sources)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        text = path.read_text()
        for stanza in text.split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split():
                return uris.group(1)
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list")]:
        if path.exists():
            match = re.search(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", path.read_text(), re.M)
            if match:
                return match.group(1)
    raise RuntimeError(f"no apt source for Debian {SUITE} on this machine to debootstrap from")


def cache_key(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def _debootstrap(target: Path, packages: list[str]) -> None:
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"debootstrap {SUITE} into {tmp.name} (about a minute)")
    subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(tmp),
         debian_mirror()],
        check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    (tmp / "var/cache/apt/archives").mkdir(parents=True, exist_ok=True)
    for deb in (tmp / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    tmp.rename(target)


@contextmanager
def building(target: Path, lock_name: str = ".build.lock") -> Iterator[bool]:
    """Hold the cache's build lock (`lock_name`: a long build that no other one waits for
    takes its own); yields whether `target` still has to be built (labs started side by side
    wait for one build instead of racing through the same directories)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield not target.exists()


def _chroot(root: Path, script: str) -> None:
    subprocess.run(["chroot", str(root), "/bin/sh", "-euc", script], check=True,
                   stdin=subprocess.DEVNULL)  # fmt: skip


def _customize_spark(root: Path) -> None:
    """Turn the bootstrap into a bare Spark: admin user, key-only SSH, a quiet apt."""
    hardware = root / "usr/local/lib/simlab"
    hardware.mkdir(parents=True, exist_ok=True)
    shutil.copy(HARDWARE_DIR / "simlab-rdma.py", hardware / "simlab-rdma.py")
    shutil.copy(HARDWARE_DIR / "simlab-rdma.service", root / "etc/systemd/system/")
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/10-lab.conf").write_text(
        "PermitRootLogin no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
    )
    (root / "etc/sudoers.d/90-admin").write_text(f"{ADMIN_USER} ALL=(ALL) NOPASSWD:ALL\n")
    (root / "etc/sudoers.d/90-admin").chmod(0o440)
    # Ubuntu's default (network-manager ships it from 23.10): every netplan definition goes to
    # NetworkManager, which netplan's boot generator hands its profiles in /run (canonical/netplan
    # PR#378, doc "00-network-manager-all.yaml").
    (root / "usr/lib/netplan").mkdir(parents=True, exist_ok=True)
    (root / "usr/lib/netplan/00-network-manager-all.yaml").write_text(
        "network:\n  version: 2\n  renderer: NetworkManager\n"
    )
    # The Debian mirror cannot be reached from the lab; the hosts' only apt source is the lab's
    # stand-in of the DGX OS archive, written at boot.
    (root / "etc/apt/sources.list").write_text("")
    for path in (root / "etc/apt/sources.list.d").glob("*"):
        path.unlink()
    _chroot(
        root,
        f"""
        useradd --create-home --shell /bin/bash --groups sudo,docker {ADMIN_USER}
        passwd --lock {ADMIN_USER}
        rm -f /etc/ssh/ssh_host_*
        systemctl enable simlab-rdma.service
        # Timers that would take apt's lock in the middle of a deploy at random moments.
        systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer
        systemctl mask systemd-timesyncd.service getty@tty1.service console-getty.service
        # With fabric cables in but not configured, NM's DHCP on them holds boot for 60 s.
        systemctl disable NetworkManager-wait-online.service
        echo spark > /etc/hostname
        rm -f /etc/machine-id && touch /etc/machine-id
        """,
    )


# Another checkout's lab (a branch with another stand-in) may be using an older build right now:
# builds are removed only once no lab has used them for this long.
STALE_AFTER_S = 2 * 24 * 3600


def cached(path: Path) -> bool:
    """Whether `path` is built; marks it as used now, so that no other build removes it."""
    if not path.exists():
        return False
    os.utime(path)
    return True


def _unused(paths: Iterable[Path]) -> list[Path]:
    return [path for path in paths if time.time() - path.stat().st_mtime > STALE_AFTER_S]


def spark_base() -> Path:
    """The cached root filesystem of a bare Spark (built on first use)."""
    parts = [" ".join(SPARK_PACKAGES).encode(), inspect.getsource(_customize_spark).encode()]
    parts += [path.read_bytes() for path in sorted(HARDWARE_DIR.iterdir())]
    target = CACHE / f"spark-base-{cache_key(*parts)}"
    if cached(target):
        return target
    with building(target) as needed:
        if needed:
            ensure_host_tools()
            for stale in _unused(CACHE.glob("spark-base-*")):
                shutil.rmtree(stale, ignore_errors=True)
            staging = CACHE / "spark-base.staging"
            shutil.rmtree(staging, ignore_errors=True)
            _debootstrap(staging, SPARK_PACKAGES)
            log("customizing the bare Spark image")
            _customize_spark(staging)
            staging.rename(target)
    return target


def stand_in_repositories() -> Path:
    """The signed stand-in NVIDIA repositories (built on first use, whole or not at all, so
    that labs started side by side never see one half-written)."""
    from tests.simlab import standins

    source = Path(standins.__file__).parent
    inputs = sorted(source.rglob("*.py")) + sorted((source / "files").iterdir())
    target = CACHE / f"repos-{cache_key(*(path.read_bytes() for path in inputs))}"
    if target.exists():
        return target
    with building(target) as needed:
        if needed:
            staging = CACHE / "repos.staging"
            shutil.rmtree(staging, ignore_errors=True)
            standins.build_repositories(staging)
            staging.rename(target)
    return target


def serving_image_tar() -> Path:
    """The stand-in of NGC's default vLLM image as a tarball of its tree, built on first use:
    the bottom layer of every stand-in image the lab's registry serves (image_layers)."""
    from tests.simlab import llama_build, serving

    source = Path(serving.__file__).parent
    model = llama_build.lab_model()
    parts = [" ".join(SERVING_PACKAGES).encode()]
    parts += [path.read_bytes() for path in sorted(source.rglob("*.py"))]
    parts += [path.read_bytes() for path in serving.RELEASE_DATA]  # the data the image holds
    parts += [model.read_bytes()]  # the lab's GGUF model, which the `hf` stand-in writes
    parts += [serving.nccl_of(serving.SERVING_IMAGE_TAG).encode()]  # from the image table
    tar = IMAGES / f"serving-image-{cache_key(*parts)}.tar"
    if not cached(tar):
        with building(tar) as needed:
            if needed:
                _build_serving_image(tar, model)
    return tar


def image_layers(tag: str) -> list[Path]:
    """The stand-in image `tag` (one of the deploy's table, or the llama.cpp image
    serving.LLAMA_IMAGE_TAG) as its layers' tarballs, bottom first: the default image's tree,
    and for another image a layer over it that removes what that image lacks and adds its own
    files (its vLLM release, its NCCL), as NGC's images share their base layers."""
    from tests.simlab import llama_build, serving

    base = serving_image_tar()
    if tag == serving.SERVING_IMAGE_TAG:
        return [base]
    if tag == serving.LLAMA_IMAGE_TAG:
        # Named after the build (its key is its inputs'): another build, another layer.
        binary = llama_build.llama_server()
        add = serving.llama_server_adder(binary)
        return [base, _layer(base, binary.parent.name, serving.NOT_IN_LLAMA_IMAGE, add)]
    ray = serving.IMAGES[tag].ray
    release, nccl = serving.release_of(tag), serving.nccl_of(tag)
    release_file = serving.RELEASE_FILE.relative_to("/")

    def add(staging: Path) -> list[Path]:
        for path, text in ((release_file, release), (serving.TORCH_NCCL_FILE, nccl)):
            (staging / path).parent.mkdir(parents=True)
            (staging / path).write_text(text + "\n")
        return [release_file, serving.TORCH_NCCL_FILE]

    gone = () if ray else serving.RAY_PATHS
    return [base, _layer(base, f"{release}{'' if ray else '-noray'}-nccl{nccl}", gone, add)]


def _layer(base: Path, name: str, gone: Iterable[Path], add: Callable[[Path], list[Path]]) -> Path:
    """A layer over the base image's tree, built once: a whiteout for each path `gone` (an
    empty `.wh.<name>` beside it: the OCI image spec's layer format, which docker applies)
    and what `add` writes into an empty tree (the relative paths it returns)."""
    tar = base.with_name(f"{base.stem}-{name}-layer.tar")
    if cached(tar):
        return tar
    with building(tar) as needed:
        if needed:
            partial = tar.with_suffix(".partial")
            with tempfile.TemporaryDirectory() as staging:
                added = add(Path(staging))
                whiteouts = [path.parent / f".wh.{path.name}" for path in gone]
                for whiteout in whiteouts:
                    (Path(staging) / whiteout).parent.mkdir(parents=True, exist_ok=True)
                    (Path(staging) / whiteout).touch()
                subprocess.run(["tar", "-C", staging, "--owner=0", "--group=0", "-cf",
                                str(partial), *(f"./{p}" for p in [*whiteouts, *added])],
                               check=True)  # fmt: skip
            partial.rename(tar)
    return tar


def layer_blob(layer: Path) -> dict:
    """A layer's tarball gzipped as a registry keeps it (built once, beside it): its file, the
    digest and size of the gzipped blob, and the digest of the tar it unpacks to (the image
    config's diff_id: the OCI image spec)."""
    blob = layer.with_name(layer.name + ".gz")
    facts = layer.with_name(layer.name + ".gz.json")
    if not cached(facts):
        with building(facts) as needed:
            if needed:
                partial = blob.with_suffix(".partial")
                # mtime 0: the same tar gives the same blob, and so the same digest.
                with (
                    open(layer, "rb") as source,
                    open(partial, "wb") as out,
                    gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0) as packed,
                ):
                    shutil.copyfileobj(source, packed, 1 << 20)
                partial.rename(blob)
                digests = {"digest": _sha256(blob), "diff_id": _sha256(layer)}
                facts.write_text(json.dumps(digests | {"size": blob.stat().st_size}))
    return json.loads(facts.read_text()) | {"file": str(blob)}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _build_serving_image(tar: Path, gguf_model: Path) -> None:
    from tests.simlab import serving

    ensure_host_tools()
    IMAGES.mkdir(parents=True, exist_ok=True)
    for stale in _unused(IMAGES.glob("serving-image-*")):  # layers and blobs too
        stale.unlink()
    root = CACHE / "serving-rootfs"
    shutil.rmtree(root, ignore_errors=True)
    _debootstrap(root, SERVING_PACKAGES)
    log("adding Ray and the vllm stand-in to the serving image")
    serving.assemble_serving_rootfs(root, gguf_model)
    partial = tar.with_suffix(".partial")
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."],
                   check=True)  # fmt: skip
    partial.rename(tar)
    shutil.rmtree(root, ignore_errors=True)

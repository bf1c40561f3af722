"""The lab's container registry: the distribution's `docker-registry` package (registry 2.8,
unpacked, not installed) run on this machine at the management bridge's address, port 443,
with a certificate from the lab's own authority. It serves the stand-in serving images under
their real names: the lab writes the registries' names (nvcr.io, ghcr.io) into each host's
/etc/hosts as this address and the authority into docker's /etc/docker/certs.d/<name>/ca.crt
(prepare_disk), so a host's `docker pull nvcr.io/nvidia/vllm:26.04-py3` is a real pull, by
digests the registry computed. It listens on the lab's bridge only: nothing beyond this
machine and the lab's namespaces reaches it.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import io
import json
import os
import platform
import shutil
import signal
import ssl
import subprocess
import tarfile
import time
from pathlib import Path

from tests.simlab.paths import STATE, log
from tests.simlab.rootfs import image_layers, layer_blob, unpacked_package
from tests.simlab.waits import until

PORT = 443  # a name without a port is pulled from port 443 (docker pull's documentation)
DIR = STATE / "registry"
AUTHORITY = DIR / "ca.crt"
# The image manifest and config docker pulls (the distribution's "Image Manifest V2, Schema 2").
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
# What docker sets where an image has no PATH (moby's oci defaults: DefaultPathEnv).
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}  # uname -m to the OCI's GOARCH names


def images() -> list[str]:
    """Every image the registry serves: the deploy's table of NGC images and the llama.cpp one."""
    from tests.simlab import serving

    return [*serving.IMAGES, serving.LLAMA_IMAGE_TAG]


def names() -> list[str]:
    """The registries of those images' names (what the hosts resolve to the lab's registry)."""
    return sorted({image.split("/", 1)[0] for image in images()})


def split(image: str) -> tuple[str, str, str]:
    """registry, repository and tag of registry/repository:tag."""
    registry, _, path = image.partition("/")
    repository, _, tag = path.rpartition(":")
    return registry, repository, tag


def ensure_authority(address: str) -> None:
    """The lab's authority and the registry's certificate for its names and `address` (made
    once per lab, with openssl)."""
    if (DIR / "registry.crt").exists():
        return
    DIR.mkdir(parents=True, exist_ok=True)
    key, csr = DIR / "registry.key", DIR / "registry.csr"
    quiet = {"check": True, "stdin": subprocess.DEVNULL, "capture_output": True}
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
         "-keyout", str(DIR / "ca.key"), "-out", str(AUTHORITY),
         "-subj", f"/CN=simlab {STATE.name} authority",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"], **quiet,
    )  # fmt: skip
    sans = ",".join([*(f"DNS:{name}" for name in names()), f"IP:{address}"])
    subprocess.run(
        ["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(csr), "-subj", f"/CN={names()[0]}", "-addext", f"subjectAltName={sans}",
         "-addext", "extendedKeyUsage=serverAuth"], **quiet,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(AUTHORITY), "-CAkey",
         str(DIR / "ca.key"), "-CAcreateserial", "-days", "30", "-copy_extensions", "copy",
         "-out", str(DIR / "registry.crt.partial")], **quiet,
    )  # fmt: skip
    (DIR / "registry.crt.partial").rename(DIR / "registry.crt")


def config(address: str) -> dict:
    """The registry's configuration (the distribution's configuration.md): its storage in the
    lab's state, TLS, the bridge's address only, no authentication."""
    return {
        "version": 0.1,
        "log": {"level": "info", "fields": {"service": "simlab-registry"}},
        "storage": {"filesystem": {"rootdirectory": str(DIR / "data")}},
        "http": {
            "addr": f"{address}:{PORT}",
            "tls": {"certificate": str(DIR / "registry.crt"), "key": str(DIR / "registry.key")},
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
    }


def _pid() -> int | None:
    """The running registry's pid (its pid file, checked against the process's command)."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        pid = int((DIR / "pid").read_text())
        if b"docker-registry" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


def binary() -> Path:
    """The distribution's registry program (its package unpacked into the cache once)."""
    return unpacked_package("docker-registry") / "usr/bin/docker-registry"


def start(address: str) -> None:
    """Run the registry (unless it runs) and wait until it answers; then push the images it
    lacks."""
    ensure_authority(address)
    if _pid() is None:
        (DIR / "config.yml").write_text(json.dumps(config(address), indent=2))  # JSON is YAML
        with open(DIR / "registry.log", "ab") as logfile:
            process = subprocess.Popen(
                [str(binary()), "serve", str(DIR / "config.yml")], stdin=subprocess.DEVNULL,
                stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        (DIR / "pid").write_text(f"{process.pid}\n")
    try:  # the API's version check: 200 where no authentication is set
        until(lambda: request(address, "GET", "/v2/")[0] == 200, 30, "the registry", every=0.2)
    except TimeoutError:
        tail = (DIR / "registry.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(
            f"the lab's registry did not answer at {address}:{PORT}:\n{tail}"
        ) from None
    push_all(address)


def stop() -> None:
    """Stop the registry (what a registry that is down looks like to the hosts)."""
    pid = _pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists():
                break
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
    (DIR / "pid").unlink(missing_ok=True)


def remove() -> None:
    """Stop the registry and remove its images and certificates (the lab is going down)."""
    stop()
    shutil.rmtree(DIR, ignore_errors=True)


def request(
    address: str, method: str, path: str, body: object = None, headers: dict | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request to the registry's API, trusting only the lab's authority."""
    context = ssl.create_default_context(cafile=str(AUTHORITY))
    connection = http.client.HTTPSConnection(address, PORT, context=context, timeout=300)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        connection.close()


def image_config(tag: str, diff_ids: list[str]) -> bytes:
    """The image's configuration (the OCI image spec's config: platform, Dockerfile settings,
    the layers' diff_ids)."""
    from tests.simlab.serving import image_changes

    settings: dict = {"Env": [DEFAULT_PATH]}
    for change in image_changes(tag):  # Dockerfile lines: ENV, WORKDIR, ENTRYPOINT
        word, _, value = change.partition(" ")
        if word == "ENV":
            settings["Env"].append(value)
        elif word == "WORKDIR":
            settings["WorkingDir"] = value
        elif word == "ENTRYPOINT":
            settings["Entrypoint"] = json.loads(value)
    return json.dumps(
        {
            "architecture": ARCHITECTURES.get(platform.machine(), platform.machine()),
            "os": "linux",
            "config": settings,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        },
        sort_keys=True,
    ).encode()


def push_blob(address: str, repository: str, digest: str, body: object, size: int) -> None:
    """A blob into the repository unless there: mounted from another repository that has it,
    else uploaded whole (the registry API: HEAD, then POST ?mount=&from=, else POST and PUT)."""
    if request(address, "HEAD", f"/v2/{repository}/blobs/{digest}")[0] == 200:
        return
    for other in _pushed_repositories(address):
        status, headers, _body = request(
            address, "POST", f"/v2/{repository}/blobs/uploads/?mount={digest}&from={other}"
        )
        if status == 201:
            return
        with contextlib.suppress(KeyError):  # an upload the mount started instead: cancel it
            request(address, "DELETE", headers["Location"])
    status, headers, answer = request(address, "POST", f"/v2/{repository}/blobs/uploads/")
    if status != 202:
        raise RuntimeError(f"registry: upload to {repository} refused: {status} {answer!r}")
    location = headers["Location"]
    status, _h, answer = request(
        address, "PUT", f"{location}{'&' if '?' in location else '?'}digest={digest}", body,
        {"Content-Type": "application/octet-stream", "Content-Length": str(size)},
    )  # fmt: skip
    if status != 201:
        raise RuntimeError(f"registry: blob {digest} to {repository}: {status} {answer!r}")


def _pushed_repositories(address: str) -> list[str]:
    """The registry's repositories (its catalog endpoint)."""
    status, _headers, body = request(address, "GET", "/v2/_catalog")
    return json.loads(body)["repositories"] if status == 200 else []


def layer_blobs(image: str) -> list[dict]:
    """The stand-in `image`'s layers as the registry keeps them (rootfs.layer_blob), bottom
    first: built into the cache on first use."""
    return [layer_blob(layer) for layer in image_layers(image)]


def push(address: str, image: str, extra: list[dict] | None = None) -> str:
    """The stand-in `image` into the registry under its own name (its layers, config and
    manifest); the manifest's digest the registry answers. With `extra` (filler_layer's), those
    layers go on top and the manifest is pushed by its digest alone: the tag keeps its image."""
    _registry, repository, tag = split(image)
    blobs = layer_blobs(image) + (extra or [])
    for layer in blobs:
        with open(layer["file"], "rb") as body:
            push_blob(address, repository, layer["digest"], body, layer["size"])
    settings = image_config(image, [layer["diff_id"] for layer in blobs])
    config_digest = f"sha256:{hashlib.sha256(settings).hexdigest()}"
    push_blob(address, repository, config_digest, settings, len(settings))
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "size": len(settings), "digest": config_digest},
            "layers": [
                {"mediaType": LAYER_TYPE, "size": layer["size"], "digest": layer["digest"]}
                for layer in blobs
            ],
        }
    ).encode()
    reference = f"sha256:{hashlib.sha256(manifest).hexdigest()}" if extra else tag
    status, headers, answer = request(
        address, "PUT", f"/v2/{repository}/manifests/{reference}", manifest,
        {"Content-Type": MANIFEST_TYPE},
    )  # fmt: skip
    if status != 201:
        raise RuntimeError(f"registry: manifest of {image}: {status} {answer!r}")
    return headers["Docker-Content-Digest"]


def filler_layer(size: int, directory: Path) -> dict:
    """A layer of `size` random bytes (one file, opt/simlab-filler: gzip cannot shrink it, so
    a pull downloads `size` bytes) gzipped into `directory`, in layer_blob's form."""
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        entry = tarfile.TarInfo("opt/simlab-filler")
        entry.size = size
        archive.addfile(entry, io.BytesIO(os.urandom(size)))
    blob = directory / "filler.tar.gz"
    blob.write_bytes(gzip.compress(tar.getvalue(), compresslevel=1, mtime=0))
    return {
        "file": str(blob),
        "digest": f"sha256:{hashlib.sha256(blob.read_bytes()).hexdigest()}",
        "diff_id": f"sha256:{hashlib.sha256(tar.getvalue()).hexdigest()}",
        "size": blob.stat().st_size,
    }


def throttle_commands(device: str, mbit: int | None) -> list[list[str]]:
    """tc commands that slow what the registry sends through `device` (the lab's bridge) to
    `mbit`, or (None) undo it: an htb qdisc whose unclassified traffic goes out unshaped
    (tc-htb(8): default 0, "sent directly"), a class of `mbit`, and the registry's packets
    (source port PORT, tc-u32(8)) filtered into it. (This machine's kernel has no prio qdisc.)"""
    if mbit is None:
        return [["tc", "qdisc", "del", "dev", device, "root"]]
    return [
        ["tc", "qdisc", "replace", "dev", device, "root", "handle", "1:", "htb"],
        ["tc", "class", "replace", "dev", device, "parent", "1:", "classid", "1:4", "htb",
         "rate", f"{mbit}mbit", "ceil", f"{mbit}mbit"],
        ["tc", "filter", "replace", "dev", device, "parent", "1:", "protocol", "ip", "prio", "1",
         "u32", "match", "ip", "sport", str(PORT), "0xffff", "flowid", "1:4"],
    ]  # fmt: skip


def throttle(device: str, mbit: int | None) -> None:
    """The registry slowed to `mbit` on `device` (a pull that can be cut), or back to full."""
    for command in throttle_commands(device, mbit):
        subprocess.run(command, check=mbit is not None, capture_output=True)


def digest(address: str, image: str) -> str | None:
    """The digest the registry serves `image`'s tag by (None: it has no such tag)."""
    _registry, repository, tag = split(image)
    status, headers, _body = request(
        address, "HEAD", f"/v2/{repository}/manifests/{tag}", headers={"Accept": MANIFEST_TYPE}
    )
    return headers.get("Docker-Content-Digest") if status == 200 else None


def push_all(address: str) -> None:
    """Every image the registry lacks, pushed (once per lab: its storage is the lab's)."""
    for image in images():
        if digest(address, image) is None:
            started = time.monotonic()
            pushed = push(address, image)
            log(f"registry: pushed {image} ({pushed[:19]}) in {time.monotonic() - started:.1f}s")

"""Serving images: pulled from their registry when absent, room checked first, a digest pin
verified, a failed pull naming its registry."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import util
from operations.asked import Question, answer, question
from operations.lanes import LocalImages, local_name
from spark.box_paths import PULL_STATUS_DIR, pull_status, pull_unit

# docker's image sizes are decimal (`docker image ls`: go-units HumanSize, 1000 a step).
GB = 1000**3
PULL_SOURCE = Path(__file__).parents[1] / "files" / "spark_pull.py"
PULL_SCRIPT = "/usr/local/lib/spark/spark_pull.py"
WAIT_SECONDS = 2  # between the deploy's looks at a pull's unit


class RegistryImage(FactBase):
    """What the image's registry says of it (`docker manifest inspect -v`, docker's own client:
    the box's credentials and trusted authorities): ``layers``, each layer's digest and size in
    the manifest for this box's architecture (a manifest list names one manifest per platform)
    and ``size``, their sum, else ``error``, the registry's answer as docker prints it.

    .. code:: python

        {"size": 163146892, "layers": {"sha256:11f4...": 163146892}}
        {"error": "Get \"https://nvcr.io/v2/\": dial tcp 10.77.1.1:443: connect: refused"}
    """

    def command(self, image: str) -> str:
        # A pin asked as repo@sha256:... alone: given repo:tag@sha256:..., docker's client asks
        # the registry for the tag's manifest (docker/cli registry/client/fetcher.go,
        # getManifestOptionsFromReference: a tagged reference is fetched by its tag), which is
        # another manifest once the tag moved ("unsupported manifest format" on the lab).
        return (
            'echo "arch $(dpkg --print-architecture)";'
            f' docker manifest inspect -v {shlex.quote(local_name(image))} 2>&1; echo "exit $?"'
        )

    def process(self, output: list[str]) -> dict[str, object]:
        arch = output[0].removeprefix("arch ") if output else ""
        body = output[1:-1]
        if output[-1:] != ["exit 0"]:
            return {"error": " ".join(line.strip() for line in body) or "no answer"}
        entries = json.loads("\n".join(body))
        if isinstance(entries, dict):  # an image of one platform
            entries = [entries]
        for entry in entries:
            platform = entry.get("Descriptor", {}).get("platform", {})
            if len(entries) == 1 or platform.get("architecture") == arch:
                manifest = entry.get("SchemaV2Manifest") or entry.get("OCIManifest") or {}
                layers = {layer["digest"]: layer["size"] for layer in manifest.get("layers", [])}
                return {"size": sum(layers.values()), "layers": layers}
        return {"error": f"no manifest for this box's architecture ({arch})"}


class DockerRoom(FactBase):
    """docker's data root, its free bytes, and each image's size in bytes with its names and
    whether a container (running or not) uses it.

    .. code:: python

        {"root": "/var/lib/docker", "free": 53687091200,
         "images": [{"id": "sha256:9f...", "size": 441602671,
                     "names": ["nvcr.io/nvidia/vllm:26.04-py3"], "used": True}]}
    """

    def command(self) -> str:
        return (
            "root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null)"
            ' && echo "root $root" && echo "free $(df -B1 --output=avail "$root" | tail -n 1)";'
            " docker image inspect --format"
            " 'image {{.Id}} {{.Size}} {{range .RepoTags}}{{.}},{{end}}'"
            " $(docker image ls --quiet --no-trunc | sort -u) 2>/dev/null;"
            " docker ps --all --quiet --no-trunc | xargs -r docker inspect"
            " --format 'used {{.Image}}' 2>/dev/null; true"
        )

    def process(self, output: list[str]) -> dict:
        room: dict = {"root": None, "free": None, "images": []}
        used = {line.split()[1] for line in output if line.startswith("used ")}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "root":
                room["root"] = rest
            elif kind == "free" and rest.strip().isdigit():
                room["free"] = int(rest)
            elif kind == "image":
                image_id, size, *names = rest.split(" ")
                room["images"].append(
                    {"id": image_id, "size": int(size),
                     "names": [name for name in ",".join(names).split(",") if name],
                     "used": image_id in used}
                )  # fmt: skip
        return room


def gb(size: int) -> str:
    return f"{size / GB:.1f} GB"


def unused_images(room: dict, most: int = 3) -> list[str]:
    """The biggest images no container uses (what `docker image prune -a` would remove:
    docker's documentation), at most ``most``, each with its size."""
    unused = sorted((i for i in room["images"] if not i["used"]), key=lambda i: -i["size"])
    return [
        f"{(image['names'] or [image['id'][:19]])[0]} ({gb(image['size'])})"
        for image in unused[:most]
    ]


def too_little_room(image: str, size: int, room: dict) -> str | None:
    """Why the box cannot take ``image`` of ``size`` bytes (the registry's layers), or None."""
    if room["free"] is None or size <= room["free"]:
        return None
    unused = unused_images(room)
    return (
        f"{host.name}: {image} needs {gb(size)} (its layers, from the registry's manifest) but"
        f" docker's data root {room['root']} has {gb(room['free'])} free; the biggest images no"
        " container uses: "
        + (", ".join(unused) + " (docker image rm <image>)" if unused else "none")
    )


@operation()
def images_pruned(keep: list[str]):
    """
    Remove the images no container uses and no lane of the box names (prune_unused), saying
    each with its size. An image without a tag is left: a digest pin's keeps none (lanes.py
    local_name), and DockerRoom does not tell it from another.

    + keep: the serving images of the box's lanes
    """
    names = {name.partition("@")[0] for name in keep}
    unused = [
        image
        for image in answer(DockerRoom)["images"]
        if image["names"] and not image["used"] and not names & set(image["names"])
    ]
    if not unused:
        host.noop("no image is unused")
        return
    for image in unused:
        host.log(f"{', '.join(image['names'])}: removed ({gb(image['size'])}, no lane uses it)")
        yield f"docker image rm {shlex.quote(image['id'])}"


def verify_pin(image: str, box: str) -> str:
    """For ``repo:tag@sha256:...``: fail unless the image's RepoDigests hold repo@sha256:...
    (what docker records of the manifest it pulled: `docker image inspect`)."""
    pinned = shlex.quote(local_name(image))
    lacking = shlex.quote(f"{box}: {image}: its RepoDigests lack the pin after the pull")
    return (
        "docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}'"
        f" {pinned} 2>/dev/null | grep -qxF {pinned} || {{ echo {lacking} >&2; exit 1; }}"
    )


@operation()
def image_present(image: str):
    """
    Make sure the serving image is on the box: pulled from its registry when absent, never
    when present. A tag is not followed when it moves (NGC keeps a release's tag, but a
    registry may move one): pin the digest (``repo:tag@sha256:...``), and the box pulls that
    manifest, verified by its RepoDigests, wherever it holds another.

    + image: registry/repository:tag, or pinned: registry/repository:tag@sha256:...

    Before the pull: the registry's answer (a box that cannot reach it stops naming it) and the
    image's size against docker's free space (too little stops the box naming both and the
    biggest unused images).
    """
    if local_name(image) in answer(LocalImages):
        pinned = "its RepoDigests hold the pin" if "@" in image else "its tag is not followed"
        host.noop(f"{image} is present ({pinned})")
        return
    found = answer(RegistryImage, image=image)
    if "error" in found:
        registry = util.registry_of(image)
        yield from util.refused(
            f"{host.name}: {image}: its registry {registry} answers: {found['error']}"
        )
        return
    problem = too_little_room(image, int(found["size"]), answer(DockerRoom))
    if problem:
        yield from util.refused(problem)
        return
    yield from util.put(str(PULL_SOURCE), PULL_SCRIPT, "755")
    unit = pull_unit(image)
    # Shown without -v (a noop's words are not), before the deploy waits.
    host.log(
        f"{image}: {gb(int(found['size']))} pulled in {unit}; watch it with"
        f" `journalctl -fu {unit}`, {pull_status(image)} or `make status`"
    )
    yield pulled_in_unit(image, found["layers"], host.name)
    if "@" in image:
        yield verify_pin(image, host.name)


def pulled_in_unit(image: str, layers: dict[str, int], box: str) -> str:
    """Shell that pulls ``image`` (its manifest's ``layers``: digest and size, for its
    progress) in its transient unit (files/spark_pull.py, run by
    systemd-run: a deploy cut off leaves it running) unless that unit runs already (a deploy cut
    before: it is waited for, never started twice), then waits for it to end; failing, one line
    on stderr naming the box, the registry and docker's answer (the status file's error).
    --collect: the unit is unloaded once it ends, failed or not (systemd-run(1)), so the next
    pull can take its name."""
    unit, status = shlex.quote(pull_unit(image)), shlex.quote(pull_status(image))
    start = " ".join(
        shlex.quote(word)
        for word in (
            "systemd-run", "--quiet", "--collect", f"--unit={pull_unit(image)}",
            f"--description=Spark pull of {image}", "--property=Nice=10",
            "/usr/bin/python3", PULL_SCRIPT, image, "--status", pull_status(image),
            *(word for digest, size in layers.items() for word in ("--layer", f"{digest}={size}")),
        )
    )  # fmt: skip
    read = shlex.quote(
        "import json, sys; s = json.load(open(sys.argv[1]));"
        " print(s['error'] if s['state'] == 'failed' else s['state'])"
    )
    failed = shlex.quote(
        f"{box}: docker pull {image} from registry {util.registry_of(image)} failed:"
    )
    return (
        f"if ! systemctl is-active --quiet {unit}; then"
        f" install -d -m 755 {PULL_STATUS_DIR} && rm -f {status}"
        f" && {{ systemctl reset-failed {unit} 2>/dev/null; {start}; }} || exit 1; fi;"
        f" while systemctl is-active --quiet {unit}; do sleep {WAIT_SECONDS}; done;"
        f" said=$(python3 -c {read} {status} 2>/dev/null);"
        f' [ "$said" = done ] || {{ echo {failed} "${{said:-{unit} ended without a status:'
        f' journalctl -u {unit}}}" >&2; exit 1; }}'
    )


def questions() -> list[Question]:
    """What ``image_present`` reads of a box that holds its image (operations/asked.py); the
    registry and the room are asked only where it must pull, a change anyway."""
    return [question(LocalImages)]

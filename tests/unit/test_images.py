"""Serving images: the registry's answer, the room for a pull, the pull, a digest pin.

Captures (each fact's own command, run under sudo on the simulated lab, Debian 12, docker
20.10, against the lab's registry, docker-registry 2.8, serving the stand-in images):
- lab-registryimage-2604.txt: RegistryImage of nvcr.io/nvidia/vllm:26.04-py3 on a bare box.
- lab-registryimage-registry-down.txt: the same with the registry stopped.
- lab-registryimage-no-such-tag.txt: RegistryImage of a tag the registry lacks.
- lab-dockerroom-*.txt: DockerRoom on a bare box and on a deployed one.
- registryimage-manifest-list.sample.txt: written by hand in the form of the lab's capture: a
  manifest list (NGC's images are multi-platform) as `docker manifest inspect -v` prints one,
  an entry per platform, on an arm64 box (a Spark's dpkg architecture).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from operations import images, lanes, preflight, util
from tests.unit.harness import FakeHost, captured, file_facts, process, refusal, run_op

IMAGE = "nvcr.io/nvidia/vllm:26.04-py3"
# The digest the lab's registry answered for its 26.04 stand-in (lab-registryimage-2604.txt).
DIGEST = "sha256:a03a7626fd6eff6c0c06deff5bdccc5eded3b613e29ff851fddd5212b181b729"
PINNED = f"{IMAGE}@{DIGEST}"
# `docker image ls --digests` lines in LocalImages' format on the lab: pulled by tag (the
# registry's digest beside it), pulled by digest (docker keeps no tag: `<none>`).
BY_TAG = f"image {IMAGE} {DIGEST}\n"
BY_DIGEST = f"image nvcr.io/nvidia/vllm:<none> {DIGEST}\n"
OTHER_DIGEST = "image nvcr.io/nvidia/vllm:26.04-py3 sha256:" + "e" * 64 + "\n"
ROOM = captured("lab-dockerroom-bare.txt")
SIZE = 163146892  # the lab's manifest: one layer (lab-registryimage-2604.txt)
# Its layer (lab-registryimage-2604.txt's manifest).
LAYER = "sha256:e5f9dfe23a9993dfe08e8705bf2e12954d131f04c9e4537d31d74c7c91361c50"
LAYERS = {LAYER: SIZE}
# The pull script on the box as the deploy leaves it (RootFiles' line: owner, mode, SHA-1).
SCRIPT = (
    f"{images.PULL_SCRIPT}\troot root 755"
    f" {hashlib.sha1(images.PULL_SOURCE.read_bytes()).hexdigest()}\n"
)
UNIT = "spark-pull-nvcr.io--nvidia--vllm:26.04-py3.service"
STATUS = "/var/lib/spark/pull/nvcr.io--nvidia--vllm:26.04-py3.json"


def test_the_registrys_size_is_the_sum_of_the_layers() -> None:
    # The lab's manifest has one layer of 163146892 bytes (docker manifest inspect -v).
    assert process(images.RegistryImage, captured("lab-registryimage-2604.txt")) == {
        "size": 163146892, "layers": {LAYER: 163146892}
    }  # fmt: skip


def test_a_pin_is_asked_of_the_registry_by_its_digest_alone() -> None:
    # lanes.local_name: repo@digest; a tag beside the digest would be fetched by the tag.
    command = images.RegistryImage().command(image=PINNED)
    assert f"docker manifest inspect -v nvcr.io/nvidia/vllm@{DIGEST} 2>&1" in command
    assert f"docker manifest inspect -v {IMAGE} 2>&1" in images.RegistryImage().command(image=IMAGE)


def test_a_manifest_list_gives_the_boxs_platform() -> None:
    # arm64's entry: a 9e9-byte layer and a 1000-byte one (amd64's first layer is 7e9).
    found = process(images.RegistryImage, captured("registryimage-manifest-list.sample.txt"))
    assert found == {
        "size": 9_000_001_000,
        "layers": {"sha256:" + "2" * 64: 9_000_000_000, "sha256:" + "3" * 64: 1000},
    }


@pytest.mark.parametrize(
    ("capture", "error"),
    [
        (
            "lab-registryimage-registry-down.txt",
            'failed to configure transport: error pinging v2 registry: Get "https://nvcr.io/v2/":'
            " dial tcp 10.77.61.1:443: connect: connection refused",
        ),
        ("lab-registryimage-no-such-tag.txt", "no such manifest: nvcr.io/nvidia/vllm:26.99-py3"),
    ],
)
def test_the_registrys_answer_when_it_has_no_manifest(capture: str, error: str) -> None:
    assert process(images.RegistryImage, captured(capture)) == {"error": error}


def test_docker_room_on_a_bare_box() -> None:
    # df -B1 of /var/lib/docker on the lab (the machine's disk), no image, no container.
    assert process(images.DockerRoom, ROOM) == {
        "root": "/var/lib/docker", "free": 44120031232, "images": []
    }  # fmt: skip


def test_docker_room_on_a_deployed_box() -> None:
    room = process(images.DockerRoom, captured("lab-dockerroom-deployed.txt"))
    assert room["root"] == "/var/lib/docker"
    serving = [image for image in room["images"] if IMAGE in image["names"]]
    # The 26.04 stand-in: the lanes' containers run it, docker inspect's Size in bytes.
    assert len(serving) == 1 and serving[0]["used"] and serving[0]["size"] == 441602671


def facts(local: str | None, registry: str = "lab-registryimage-2604.txt") -> dict:
    return {
        lanes.LocalImages: local,
        images.RegistryImage: captured(registry),
        images.DockerRoom: ROOM,
        util.RootFiles: SCRIPT,
    }


def test_an_image_present_is_not_pulled_nor_asked_of_the_registry() -> None:
    host = FakeHost({lanes.LocalImages: BY_TAG})  # any other fact asked would fail the test
    assert run_op(images.image_present, host=host, image=IMAGE) == []
    assert host.noops == [f"{IMAGE} is present (its tag is not followed)"]


def test_an_absent_image_is_pulled_in_its_unit_saying_where_to_watch() -> None:
    host = FakeHost(facts(None))
    commands = run_op(images.image_present, host=host, image=IMAGE)
    assert commands == [images.pulled_in_unit(IMAGE, LAYERS, "spark-test")]
    assert host.logs == [
        f"{IMAGE}: 0.2 GB pulled in {UNIT}; watch it with `journalctl -fu {UNIT}`, {STATUS} or"
        " `make status`"
    ]


def test_the_pull_script_is_uploaded_where_it_is_missing() -> None:
    host = FakeHost(facts(None) | file_facts({images.PULL_SCRIPT: None}))
    commands = run_op(images.image_present, host=host, image=IMAGE)
    assert host.uploads[images.PULL_SCRIPT] == images.PULL_SOURCE.read_text()
    assert commands[-1] == images.pulled_in_unit(IMAGE, LAYERS, "spark-test")


def unit_run(tmp_path: Path, active: int, status: dict | None) -> subprocess.CompletedProcess:
    """pulled_in_unit's shell with systemctl and systemd-run written down (a unit active for
    ``active`` looks, then gone as --collect leaves it), the status file in ``tmp_path``."""
    log = tmp_path / "log"
    status_file = tmp_path / "status.json"
    if status is not None:
        status_file.write_text(json.dumps(status))
    fakes = (
        f"n={active}; install() {{ :; }}; sleep() {{ :; }};"
        f' systemctl() {{ echo "systemctl $*" >> {log};'
        ' if [ "$1" = is-active ]; then'
        " [ $n -gt 0 ] && { n=$((n - 1)); return 0; }; return 3; fi; };"
        f" systemd-run() {{ printf '%s\\n' \"$@\" >> {log}; }}; rm() {{ :; }};"
    )
    command = images.pulled_in_unit(IMAGE, LAYERS, "spark-1").replace(STATUS, str(status_file))
    return subprocess.run(["bash", "-c", fakes + command], capture_output=True, text=True)


def test_a_pull_not_running_is_started_in_its_unit_and_waited_for(tmp_path: Path) -> None:
    done = unit_run(tmp_path, 0, {"state": "done", "error": ""})
    assert (done.returncode, done.stderr) == (0, "")
    log = (tmp_path / "log").read_text().splitlines()
    # is-active (no), reset-failed, systemd-run's words one a line, is-active (gone).
    assert log[:2] == [f"systemctl is-active --quiet {UNIT}", f"systemctl reset-failed {UNIT}"]
    assert log[2:-1] == [
        "--quiet", "--collect", f"--unit={UNIT}", f"--description=Spark pull of {IMAGE}",
        "--property=Nice=10", "/usr/bin/python3", images.PULL_SCRIPT, IMAGE, "--status",
        str(tmp_path / "status.json"), "--layer", f"{LAYER}={SIZE}",
    ]  # fmt: skip
    assert log[-1] == f"systemctl is-active --quiet {UNIT}"


def test_a_pull_running_already_is_waited_for_not_started_again(tmp_path: Path) -> None:
    done = unit_run(tmp_path, 3, {"state": "done", "error": ""})
    assert done.returncode == 0
    log = (tmp_path / "log").read_text().splitlines()
    assert log == [f"systemctl is-active --quiet {UNIT}"] * 4  # running, waited twice, gone


def test_a_failed_pull_names_the_box_registry_and_dockers_answer(tmp_path: Path) -> None:
    refused = 'Get "https://nvcr.io/v2/": dial tcp 10.77.61.1:443: connect: connection refused'
    done = unit_run(tmp_path, 0, {"state": "failed", "error": refused})
    assert (done.returncode, done.stderr) == (
        1, f"spark-1: docker pull {IMAGE} from registry nvcr.io failed: {refused}\n"
    )  # fmt: skip


def test_a_unit_that_left_no_status_says_where_to_look(tmp_path: Path) -> None:
    done = unit_run(tmp_path, 0, None)
    assert (done.returncode, done.stderr) == (
        1,
        f"spark-1: docker pull {IMAGE} from registry nvcr.io failed: {UNIT} ended without a"
        f" status: journalctl -u {UNIT}\n",
    )


def test_a_registry_that_does_not_answer_stops_the_box_naming_it() -> None:
    host = FakeHost(facts(None, "lab-registryimage-registry-down.txt"))
    assert refusal(run_op(images.image_present, host=host, image=IMAGE)) == (
        "spark-test: nvcr.io/nvidia/vllm:26.04-py3: its registry nvcr.io answers: failed to"
        ' configure transport: error pinging v2 registry: Get "https://nvcr.io/v2/": dial tcp'
        " 10.77.61.1:443: connect: connection refused"
    )


def test_a_pin_present_by_its_digest_is_left() -> None:
    host = FakeHost({lanes.LocalImages: BY_DIGEST})
    assert run_op(images.image_present, host=host, image=PINNED) == []
    assert host.noops == [f"{PINNED} is present (its RepoDigests hold the pin)"]


@pytest.mark.parametrize("local", [None, BY_TAG.replace(DIGEST, "<none>"), OTHER_DIGEST])
def test_a_pin_is_pulled_by_digest_and_verified_where_the_box_lacks_it(local: str | None) -> None:
    # Absent, present by the tag only (imported: no digest), or the tag moved (another digest).
    commands = run_op(images.image_present, host=FakeHost(facts(local)), image=PINNED)
    assert commands == [
        images.pulled_in_unit(PINNED, LAYERS, "spark-test"), images.verify_pin(PINNED, "spark-test")
    ]  # fmt: skip
    # The unit's name and the script's argument: the whole pin.
    assert f"spark-pull-nvcr.io--nvidia--vllm:26.04-py3-sha256:{DIGEST[7:]}.service" in commands[0]
    assert f" {PINNED} --status" in commands[0]


@pytest.mark.parametrize(
    ("repo_digests", "code"),
    [([f"nvcr.io/nvidia/vllm@{DIGEST}"], 0), (["nvcr.io/nvidia/vllm@sha256:" + "e" * 64], 1)],
)
def test_the_pin_is_verified_by_the_images_repo_digests(repo_digests: list[str], code: int) -> None:
    # `docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}'`: one a line.
    printed = "".join(f"echo {digest}; " for digest in repo_digests)
    fake = f"docker() {{ {printed}}}"
    check = images.verify_pin(PINNED, "spark-1")
    done = subprocess.run(["bash", "-c", f"{fake}; {check}"], capture_output=True, text=True)
    assert done.returncode == code
    assert done.stderr == ("" if code == 0 else f"spark-1: {PINNED}: its RepoDigests lack the pin"
                           " after the pull\n")  # fmt: skip


def room_with(free: int) -> str:
    """DockerRoom's lines (its command's format) for a box with `free` bytes and three images:
    two unused (2 GB and 5 GB) and the one the lanes run (12 GB)."""
    return (
        f"root /var/lib/docker\nfree {free}\n"
        "image sha256:aaaa 2000000000 ghcr.io/x/small:1,\n"
        "image sha256:bbbb 5000000000 nvcr.io/nvidia/vllm:26.05-py3,\n"
        "image sha256:cccc 12000000000 nvcr.io/nvidia/vllm:26.04-py3,mirror/vllm:26.04,\n"
        "used sha256:cccc\n"
    )


def test_docker_room_lines() -> None:
    room = process(images.DockerRoom, room_with(10))
    assert room["free"] == 10
    assert room["images"][2] == {
        "id": "sha256:cccc", "size": 12000000000, "used": True,
        "names": ["nvcr.io/nvidia/vllm:26.04-py3", "mirror/vllm:26.04"],
    }  # fmt: skip
    assert [image["used"] for image in room["images"]] == [False, False, True]


def test_too_little_room_stops_the_box_naming_both_numbers_and_the_unused_images() -> None:
    host = FakeHost(facts(None) | {images.DockerRoom: room_with(100_000_000)})
    # 163146892 bytes of layers (the lab's manifest) against 0.1 GB free.
    assert refusal(run_op(images.image_present, host=host, image=IMAGE)) == (
        "spark-test: nvcr.io/nvidia/vllm:26.04-py3 needs 0.2 GB (its layers, from the registry's"
        " manifest) but docker's data root /var/lib/docker has 0.1 GB free; the biggest images"
        " no container uses: nvcr.io/nvidia/vllm:26.05-py3 (5.0 GB), ghcr.io/x/small:1 (2.0 GB)"
        " (docker image rm <image>)"
    )


def test_room_enough_pulls() -> None:
    host = FakeHost(facts(None) | {images.DockerRoom: room_with(163146892)})  # exactly enough
    assert run_op(images.image_present, host=host, image=IMAGE) == [
        images.pulled_in_unit(IMAGE, LAYERS, "spark-test")
    ]


@pytest.mark.parametrize(
    ("printed", "layers"),
    [
        # What the lab's docker 20.10 printed for an image it lacks, and for the 26.10 stand-in.
        ("", None),
        (
            '["sha256:d8d5","sha256:cf28"]',
            hashlib.sha256(b'["sha256:d8d5","sha256:cf28"]\n').hexdigest(),  # sha256sum's line
        ),
    ],
)
def test_image_layers_of_an_absent_image_is_none(printed: str, layers: str | None) -> None:
    fake = f"docker() {{ echo '{printed}'; }}"
    command = preflight.ImageLayers().command(image=IMAGE)
    done = subprocess.run(["bash", "-c", f"{fake}; {command}"], capture_output=True, text=True)
    found = process(preflight.ImageLayers, done.stdout)
    assert found == layers


def test_prune_removes_the_images_no_container_uses_nor_lane_names_saying_each() -> None:
    # room_with's images: small:1 and vllm:26.05 unused; 26.04 used. The lanes name 26.05 (a
    # pinned name keeps its tag part), so small:1 alone goes.
    host = FakeHost({images.DockerRoom: room_with(10)})
    keep = ["nvcr.io/nvidia/vllm:26.05-py3@sha256:0e4c", "nvcr.io/nvidia/vllm:26.04-py3"]
    commands = run_op(images.images_pruned, keep, host=host)
    assert commands == ["docker image rm sha256:aaaa"]
    assert host.logs == ["ghcr.io/x/small:1: removed (2.0 GB, no lane uses it)"]


def test_prune_leaves_an_untagged_image_and_says_when_nothing_is_unused() -> None:
    # An image without a tag (a digest pin's: docker keeps none) is never removed.
    room = "root /var/lib/docker\nfree 10\nimage sha256:dddd 3000000000 \n"
    host = FakeHost({images.DockerRoom: room})
    assert run_op(images.images_pruned, [], host=host) == []
    assert host.noops == ["no image is unused"]

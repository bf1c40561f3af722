"""Serving images pulled from the lab's registry (issue 29), on the deployed pair: the deploy
from bare pulled the serving image by its registry's digest; a lane pinned to that digest
converges and a second run changes nothing; a pull cut half way by a reboot leaves no image and
the lane on its old one, and the next deploy converges; with the registry stopped, a box that
needs an image stops naming the registry and docker's answer, no traceback, its lanes left
running.

Tests in this module run in order; the last one starts the registry again.
"""

from __future__ import annotations

import json
import re
import runpy
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spark.box_paths import pull_status, pull_unit
from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import INVENTORY, output_of
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab
from tests.simlab import registry
from tests.simlab.paths import REPO
from tests.simlab.rootfs import image_layers, layer_blob
from tests.simlab.serving import SERVING_IMAGE_TAG
from tests.simlab.waits import until

pytestmark = pytest.mark.lab

LANES = runpy.run_path(str(REPO / "group_data/all.py"))["lanes"]
# The cut pull: the 26.04 stand-in and a layer of FILLER random bytes, the registry slowed to
# SLOW_MBIT (4 MB/s: 12 s for the layer), the box rebooted once CUT_AT bytes are in.
FILLER = 48 * 2**20
SLOW_MBIT = 32
CUT_AT = 8 * 2**20


def deploy(lanes: list[dict], check: bool = True) -> subprocess.CompletedProcess:
    return pyinfra(INVENTORY, "deploy.py", "--data", "lanes=" + json.dumps(lanes), check=check)


def repo_digests(host: simlab.Host, image: str) -> list[str]:
    found = run_on(host, f"sudo docker image inspect --format '{{{{json .RepoDigests}}}}' {image}")
    return json.loads(found)


def test_the_deploy_pulled_the_serving_image_from_the_registry(deployed_lab: Deployed) -> None:
    # Nothing else puts an image on a lab box: the deploy's pull recorded the registry's digest.
    served = registry.digest(simlab.REGISTRY_ADDRESS, SERVING_IMAGE_TAG)
    assert served and served.startswith("sha256:")
    for host in deployed_lab.lab.hosts:
        assert repo_digests(host, SERVING_IMAGE_TAG) == [f"nvcr.io/nvidia/vllm@{served}"]


def test_a_digest_pin_converges_and_a_second_run_changes_nothing(deployed_lab: Deployed) -> None:
    served = registry.digest(simlab.REGISTRY_ADDRESS, SERVING_IMAGE_TAG)
    pinned = [LANES[0], LANES[1] | {"image": f"{SERVING_IMAGE_TAG}@{served}"}]
    output = output_of(deploy(pinned))
    # The boxes hold that manifest (RepoDigests): verified, not pulled again (pyinfra's results:
    # hosts, success, error, no change); the lane follows.
    row = rf"Serving image {re.escape(pinned[1]['image'])}\s+2\s+-\s+-\s+2\s"
    assert re.search(row, output), output
    for host in deployed_lab.lab.hosts:
        container = run_on(host, "sudo docker inspect --format '{{.Config.Image}}' spark-lane-fast")
        assert container.strip() == f"{SERVING_IMAGE_TAG}@{served}"
    assert changes(deploy(pinned)) == 0


def pulled(host: simlab.Host, image: str) -> dict:
    """The pull's status file on the box (files/spark_pull.py), {} before it is written."""
    text = run_on(host, f"sudo cat {pull_status(image)} 2>/dev/null; true").strip()
    return json.loads(text) if text else {}


def test_a_pull_cut_half_way_leaves_no_image_and_the_next_deploy_converges(
    deployed_lab: Deployed, tmp_path: Path
) -> None:
    host = deployed_lab.lab.hosts[0]
    filler = registry.filler_layer(FILLER, tmp_path)
    digest = registry.push(simlab.REGISTRY_ADDRESS, SERVING_IMAGE_TAG, [filler])
    pinned = f"{SERVING_IMAGE_TAG}@{digest}"
    lanes = [LANES[0], LANES[1] | {"image": pinned}]
    base = layer_blob(image_layers(SERVING_IMAGE_TAG)[0])["size"]
    registry.throttle(simlab.MGMT_BRIDGE, SLOW_MBIT)
    try:
        with ThreadPoolExecutor(1) as pool:
            data = ("--data", "lanes=" + json.dumps(lanes))
            cut = pool.submit(
                pyinfra, INVENTORY, "deploy.py", "--limit", host.name, *data, check=False
            )
            # The base layer counts whole at once (on the box already): CUT_AT of the filler in.
            status = until(
                lambda: (now := pulled(host, pinned)).get("done", 0) >= base + CUT_AT and now,
                120, "the pull at its cut", every=0.5,
                hopeless=lambda: cut.done() and output_of(cut.result()),
            )  # fmt: skip
            simlab.reboot(host.name)
            result = cut.result()
    finally:
        registry.throttle(simlab.MGMT_BRIDGE, None)
    # The box reported the pull as it ran: the registry's total, bytes in, a rate.
    print(f"\ncut at {status['done']} of {status['total']} bytes, {status['rate'] / 1e6:.1f} MB/s")
    # The rate counts what came over the wire: the base layer, on the box already, is none of it.
    assert status["state"] == "pulling" and 0 < status["rate"] < 1.5 * SLOW_MBIT * 1e6 / 8
    assert status["total"] == base + filler["size"] > status["done"]
    output = output_of(result)
    assert result.returncode != 0 and f"pulled in {pull_unit(pinned)}" in output, output
    # No half image: docker registers none until every layer is in; the lane's unit still
    # runs the image it ran (the deploy stopped at the pull, before the lanes).
    listed = run_on(host, "sudo docker image ls --digests --no-trunc --format '{{.Digest}}'")
    assert digest not in listed.split()
    unit = run_on(host, "systemctl cat spark-lane-fast")
    assert digest not in unit and SERVING_IMAGE_TAG in unit
    # The next deploy pulls it whole (every box), the lane follows; one more changes nothing.
    deploy(lanes)
    for each in deployed_lab.lab.hosts:
        container = run_on(each, "sudo docker inspect --format '{{.Config.Image}}' spark-lane-fast")
        assert container.strip() == pinned
        assert pulled(each, pinned)["state"] == "done"
    assert changes(deploy(lanes)) == 0
    # The lab as the deployed lab expects it: its lanes, without the pulled image.
    deploy(LANES)
    for each in deployed_lab.lab.hosts:
        run_on(each, f"sudo docker image rm nvcr.io/nvidia/vllm@{digest}")


def test_the_registry_stopped_stops_each_box_naming_it(deployed_lab: Deployed) -> None:
    # A pin to a manifest the boxes lack: each asks the registry, which is down.
    missing = f"{SERVING_IMAGE_TAG}@sha256:{'0' * 64}"
    registry.stop()
    try:
        result = deploy([LANES[0], LANES[1] | {"image": missing}], check=False)
    finally:
        registry.start(simlab.REGISTRY_ADDRESS)
    output = output_of(result)
    assert result.returncode == 1 and "Traceback" not in output, output
    for host in deployed_lab.lab.hosts:
        stopped = (
            f"{host.name}: {missing}: its registry nvcr.io answers: failed to configure transport:"
            f' error pinging v2 registry: Get "https://nvcr.io/v2/": dial tcp'
            f" {simlab.REGISTRY_ADDRESS}:443: connect: connection refused"
        )
        assert stopped in output, output
        # Stopped before the lanes' units: the lane runs its image as before.
        state = run_on(host, "systemctl is-active spark-lane-fast").strip()
        assert state == "active"

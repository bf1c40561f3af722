"""The weights as background fetches on the lab's pair, from the lab's hub stand-in (lab.py runs
it; tests/simlab/hub.py), slowed here so that a fetch takes measurable time and can be cut:
a deploy whose lanes' models are missing returns showing each fetch's progress, the lanes start
once their models land, a second deploy changes nothing, and a fetch cut by a reboot goes on
from where it was."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import INVENTORY, output_of
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab
from tests.simlab.serving import hf_standin

pytestmark = pytest.mark.lab

# group_data's two lanes and their models (seed 003).
LANES = {
    "coder": "bullpoint/Qwen3-Coder-Next-AWQ-4bit",
    "fast": "inference-optimization/Qwen3.6-35B-A3B-NVFP4",
}
WEIGHTS = f"{LANES['coder']}/model.safetensors"
# What a deploy says of a running fetch (operations/weights.py progress).
PROGRESS = re.compile(r"(\S+): [\d.]+ of [\d.]+ GB \(\d+%\), \d+ MB/s: fetching")
# Slow enough that both boxes' four weights files (1 GiB) take a minute: the deploy returns first.
SLOW = 16 * 2**20
MODELS = "/var/lib/spark/models"
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the lab's bridge, direct


def hub(path: str, data: bytes | None = None) -> dict:
    request = urllib.request.Request(
        f"{simlab.hub_url()}/_simlab/{path}", data=data, method="PUT" if data else "GET"
    )
    with HTTP.open(request, timeout=10) as answer:
        return json.load(answer)


def models_removed(deployed: Deployed, *lanes: str) -> None:
    """The lanes stopped and their models gone from every box, as on a box never fetched."""
    units = " ".join(f"spark-lane-{lane}.service" for lane in lanes)
    caches = " ".join(f"{MODELS}/hub/models--{LANES[lane].replace('/', '--')}" for lane in lanes)
    for host in deployed.lab.hosts:
        run_on(host, f"sudo systemctl stop {units}; sudo rm -rf {caches}")


def active(host: simlab.Host, lane: str) -> bool:
    state = run_on(host, f"systemctl is-active spark-lane-{lane}.service", check=False)
    return state.strip() == "active"


def wait_active(deployed: Deployed, lanes: list[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    waiting = [(host, lane) for host in deployed.lab.hosts for lane in lanes]
    while waiting := [(host, lane) for host, lane in waiting if not active(host, lane)]:
        assert time.monotonic() < deadline, f"not serving after {seconds} s: {waiting}"
        time.sleep(2)


@pytest.fixture
def slow_hub() -> object:
    hub("rate", str(SLOW).encode())
    yield
    hub("rate", str(simlab.HUB_RATE).encode())


def test_a_deploy_returns_while_the_models_fetch_and_the_lanes_start_once_landed(
    deployed_lab: Deployed, slow_hub: object
) -> None:
    models_removed(deployed_lab, *LANES)
    before = hub("stats")["downloads"].get(WEIGHTS, 0)
    started = time.monotonic()
    result = pyinfra(INVENTORY, "deploy.py")
    took = time.monotonic() - started
    output = output_of(result)
    assert took < 60, output
    # Each box and model: its fetch started, with what it has of the hub's total.
    for model in LANES.values():
        assert re.search(rf"{re.escape(model)}: .*fetch started \(spark-fetch-", output), output
    assert not all(active(host, "coder") for host in deployed_lab.lab.hosts)
    # A deploy while the fetches run: their progress, nothing changed.
    again = pyinfra(INVENTORY, "deploy.py")
    progress = PROGRESS.findall(output_of(again))
    assert set(progress) <= set(LANES.values()) and progress, output_of(again)
    assert changes(again) == 0, output_of(again)
    wait_active(deployed_lab, list(LANES), 240)
    # Each box fetched each model once: no file fetched twice.
    assert hub("stats")["downloads"][WEIGHTS] - before == len(deployed_lab.lab.hosts)
    assert changes(pyinfra(INVENTORY, "deploy.py")) == 0


def test_a_fetch_cut_by_a_reboot_goes_on_from_where_it_was(
    deployed_lab: Deployed, slow_hub: object
) -> None:
    host = deployed_lab.lab.hosts[0]
    models_removed(deployed_lab, "coder")
    sent_before = hub("stats")["sent"].get(WEIGHTS, 0)
    pyinfra(INVENTORY, "deploy.py")
    blob = hf_standin.repo_file(LANES["coder"], "model.safetensors").blob
    partial = f"{MODELS}/hub/models--{LANES['coder'].replace('/', '--')}/blobs/{blob}.incomplete"
    deadline = time.monotonic() + 120
    while int(run_on(host, f"stat -c %s {partial} 2>/dev/null || echo 0").strip() or 0) < 2**26:
        assert time.monotonic() < deadline, "the fetch did not reach 64 MiB in 120 s"
        time.sleep(1)
    simlab.reboot(host.name)
    kept = int(run_on(host, f"stat -c %s {partial} 2>/dev/null || echo 0").strip() or 0)
    assert kept >= 2**26  # the partial file outlived the reboot
    hub("rate", str(simlab.HUB_RATE).encode())
    wait_active(deployed_lab, ["coder"], 240)  # both boxes: the other's fetch went on alone
    stats = hub("stats")
    assert any(offset >= 2**26 for offset in stats["resumed"][WEIGHTS]), stats
    # Both boxes' copies came over the wire once each, plus what the cut left in flight.
    assert stats["sent"][WEIGHTS] - sent_before < 2.25 * hf_standin.WEIGHTS_BYTES, stats
    assert changes(pyinfra(INVENTORY, "deploy.py")) == 0

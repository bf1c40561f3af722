"""The weights as background fetches on the lab's pair, from the lab's hub stand-in (lab.py runs
it; tests/simlab/hub.py), each lane's weights held part way there until the test releases them
(a stalled link), so that the test, not the machine's load, decides when a fetch lands: a
deploy whose lanes' models are missing returns showing each fetch's progress, the lanes start
once their models land, a second deploy changes nothing, and a fetch cut by a reboot goes on
from where it was."""

from __future__ import annotations

import json
import re
import statistics
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import INVENTORY, output_of
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab
from tests.simlab.serving import hf_standin
from tests.simlab.waits import patiently, until

pytestmark = pytest.mark.lab

# group_data's two lanes and their models (seed 003).
LANES = {
    "coder": "bullpoint/Qwen3-Coder-Next-AWQ-4bit",
    "fast": "inference-optimization/Qwen3.6-35B-A3B-NVFP4",
}
WEIGHTS = f"{LANES['coder']}/model.safetensors"
SLUG = LANES["coder"].replace("/", "--")
# What a deploy says of a running fetch (operations/weights.py progress).
PROGRESS = re.compile(r"(\S+): [\d.]+ of [\d.]+ GB \(\d+%\), \d+ MB/s: fetching")
# Where the hub holds a lane's weights (256 MiB): past a fetch's first reads, short of landing; a
# multiple of spark_fetch.py's reads (CHUNK, SPLIT_CHUNK), so a box writes exactly this much.
HOLD_AT = 2**26
MODELS = "/var/lib/spark/models"
ROUNDS = 3  # the copy rate's measurement: medians of three
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the lab's bridge, direct


def hub(path: str, data: bytes | None = None) -> dict:
    request = urllib.request.Request(
        f"{simlab.hub_url()}/_simlab/{path}", data=data, method="PUT" if data else "GET"
    )

    def ask() -> dict:
        with HTTP.open(request, timeout=10) as answer:
            return json.load(answer)

    return patiently(ask, 60, request.full_url)


def models_removed_from(host: simlab.Host, *lanes: str) -> None:
    """The lanes stopped and their models gone, as on a box never fetched."""
    units = " ".join(f"spark-lane-{lane}.service" for lane in lanes)
    caches = " ".join(f"{MODELS}/hub/models--{LANES[lane].replace('/', '--')}" for lane in lanes)
    run_on(host, f"sudo systemctl stop {units}; sudo rm -rf {caches}")


def models_removed(deployed: Deployed, *lanes: str) -> None:
    for host in deployed.lab.hosts:
        models_removed_from(host, *lanes)


def active(host: simlab.Host, lane: str) -> bool:
    state = run_on(host, f"systemctl is-active spark-lane-{lane}.service", check=False)
    return state.strip() == "active"


def wait_active(deployed: Deployed, lanes: list[str], seconds: float) -> None:
    waiting = [(host, lane) for host in deployed.lab.hosts for lane in lanes]

    def all_serving() -> bool:
        waiting[:] = [(host, lane) for host, lane in waiting if not active(host, lane)]
        return not waiting

    until(all_serving, seconds, f"lanes {lanes} serving", every=2)


def weights_of(*lanes: str) -> dict[str, int]:
    """The hub's holds of these lanes' weights (`<id>/<file>`: HOLD_AT)."""
    return {f"{LANES[lane]}/model.safetensors": HOLD_AT for lane in lanes}


@pytest.fixture
def hold() -> Iterator[Callable[[dict[str, int]], None]]:
    """Sets the hub's holds (tests/simlab/hub.py); every one released after the test, whatever
    became of it, so that no later fetch waits on them."""

    def holds(files: dict[str, int]) -> None:
        hub("holds", json.dumps(files).encode())

    yield holds
    holds({})


def holding() -> set[str]:
    """The files whose transfers the hub holds now."""
    return set(hub("stats")["holding"])


def test_a_deploy_returns_while_the_models_fetch_and_the_lanes_start_once_landed(
    deployed_lab: Deployed, hold: Callable[[dict[str, int]], None]
) -> None:
    models_removed(deployed_lab, *LANES)
    held = weights_of(*LANES)
    hold(held)
    stats = hub("stats")
    before, sent_before = stats["downloads"].get(WEIGHTS, 0), stats["sent"]
    output = output_of(pyinfra(INVENTORY, "deploy.py"))
    stats = hub("stats")
    print(f"\nhub after the deploy: {stats}")
    print(
        "\n".join(
            line
            for line in output.splitlines()
            if "fetch" in line or "Lane" in line or "lands" in line or "] " in line
        )
    )
    # It returned while no weights could land (held): not one weights file sent whole, no lane
    # started.
    for file in held:
        assert stats["sent"].get(file, 0) - sent_before.get(file, 0) < hf_standin.WEIGHTS_BYTES
    assert not any(active(host, lane) for host in deployed_lab.lab.hosts for lane in LANES)
    # Each box and model: its fetch started, with what it has of the hub's total.
    for model in LANES.values():
        assert re.search(rf"{re.escape(model)}: .*fetch started \(spark-fetch-", output), output
    # A deploy while both fetches run (at their holds, each status written before it asked for
    # a byte): their progress, nothing changed.
    until(lambda: holding() == set(held), 120, "both lanes' weights at their hold")
    again = pyinfra(INVENTORY, "deploy.py")
    progress = PROGRESS.findall(output_of(again))
    assert set(progress) == set(LANES.values()), output_of(again)
    assert changes(again) == 0, output_of(again)
    hold({})
    wait_active(deployed_lab, list(LANES), 240)
    # From the hub once, to spark-1; spark-2 copied it from spark-1 over the fabric.
    assert hub("stats")["downloads"][WEIGHTS] - before == 1
    assert changes(pyinfra(INVENTORY, "deploy.py")) == 0


def test_the_fleet_copy_rate_against_the_fabrics_raw_rate(deployed_lab: Deployed) -> None:
    """Measured, not judged (issue 29's target: 50% or more): printed for the README. After the
    unit's copy, ROUNDS rounds on spark-2 of the same blob from spark-1's server, each one
    command: curl to /dev/null (raw) and spark_fetch.py of that file alone into a scratch cache
    (its own rate from the first byte asked to the file checked and in place)."""
    first, second = deployed_lab.lab.hosts
    models_removed_from(second, "coder")
    before = hub("stats")["downloads"].get(WEIGHTS, 0)
    pyinfra(INVENTORY, "deploy.py")
    wait_active(deployed_lab, ["coder"], 120)
    assert hub("stats")["downloads"][WEIGHTS] == before  # all of it over the fabric
    status = json.loads(run_on(second, f"cat /var/lib/spark/fetch/{SLUG}.json"))
    assert status["state"] == "done"
    address = run_on(first, "ip -4 -o address show enp1s0f1np1").split()[3].split("/")[0]
    blob = hf_standin.repo_file(LANES["coder"], "model.safetensors").blob
    source = f"http://{address}:60991"
    unit = f"/etc/systemd/system/spark-fetch-{SLUG}.service"
    endpoint = run_on(second, f"grep -o -- '--endpoint [^ ]*' {unit}").split()[1]
    raws, copies = [], []
    for _ in range(ROUNDS):
        size, seconds = run_on(
            second,
            "curl -fsS -o /dev/null -w '%{size_download} %{time_total}'"
            f" {source}/models--{SLUG}/blobs/{blob}",
        ).split()
        assert int(size) == hf_standin.WEIGHTS_BYTES
        raws.append(int(size) / float(seconds))
        scratch = "/var/tmp/copyrate"
        run_on(
            second,
            f"sudo rm -rf {scratch}; sudo python3 /usr/local/lib/spark/spark_fetch.py"
            f" {LANES['coder']} model.safetensors --cache {scratch} --endpoint {endpoint}"
            f" --source {source}/models--{SLUG}/blobs --status {scratch}.json >/dev/null",
        )
        copy = json.loads(run_on(second, f"cat {scratch}.json; sudo rm -rf {scratch}*"))
        assert copy["state"] == "done" and copy["done"] == hf_standin.WEIGHTS_BYTES, copy
        copies.append(copy["rate"])
    raw, copied = statistics.median(raws), statistics.median(copies)
    print(
        f"\nfleet copy (the unit) {status['rate'] / 1e6:.0f} MB/s; over {ROUNDS} rounds, raw"
        f" fabric (curl of the blob) {[round(r / 1e6) for r in raws]} MB/s, median"
        f" {raw / 1e6:.0f}; copy (spark_fetch.py, hashed and written)"
        f" {[round(c / 1e6) for c in copies]} MB/s, median {copied / 1e6:.0f}:"
        f" {100 * copied / raw:.0f}%"
    )


def test_a_fetch_cut_by_a_reboot_goes_on_from_where_it_was(
    deployed_lab: Deployed, hold: Callable[[dict[str, int]], None]
) -> None:
    host = deployed_lab.lab.hosts[0]
    models_removed(deployed_lab, "coder")
    hold(weights_of("coder"))
    sent_before = hub("stats")["sent"].get(WEIGHTS, 0)
    pyinfra(INVENTORY, "deploy.py")
    blob = hf_standin.repo_file(LANES["coder"], "model.safetensors").blob
    partial = f"{MODELS}/hub/models--{LANES['coder'].replace('/', '--')}/blobs/{blob}.incomplete"

    def kept() -> int:
        return int(run_on(host, f"stat -c %s {partial} 2>/dev/null || echo 0").strip() or 0)

    # Held at HOLD_AT, the box has written exactly that much once it has read it all.
    until(lambda: kept() == HOLD_AT, 120, "the fetch's partial file at the hold")
    # Its boot does not finish while the fetch is held: multi-user.target, which wants the
    # fetch unit, is ordered after it (systemd.target(5), default dependencies).
    simlab.reboot(host.name, finished=False)
    assert kept() == HOLD_AT  # it outlived the reboot
    hold({})
    wait_active(deployed_lab, ["coder"], 240)  # both boxes: spark-2's copy waited for spark-1
    stats = hub("stats")
    assert HOLD_AT in stats["resumed"][WEIGHTS], stats  # went on from there, not from 0
    # From the hub once (spark-2 copies from spark-1), plus what the cut left in flight.
    assert stats["sent"][WEIGHTS] - sent_before < 1.25 * hf_standin.WEIGHTS_BYTES, stats
    assert changes(pyinfra(INVENTORY, "deploy.py")) == 0


def test_a_box_without_room_is_stopped_naming_the_sizes_before_any_download(
    deployed_lab: Deployed,
) -> None:
    """spark-1's cache a 128 MiB tmpfs (put back after) holding 100 MiB of a model no lane
    uses: the coder's weights (the hub's listing: 256 MiB and its config) do not fit."""
    host = deployed_lab.lab.hosts[0]
    models_removed_from(host, "coder")
    unused = f"{MODELS}/hub/models--org--unused/blobs"
    run_on(
        host,
        f"sudo mount -t tmpfs -o size=128M tmpfs {MODELS}/hub && sudo mkdir -p {unused}"
        f" && sudo fallocate -l 100M {unused}/{'a' * 64}",
    )
    before = hub("stats")["downloads"].get(WEIGHTS, 0)
    try:
        refused = pyinfra(INVENTORY, "deploy.py", "--limit", host.name, check=False)
    finally:
        run_on(host, f"sudo umount {MODELS}/hub")
    output = output_of(refused)
    # What the hub's listing gives (tests/simlab/hub.py listing): each file's size.
    coder = LANES["coder"]
    needs = sum(hf_standin.repo_file(coder, n).size for n in hf_standin.repository_files(coder))
    assert refused.returncode != 0
    assert re.search(
        rf"{host.name}: no room for {re.escape(LANES['coder'])}: it needs {needs / 1e9:.1f} GB"
        rf" more \(the hub's listing\), {MODELS} has 0\.0 GB free; models no lane of this box"
        rf" uses, biggest first: org/unused \(0\.1 GB: {MODELS}/hub/models--org--unused\)",
        output,
    ), output
    assert hub("stats")["downloads"].get(WEIGHTS, 0) == before  # nothing asked of the hub
    # With room (the tmpfs gone), the same deploy fetches it and the lane starts.
    pyinfra(INVENTORY, "deploy.py", "--limit", host.name)
    until(lambda: active(host, "coder"), 120, "the coder lane serving", every=2)
    assert hub("stats")["downloads"][WEIGHTS] == before + 1

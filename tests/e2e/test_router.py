"""The fleet's router on the shared deployed lab (issue 38): LiteLLM's proxy, installed by the
deploy from the lab's package index on the head (spark-1), behind its front on router_port. The
lab's own inventory leaves the router off (inventories/sim.py says why): this module deploys
tests/e2e/router_inventory.py over it, and after it the lab's own inventory again, which takes
the router away (a drift test: the router removed by the deploy), instead of a reimage and the
next module's deploy from bare.

The lab's inventory serves group_data's two lanes on both boxes: each served name has a replica
on each box. Which lane answered a request is LiteLLM's `x-litellm-model-api-base` response
header (the deployment's api_base: the lane's URL through its box's front).
"""

from __future__ import annotations

import http.client
import json
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark import box_paths
from spark.plan import FleetEndpoint
from spark.router import CONFIG as ROUTER_CONFIG
from spark.router import ENVIRONMENT as ROUTER_ENVIRONMENT
from spark.router import UNIT as ROUTER_UNIT
from spark.router import VENV as ROUTER_VENV
from stages.settings import plan, read_inventory
from tests.conftest import Deployed, pyinfra, reimage_all, run_on
from tests.e2e.runs import output_of
from tests.e2e.test_clients import OPENCODE, make, run
from tests.e2e.test_host_layer import LANES, SEARCH, as_root, changes
from tests.simlab import lab as simlab
from tests.simlab.paths import REPO
from tests.simlab.waits import patiently, until

pytestmark = pytest.mark.lab

INVENTORY = "tests/e2e/router_inventory.py"

API_BASE = "x-litellm-model-api-base"  # LiteLLM's header: the deployment that answered
# The router's start after a reboot: the box's boot, its lanes, then LiteLLM's own start
# (61 to 95 s on this machine, README), on a machine other labs load.
BACK_AFTER_REBOOT_S = 600
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def routed(deployed_lab: Deployed) -> Iterator[Deployed]:
    """The deployed lab with the router turned on: one deploy adds it to the head. After the
    module, the lab's own inventory deployed again (fleet_router False) leaves no router on
    either box: its unit, its keys, its configuration, its port and key map on the front gone,
    the virtualenv kept (prune_unused False). Where that fails, the boxes are made bare, so the
    next module starts from bare (tests/conftest.py deployed_lab)."""
    result = pyinfra(INVENTORY, "deploy.py")
    yield Deployed(deployed_lab.lab, output_of(result))
    try:
        fleet = endpoint()
        restored = pyinfra("inventories/sim.py", "deploy.py", check=False)
        assert restored.returncode == 0, output_of(restored)[-3000:]
        for host in deployed_lab.lab.hosts:
            assert router_left(host) == {
                "unit": "ActiveState=inactive LoadState=not-found",
                "files": "",
                "virtualenv": "yes" if host.name == fleet.boxes[0].name else "no",
            }, host.name
        with pytest.raises(OSError):  # nginx listens on the router's port no more
            socket.create_connection(
                (deployed_lab.lab.host(fleet.boxes[0].name).mgmt_ip, fleet.port), TIMEOUT_S
            ).close()
    except BaseException:
        reimage_all(deployed_lab.lab)  # no router left behind for the modules after
        raise


def router_left(host: simlab.Host) -> dict[str, str]:
    """The router's unit as systemd knows it, which of its files are on the box (its keys,
    its configuration, nginx's key map of the fleet key), and whether its virtualenv is."""
    unit = run_on(host, f"systemctl show {ROUTER_UNIT} -p LoadState -p ActiveState")
    files = run_on(
        host,
        f"for path in {ROUTER_ENVIRONMENT} {ROUTER_CONFIG} /etc/nginx/spark-keys/_fleet.conf;"
        ' do sudo test -e "$path" && echo "$path"; done; true',
    )
    venv = run_on(host, f"sudo test -x {ROUTER_VENV}/bin/python && echo yes || echo no")
    return {
        "unit": " ".join(sorted(unit.split())),
        "files": files.strip(),
        "virtualenv": venv.strip(),
    }


def endpoint() -> FleetEndpoint:
    """The lab inventory's fleet endpoint, as the deploy planned it."""
    return plan(read_inventory(str(REPO / INVENTORY))).fleet


def fleet_key_of(router: simlab.Host) -> str:
    return run_on(router, f"sudo cat {endpoint().key_path}").strip()


def request(
    address: str, port: int, method: str, path: str, key: str | None, body: dict | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request to the router through the front."""
    connection = http.client.HTTPConnection(address, port, timeout=TIMEOUT_S)
    try:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        connection.request(method, path, body=json.dumps(body) if body else None, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def chat(
    address: str, port: int, key: str, model: str, stream: bool = False
) -> tuple[int, str, bytes]:
    """(status, the lane that answered, body) of a short chat through the router."""
    status, headers, body = request(
        address, port, "POST", "/v1/chat/completions", key,
        {"model": model, "max_tokens": 8, "stream": stream,
         "messages": [{"role": "user", "content": "What is 2 + 3?"}]},
    )  # fmt: skip
    return status, headers.get(API_BASE, ""), body


def test_one_url_lists_and_answers_every_model_of_both_boxes_behind_the_fleet_key(
    routed: Deployed,
) -> None:
    fleet = endpoint()
    router = routed.lab.host(fleet.boxes[0].name)
    key = fleet_key_of(router)
    where = (router.mgmt_ip, fleet.port)
    names = {route.served_name for route in fleet.routes}
    status, _, body = patiently(lambda: request(*where, "GET", "/v1/models", key), 120, "models")
    assert status == 200, body
    assert {card["id"] for card in json.loads(body)["data"]} == names
    # No key, and a wrong one: refused by the front (the fleet key on every path) before
    # LiteLLM, which asks it too (its master_key).
    assert request(*where, "GET", "/v1/models", None)[0] == 401
    assert request(*where, "GET", "/v1/models", "not-the-fleet-key")[0] == 401
    assert chat(*where, "not-the-fleet-key", "qwen3-coder-next")[0] == 401
    # Every served name answered, streaming to its [DONE], from a lane of each box: the
    # replicas share the requests (LiteLLM's simple-shuffle), so a few requests reach both.
    lanes = {backend.url for route in fleet.routes for backend in route.backends}
    answered: set[str] = set()
    for _ in range(40):
        for name in sorted(names):
            status, lane, body = chat(*where, key, name, stream=True)
            assert status == 200, body
            assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
            answered.add(lane)
        if answered == lanes:
            break
    assert answered == lanes


def test_opencode_configured_by_make_clients_lists_and_is_answered_every_model(
    routed: Deployed, tmp_path: Path
) -> None:
    """`make clients` (its default: the router's one provider, keyed by the fleet key), then the
    real OpenCode client (tests/e2e/test_clients.py drives it): every served name of both boxes
    listed through the one URL, each answered, a wrong fleet key refused; `make status`'s
    router row reads every served name over HTTP."""
    assert OPENCODE.exists(), "OpenCode is not installed: make .tools/opencode/.installed-*"
    fleet = endpoint()
    router = routed.lab.host(fleet.boxes[0].name)
    key = fleet_key_of(router)
    result = make(tmp_path, "stages.clients", inventory=INVENTORY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert key not in result.stdout + result.stderr
    directory = tmp_path / ".config/opencode"
    copied = directory / f"{router.name}-_fleet.key"
    assert copied.read_text() == key + "\n"
    assert stat.S_IMODE(copied.stat().st_mode) == 0o600
    assert sorted(path.name for path in directory.glob("*.key")) == [copied.name]
    provider = json.loads((directory / "opencode.json").read_text())["provider"]
    assert list(provider) == ["spark-fleet"]
    assert (
        provider["spark-fleet"]["options"]["baseURL"] == f"http://{router.mgmt_ip}:{fleet.port}/v1"
    )
    names = sorted(route.served_name for route in fleet.routes)
    assert sorted(provider["spark-fleet"]["models"]) == names

    listed = run(tmp_path, str(OPENCODE), "models")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert {f"spark-fleet/{name}" for name in names} <= set(listed.stdout.split()), listed.stdout
    for name in names:
        answer = run(tmp_path, str(OPENCODE), "run", "-m", f"spark-fleet/{name}", "ping")
        assert answer.returncode == 0, answer.stdout + answer.stderr
        # The stand-in's reply (tests/simlab/serving/vllm_standin.py chat_completions).
        assert f"stand-in, no model loaded] {name} got: " in answer.stdout

    status = make(tmp_path, "stages.status", inventory=INVENTORY)
    row = next(line for line in status.stdout.splitlines() if "(router)" in line)
    assert f"router up: {len(names)} of {len(names)} served names" in row, status.stdout

    copied.write_text("not-the-fleet-key\n")
    refused = run(tmp_path, str(OPENCODE), "run", "-m", f"spark-fleet/{names[0]}", "ping")
    assert refused.returncode != 0
    # The front's 401 on the router's port (templates/nginx-spark-lanes.conf.j2), as OpenCode
    # shows it.
    assert "the fleet router needs the fleet key" in refused.stdout + refused.stderr


def test_a_second_deploy_changes_nothing(routed: Deployed) -> None:
    again = pyinfra(INVENTORY, "deploy.py")
    assert changes(again) == 0, again.stdout


def test_a_replica_stopped_is_skipped_within_one_health_interval(routed: Deployed) -> None:
    fleet = endpoint()
    router = routed.lab.host(fleet.boxes[0].name)
    key = fleet_key_of(router)
    where = (router.mgmt_ip, fleet.port)
    route = next(route for route in fleet.routes if len(route.backends) > 1)
    stopped, kept = route.backends[1], route.backends[0]
    box = routed.lab.host(stopped.box)
    run_on(box, f"sudo systemctl stop spark-lane-{stopped.lane}.service")
    try:
        time.sleep(fleet.health_interval_s)  # one health check of every lane since
        # Retries on the other replica (router_settings num_retries) answer what reached the
        # stopped one before its check; every request is answered, by the one left.
        for _ in range(10):
            status, lane, body = chat(*where, key, route.served_name)
            assert (status, lane) == (200, kept.url), body
    finally:
        run_on(box, f"sudo systemctl start spark-lane-{stopped.lane}.service")


def test_a_reboot_of_the_routers_box_brings_the_endpoint_back(routed: Deployed) -> None:
    fleet = endpoint()
    simlab.reboot(fleet.boxes[0].name)
    router = simlab.Lab.load().host(fleet.boxes[0].name)
    key = fleet_key_of(router)

    def serving() -> bool:
        return chat(router.mgmt_ip, fleet.port, key, fleet.routes[0].served_name)[0] == 200

    until(serving, BACK_AFTER_REBOOT_S, "the router answering after its box's reboot", every=5)


def test_the_fleet_key_and_the_lane_keys_are_in_their_files_and_nowhere_else(
    routed: Deployed,
) -> None:
    """The router's box holds the fleet key and, in the router's environment file (root 0600,
    read by systemd), every lane's key of the fleet; no argv, unit file, journal, container,
    world-readable file or pyinfra output holds any of them (test_host_layer.py's search)."""
    fleet = endpoint()
    router = routed.lab.host(fleet.boxes[0].name)
    fleet_key = fleet_key_of(router)
    assert len(fleet_key) == 43  # 32 random bytes, base64 unpadded, as a lane's
    lane_keys = {
        (host.name, lane["name"]): run_on(host, f"sudo cat {box_paths.key_path(lane['name'])}")
        for host in routed.lab.hosts
        for lane in LANES
    }
    every = [fleet_key, *(key.strip() for key in lane_keys.values())]
    environment = run_on(router, f"sudo stat -c '%U %a' {ROUTER_ENVIRONMENT}").strip()
    assert environment == "root 600", environment
    for host in routed.lab.hosts:
        places = set(as_root(host, SEARCH, "".join(f"{secret}\n" for secret in every)).split("\n"))
        expected = {f"secret file {box_paths.key_path(lane['name'])}" for lane in LANES}
        if host.name == router.name:
            expected |= {f"secret file {box_paths.FLEET_KEY}", f"secret file {ROUTER_ENVIRONMENT}"}
        assert places - {""} == expected, f"{host.name}: secrets found in {places}"
    assert not [secret for secret in every if secret in routed.output], "a key in pyinfra's output"

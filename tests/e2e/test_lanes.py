"""The lanes on the simulated lab: group_data's two-lane appliance served by the stand-in image.

Tests in this module run in order on the session's lab; each later one stands on the state the
one before left (all lanes serving, as the inventory says, at the end of each).
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from endpoints import key_file
from operations import preflight
from spark import box_paths
from tests.conftest import CLIENTS, Deployed, pyinfra, run_on
from tests.e2e.test_clients import OPENCODE
from tests.e2e.test_clients import run as run_as_owner
from tests.e2e.test_compliance import compliance, not_passing
from tests.e2e.test_host_layer import changes
from tests.e2e.test_metrics import key_of as metrics_key_of
from tests.e2e.test_metrics import scrape
from tests.simlab import lab as simlab
from tests.simlab import loopback
from tests.simlab.paths import REPO, STATE
from tests.simlab.waits import patiently, until

pytestmark = pytest.mark.lab

INVENTORY = "inventories/sim.py"
LLAMA_INVENTORY = "tests/e2e/llama_inventory.py"
LANES: list[dict[str, Any]] = runpy.run_path(str(Path(REPO) / "group_data" / "all.py"))["lanes"]
A, B = LANES  # started in this order; B has the lower priority (the later lane)
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the lab is no proxy's


def unit(lane: dict[str, Any]) -> str:
    return f"spark-lane-{lane['name']}.service"


def request(url: str, key: str | None = None, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode())
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")

    def ask() -> tuple[int, Any]:
        try:
            with HTTP.open(req, timeout=10) as response:
                text = response.read().decode()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read().decode() or "null")

    return patiently(ask, 60, url)


def key_of(host: simlab.Host, lane: dict[str, Any]) -> str:
    return run_on(host, f"sudo cat /etc/spark/secrets/{lane['name']}.key")


def show(host: simlab.Host, lane: dict[str, Any], *properties: str) -> dict[str, str]:
    text = run_on(host, f"systemctl show -p {','.join(properties)} {unit(lane)}")
    return dict(line.split("=", 1) for line in text.splitlines())


def on_loopback(host: simlab.Host, lane: dict[str, Any], path: str, *curl: str) -> str:
    """What vLLM itself answers on the box's loopback, behind the front (port + 1000)."""
    url = f"http://127.0.0.1:{lane['port'] + 1000}{path}"
    return run_on(host, " ".join(["curl -s", *curl, url]), check=False)


def vllm_version(host: simlab.Host, lane: dict[str, Any]) -> str:
    return json.loads(on_loopback(host, lane, "/version"))["version"]


def container_id(host: simlab.Host, lane: dict[str, Any]) -> str:
    name = f"spark-lane-{lane['name']}"
    return run_on(host, f"sudo docker inspect -f '{{{{.Id}}}}' {name}", check=False).strip()


def deploy(*data: str) -> subprocess.CompletedProcess:
    """The deploy with `--data key=value` overrides, as a user tries a change on all boxes."""
    return pyinfra(INVENTORY, "deploy.py", *(arg for item in data for arg in ("--data", item)))


def lanes_data(*chosen: dict[str, Any]) -> str:
    return "lanes=" + json.dumps(list(chosen))


@pytest.fixture(scope="module")
def deployed(deployed_lab: Deployed) -> dict[str, Any]:
    return {"lab": deployed_lab.lab, "output": deployed_lab.output}


def test_lanes_come_up_in_order_and_serving(deployed: dict[str, Any]) -> None:
    for host in deployed["lab"].hosts:
        a, b = (
            show(host, lane, "ActiveState", "UnitFileState", "ActiveEnterTimestampMonotonic",
                 "ExecMainStartTimestampMonotonic")
            for lane in (A, B)
        )  # fmt: skip
        assert (a["ActiveState"], a["UnitFileState"]) == ("active", "enabled")
        assert (b["ActiveState"], b["UnitFileState"]) == ("active", "enabled")
        # B's container started only once A served ("active" is reached after /health).
        assert int(b["ExecMainStartTimestampMonotonic"]) >= int(a["ActiveEnterTimestampMonotonic"])
        for lane in (A, B):
            health = f"http://{host.mgmt_ip}:{lane['port']}/health"
            assert request(health, key_of(host, lane))[0] == 200
    # Started in one transaction, as at boot (multi-user.target wants both), systemd starts
    # them one after the other.
    host = deployed["lab"].hosts[0]
    run_on(
        host, f"sudo systemctl stop {unit(A)} {unit(B)} && sudo systemctl start multi-user.target"
    )
    until(
        lambda: all(show(host, lane, "ActiveState")["ActiveState"] == "active" for lane in (A, B)),
        60,
        "both lanes serving again",
    )
    a = show(host, A, "ActiveEnterTimestampMonotonic", "NRestarts")
    b = show(host, B, "ExecMainStartTimestampMonotonic", "NRestarts")
    assert (a["NRestarts"], b["NRestarts"]) == ("0", "0")
    assert int(b["ExecMainStartTimestampMonotonic"]) >= int(a["ActiveEnterTimestampMonotonic"])


def test_the_endpoints_table_and_the_client_configuration(deployed: dict[str, Any]) -> None:
    output = re.sub(r"\x1b\[[0-9;]*m", "", deployed["output"])
    table = output.split("--> Lanes serving:")[1]
    for host in deployed["lab"].hosts:
        for lane in (A, B):
            row = rf"{host.name}\s+{lane['name']}\s+vllm\s+{re.escape(lane['served_name'])}\s+"
            url = f"http://{host.mgmt_ip}:{lane['port']}/v1"
            assert re.search(row + re.escape(url), table), table
        client = json.loads((CLIENTS / f"{host.name}.json").read_text())
        provider = client["provider"][f"{host.name}-{A['name']}"]
        assert provider["options"]["baseURL"] == f"http://{host.mgmt_ip}:{A['port']}/v1"
        assert A["served_name"] in provider["models"]


def test_models_listed_with_the_key_and_401_without(deployed: dict[str, Any]) -> None:
    for host in deployed["lab"].hosts:
        for lane in (A, B):
            base = f"http://{host.mgmt_ip}:{lane['port']}/v1"
            key = key_of(host, lane)
            status, listing = request(f"{base}/models", key)
            assert status == 200
            assert [model["id"] for model in listing["data"]] == [lane["served_name"]]
            assert listing["data"][0]["max_model_len"] == lane["max_model_len"]
            assert request(f"{base}/models")[0] == 401
            assert request(f"{base}/models", "not-the-key")[0] == 401
            chat = {"model": lane["served_name"], "messages": [{"role": "user", "content": "hi"}]}
            assert request(f"{base}/chat/completions", key, chat)[0] == 200
        other = key_of(host, B)
        assert request(f"http://{host.mgmt_ip}:{A['port']}/v1/models", other)[0] == 401


def stream(url: str, key: str, body: Any) -> list[str]:
    """The data of each server-sent event of a streamed response, in order."""
    req = urllib.request.Request(url, data=json.dumps(body).encode())
    req.add_header("Authorization", f"Bearer {key}")
    with HTTP.open(req, timeout=10) as response:
        assert response.headers.get_content_type() == "text/event-stream"
        text = response.read().decode()
    return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]


def test_the_front_asks_the_key_on_every_path(deployed: dict[str, Any]) -> None:
    chat = {"model": A["served_name"], "messages": [{"role": "user", "content": "count to 3"}]}
    tokenize = {"prompt": "count to 3"}
    unguarded = [("/invocations", chat), ("/tokenize", tokenize), ("/metrics", None)]
    status = ["-o /dev/null -w '%{http_code}'", "-H 'Content-Type: application/json'"]
    for host in deployed["lab"].hosts:
        # vLLM itself answers these to anyone who reaches it (its key guards /v1 only)...
        for path, body in unguarded:
            data = [] if body is None else ["-d", shlex.quote(json.dumps(body))]
            assert on_loopback(host, A, path, *status, *data) == "200", path
        # ...but from the management network only the front is there, and it asks the key.
        base = f"http://{host.mgmt_ip}:{A['port']}"
        for path, body in [*unguarded, ("/v1/chat/completions", chat), ("/health", None)]:
            assert request(base + path, body=body)[0] == 401, path
            assert request(base + path, key_of(host, B), body)[0] == 401, path  # another's key
            assert request(base + path, "not-the-key", body)[0] == 401, path
        key = key_of(host, A)
        for path, body in unguarded:  # with the key, still: the front forwards /v1/ and /health
            assert request(base + path, key, body)[0] == 404, path
        with pytest.raises(urllib.error.URLError, match="Connection refused"):
            HTTP.open(f"http://{host.mgmt_ip}:{A['port'] + 1000}/health", timeout=10)
        # A streamed chat comes through whole: its events in order, [DONE] last.
        events = stream(f"{base}/v1/chat/completions", key, chat | {"stream": True})
        assert events[-1] == "[DONE]", events
        chunks = [json.loads(event)["choices"][0] for event in events[:-1]]
        said = "".join(chunk["delta"].get("content", "") for chunk in chunks)
        assert said.endswith(f"{A['served_name']} got: count to 3"), said
        assert chunks[-1]["finish_reason"] == "stop"


def test_second_deploy_changes_nothing(deployed: dict[str, Any]) -> None:
    before = {host.name: container_id(host, A) for host in deployed["lab"].hosts}
    assert changes(deploy()) == 0
    assert {host.name: container_id(host, A) for host in deployed["lab"].hosts} == before


def test_changing_lane_b_model_restarts_lane_b_alone(deployed: dict[str, Any]) -> None:
    hosts = deployed["lab"].hosts
    a_before = {host.name: container_id(host, A) for host in hosts}
    b_before = {host.name: container_id(host, B) for host in hosts}
    deploy(lanes_data(A, B | {"model": "Qwen/Qwen3-0.6B", "max_model_len": 32768}))
    for host in hosts:
        assert container_id(host, A) == a_before[host.name]
        assert container_id(host, B) not in ("", b_before[host.name])
        status, listing = request(
            f"http://{host.mgmt_ip}:{B['port']}/v1/models", key_of(host, B)
        )  # the same key: clients keep working
        assert (status, listing["data"][0]["root"]) == (200, "Qwen/Qwen3-0.6B")
    deploy()  # back to the inventory's lanes


def test_a_lane_answering_gibberish_fails_its_canary_then_serves_again(
    deployed: dict[str, Any],
) -> None:
    """The answer canary (issue 16): B's model made to answer gibberish, as a ModelOpt NVFP4
    checkpoint does (seed 003; the stand-in reads it beside the model's config.json), and B
    restarted by a change of its settings: its start fails; the deploy fails showing B's
    journal, which names the canary and quotes the answer; mended, B answers right and serves."""
    hosts = deployed["lab"].hosts
    snapshots = f"/var/lib/spark/models/hub/models--{B['model'].replace('/', '--')}/snapshots/*/"
    each = f"sudo sh -c 'for d in {snapshots}; do"
    for host in hosts:
        run_on(host, f"{each} echo gibberish > $d/simlab-answer; done'")
    longer = B | {"max_model_len": B["max_model_len"] + 1024}
    failed = pyinfra(INVENTORY, "deploy.py", "--data", lanes_data(A, longer), check=False)
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0, output
    assert f"lane {B['name']}: canary failed" in output, output
    assert '"Theorem quantum banana' in output, output
    for host in hosts:
        assert show(host, B, "ActiveState")["ActiveState"] != "active"
        assert show(host, A, "ActiveState")["ActiveState"] == "active"
        run_on(host, f"{each} rm $d/simlab-answer; done'")
    deploy()  # back to the inventory's lanes
    for host in hosts:
        assert show(host, B, "ActiveState")["ActiveState"] == "active"
        status, _ = request(f"http://{host.mgmt_ip}:{B['port']}/v1/models", key_of(host, B))
        assert status == 200
        journal = run_on(host, f"sudo journalctl -u {unit(B)} -n 20 --no-pager")
        assert 'canary passed: "42 harbor"' in journal, journal


def prompt_tokens(host: simlab.Host, lane: dict[str, Any]) -> float:
    """llama-server's count of the prompt tokens it has read (its --metrics series
    llamacpp:prompt_tokens_total, tools/server/server-task.cpp), through the box's metrics port."""
    code, text = scrape(host, metrics_key_of(host), f"/lanes/{lane['name']}/metrics")
    assert code == 200, text
    return float(re.search(r"^llamacpp:prompt_tokens_total (\S+)$", text, re.M).group(1))


def test_a_llama_cpp_lane_of_the_real_server_serves_beside_a_vllm_one(
    deployed: dict[str, Any], tmp_path: Path
) -> None:
    """Seed 002's llama.cpp lane (tests/e2e/llama_inventory.py) in place of lane B, on the first
    box (--limit: what a llama.cpp lane does is one box's): its GGUF fetched, llama-server on
    loopback behind the front asking its key, listed in the endpoints table and the OpenCode
    file, compliance passing, a second deploy changing nothing; then back to the inventory's
    lanes. The server is llama.cpp's own, serving the lab's tiny GGUF: the lane's canary is off
    (canary = false; the canary's judging is lane B's, on the vLLM stand-in)."""
    host = deployed["lab"].hosts[0]
    lane = runpy.run_path(str(Path(REPO) / LLAMA_INVENTORY))["GGUF_LANE"]
    only = ("--limit", host.name)
    started = time.monotonic()
    first = pyinfra(LLAMA_INVENTORY, "deploy.py", *only)
    print(f"llama.cpp lane: deploy {time.monotonic() - started:.0f} s")
    output = re.sub(r"\x1b\[[0-9;]*m", "", first.stdout + first.stderr)
    table = output.split("--> Lanes serving:")[1]
    assert re.search(rf"{host.name}\s+gguf\s+llama\.cpp\s+qwen3-coder-next-gguf\s", table), table
    snapshots = "/var/lib/spark/models/hub/models--unsloth--Qwen3-Coder-Next-GGUF/snapshots"
    fetched = run_on(host, f"sudo sh -c 'head -c 4 {snapshots}/*/{lane['gguf_file']}'")
    assert fetched == "GGUF"  # fetched before the lane started, by the hf download of its file
    assert show(host, lane, "ActiveState")["ActiveState"] == "active"
    assert show(host, B, "LoadState")["LoadState"] == "not-found"  # lane B made way
    # llama-server itself, exec'd by the lane's script, on loopback with the GGUF of the snapshot.
    name = f"spark-lane-{lane['name']}"
    args = run_on(host, f"sudo docker exec {name} cat /proc/1/cmdline").split("\0")
    assert args[0] == "/app/llama-server" and args[args.index("--host") + 1] == "127.0.0.1", args
    environment = run_on(host, f"sudo docker exec {name} cat /proc/1/environ").split("\0")
    model = next(item for item in environment if item.startswith("LLAMA_ARG_MODEL="))
    assert re.fullmatch(
        rf"LLAMA_ARG_MODEL=/root/.cache/huggingface/hub/models--unsloth--Qwen3-Coder-Next-GGUF"
        rf"/snapshots/[0-9a-f]{{40}}/{re.escape(lane['gguf_file'])}",
        model,
    ), model
    inspected = run_on(host, f"sudo docker inspect {name}")
    config_env = json.loads(inspected)[0]["Config"]["Env"]
    assert not any(item.startswith("LLAMA_API_KEY") for item in config_env), config_env
    assert key_of(host, lane) not in inspected
    base = f"http://{host.mgmt_ip}:{lane['port']}"
    assert request(f"{base}/v1/models")[0] == 401
    status, listing = request(f"{base}/v1/models", key_of(host, lane))
    assert (status, [model["id"] for model in listing["data"]]) == (200, [lane["served_name"]])
    unit_file = run_on(host, f"systemctl cat {unit(lane)}")
    assert "spark-lane-canary" not in unit_file and "No answer canary" in unit_file, unit_file
    # A streamed chat completion through the front, from llama-server itself.
    chat = {"model": lane["served_name"], "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    key = key_of(host, lane).strip()
    status, streamed, _ = loopback.request(f"{base}/v1/chat/completions", chat, key)
    assert (status, streamed.rstrip().endswith("data: [DONE]")) == (200, True), streamed
    # llama-server's own metrics (--metrics) on the box's metrics port, behind its metrics key.
    path = f"/lanes/{lane['name']}/metrics"
    code, text = scrape(host, metrics_key_of(host), path)
    names = {line.split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert code == 200 and "llamacpp:prompt_tokens_total" in names, text
    assert scrape(host, key_of(host, lane).strip(), path)[0] == 401
    client = json.loads((CLIENTS / f"{host.name}.json").read_text())
    provider = client["provider"][f"{host.name}-gguf"]
    assert provider["options"]["baseURL"] == f"{base}/v1"
    assert provider["models"]["qwen3-coder-next-gguf"]["limit"]["context"] == 131072
    # The real OpenCode client with the box's provider for the lane and its key, as an owner
    # whose home is tmp_path, lists the lane and calls it. The call is made by an agent of its
    # own, a one-line prompt and no tools (OpenCode's agents config, docs "Agents"): OpenCode's
    # own agent sends about 9,600 tokens of prompt and tool schemas, which the lab's model, a
    # token a character on two shared cores, read in 27 s on loopback at a load of 17 and not
    # within 300 s in the lab at a load of 35; the agent's request is a few hundred.
    opencode_dir = tmp_path / ".config/opencode"
    opencode_dir.mkdir(parents=True)
    probe_agent = {"mode": "primary", "prompt": "Answer in one word.", "tools": {"*": False}}
    (opencode_dir / "opencode.json").write_text(
        json.dumps(
            {"provider": {f"{host.name}-gguf": provider}, "agent": {"probe": probe_agent}}
        )  # this lane's provider alone
    )
    (opencode_dir / key_file(host.name, lane["name"])).write_text(key + "\n")
    listed = run_as_owner(tmp_path, str(OPENCODE), "models")
    assert f"{host.name}-gguf/qwen3-coder-next-gguf" in listed.stdout.split(), listed.stdout
    prompted_before = prompt_tokens(host, lane)
    model = f"{host.name}-gguf/qwen3-coder-next-gguf"
    called = run_as_owner(tmp_path, str(OPENCODE), "run", "--agent", "probe", "-m", model, "hi")
    assert called.returncode == 0, called.stdout + called.stderr
    assert prompt_tokens(host, lane) > prompted_before  # llama-server read OpenCode's prompt
    code, checks, said = compliance("--limit", host.name, inventory=LLAMA_INVENTORY)
    assert code == 0 and not_passing(checks) == {}, said
    # The throughput probe (make lane-bench) on both lanes: the stand-ins' numbers, not a Spark's.
    started = time.monotonic()
    probe = pyinfra("--serial", LLAMA_INVENTORY, "lane_bench.py", *only)
    print(f"lane-bench, both lanes: {time.monotonic() - started:.0f} s")
    measured = [
        json.loads(line[line.index("{") :])
        for line in (probe.stdout + probe.stderr).splitlines()
        if '{"lane": ' in line
    ]
    assert [(m["lane"], len(m["rows"])) for m in measured] == [("coder", 3), ("gguf", 3)], probe
    # The GGUF's catalog entry reaches the probe: seed 002's 33 tok/s at one request.
    figures = [(f["concurrency"], f["figure_tok_s"]) for f in measured[1]["figures"]]
    assert figures == [(1, 33.0)], probe.stdout + probe.stderr
    assert changes(pyinfra(LLAMA_INVENTORY, "deploy.py", *only)) == 0
    pyinfra(INVENTORY, "deploy.py", *only)  # back to the inventory's lanes
    assert show(host, lane, "LoadState")["LoadState"] == "not-found"
    assert show(host, B, "ActiveState")["ActiveState"] == "active"


def test_a_lane_whose_model_is_missing_stops_each_box_before_the_lane_changes(
    deployed: dict[str, Any],
) -> None:
    # fetch_weights off, as group_data has it: a download of hours is not hidden in a deploy,
    # and never run in the lane's start window (the lane would be restarted on its timeout).
    hosts = deployed["lab"].hosts
    b_before = {host.name: container_id(host, B) for host in hosts}
    model = "Qwen/Qwen3-0.6B"  # in the catalog; taken off the boxes first
    for host in hosts:
        run_on(host, f"sudo rm -rf {preflight.hf_cache_dir(box_paths.MODELS_DIR, model)}")
    changed = lanes_data(A, B | {"model": model, "max_model_len": 32768})
    refused = pyinfra(INVENTORY, "deploy.py", "--data", "fetch_weights=False", "--data", changed,
                      check=False)  # fmt: skip
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output
    assert f"hf download {model}" in output, output
    for host in hosts:
        assert f"{host.name}: {model} is not on this box" in output, output
        assert container_id(host, B) == b_before[host.name]  # B still serves its model
        status, listing = request(f"http://{host.mgmt_ip}:{B['port']}/v1/models", key_of(host, B))
        assert (status, listing["data"][0]["root"]) == (200, B["model"])


def test_lane_b_moved_to_2610_runs_nvfp4_on_marlin_in_vllm_0310_terms(
    deployed: dict[str, Any],
) -> None:
    # NGC 26.10 carries vLLM 0.31.0, which no longer reads VLLM_NVFP4_GEMM_BACKEND and picks
    # the GEMM kernel with --linear-backend (vllm-option-changes.md); its stand-in accepts
    # exactly vLLM 0.31.0's options, so a 0.19.0-only one would stop the lane.
    image = "nvcr.io/nvidia/vllm:26.10-py3"
    hosts = deployed["lab"].hosts
    deploy(lanes_data(A, B | {"image": image}))
    for host in hosts:
        name = f"spark-lane-{B['name']}"
        # PID 1 of the container is `vllm serve`, exec'd by the lane's script.
        args = run_on(host, f"sudo docker exec {name} cat /proc/1/cmdline").split("\0")
        assert args[args.index("serve") - 1].endswith("/vllm"), args  # python3 .../vllm serve
        assert args[args.index("--linear-backend") + 1] == "marlin", args
        env = run_on(host, f"sudo docker inspect -f '{{{{json .Config.Env}}}}' {name}")
        assert "VLLM_NVFP4_GEMM_BACKEND" not in env
        assert vllm_version(host, B) == "0.31.0"
        assert request(f"http://{host.mgmt_ip}:{B['port']}/v1/models", key_of(host, B))[0] == 200
    deploy()  # back to the inventory's lanes
    for host in hosts:
        assert vllm_version(host, B) == "0.19.0"


def test_a_killed_container_is_brought_back_by_systemd(deployed: dict[str, Any]) -> None:
    host = deployed["lab"].hosts[0]
    before = container_id(host, A)
    restarts = int(show(host, A, "NRestarts")["NRestarts"])
    run_on(host, "sudo docker kill spark-lane-" + A["name"])

    def back() -> bool:
        state = show(host, A, "ActiveState", "NRestarts")
        return state["ActiveState"] == "active" and int(state["NRestarts"]) == restarts + 1

    until(back, 60, f"{unit(A)} restarted by systemd")
    assert container_id(host, A) not in ("", before)
    assert request(f"http://{host.mgmt_ip}:{A['port']}/health", key_of(host, A))[0] == 200


def test_a_lane_restarted_while_another_loads_waits_its_turn(deployed: dict[str, Any]) -> None:
    # Lanes failing at the same moment have their restart jobs queued together, and systemd
    # orders those by After= (seen on the lab). Failing apart, they are not: B (after A) is
    # restarted and loading when A's own restart timer fires, and systemd starts A at once.
    # Only the turn (templates/spark-lane-turn.j2) keeps A from loading beside B.
    host = deployed["lab"].hosts[1]
    # Each model takes 20 s to load (the stand-in reads it beside the model's config.json).
    snapshots = " ".join(
        f"/var/lib/spark/models/hub/models--{lane['model'].replace('/', '--')}/snapshots/*/"
        for lane in (A, B)
    )
    each = f"for d in {snapshots}; do"
    run_on(host, f"sudo sh -c '{each} echo 20 > $d/simlab-load-seconds; done'")
    try:
        restarts = int(show(host, B, "NRestarts")["NRestarts"])
        run_on(host, f"sudo docker kill spark-lane-{B['name']}")

        def b_loading() -> bool:
            state = show(host, B, "ActiveState", "SubState", "NRestarts")
            return int(state["NRestarts"]) > restarts and state["SubState"] in (
                "start",
                "start-post",
            )

        until(b_loading, 60, f"{unit(B)} restarted and loading")
        run_on(host, f"sudo docker kill spark-lane-{A['name']}")  # A restarts 10 s later
        until(
            lambda: all(show(host, lane, "ActiveState")["ActiveState"] == "active"
                        for lane in (A, B)),
            120,
            "both lanes serving again",
        )  # fmt: skip
        a = show(host, A, "ExecMainStartTimestampMonotonic")
        b = show(host, B, "ActiveEnterTimestampMonotonic")
        # A's container started only once B served: never two lanes loading at once.
        assert int(a["ExecMainStartTimestampMonotonic"]) >= int(b["ActiveEnterTimestampMonotonic"])
        journal = run_on(host, f"sudo journalctl -u {unit(A)} --since '-3min' -o cat")
        assert f"lane {A['name']} waits for lane {B['name']} to finish loading" in journal
    finally:
        run_on(host, f"sudo sh -c '{each} rm -f $d/simlab-load-seconds; done'")


def test_removing_a_lane_from_group_data_removes_its_unit(deployed: dict[str, Any]) -> None:
    hosts = deployed["lab"].hosts
    a_before = {host.name: container_id(host, A) for host in hosts}
    deploy(lanes_data(A))
    for host in hosts:
        listed = run_on(host, "ls /etc/systemd/system /etc/spark/lanes")
        assert unit(B) not in listed and f"{B['name']}.env" not in listed
        assert container_id(host, B) == ""
        assert show(host, B, "LoadState")["LoadState"] == "not-found"
        assert container_id(host, A) == a_before[host.name]
        # Its key stays: a lane added back keeps its clients.
        assert run_on(host, f"sudo stat -c %a /etc/spark/secrets/{B['name']}.key").strip() == "600"
    deploy()
    for host in hosts:
        assert show(host, B, "ActiveState")["ActiveState"] == "active"


def test_secrets_appear_nowhere_but_their_files(deployed: dict[str, Any]) -> None:
    sentinel = "hf_SENTINEL" + "x7Q2" * 6
    (STATE / "hf-token").write_text(sentinel)
    try:
        result = deploy()
        output = result.stdout + result.stderr
        for host in deployed["lab"].hosts:
            keys = [key_of(host, lane) for lane in (A, B)]
            assert all(len(key) >= 40 for key in keys)
            names = " ".join(f"spark-lane-{lane['name']}" for lane in (A, B))
            places = {
                "argv on the box": run_on(host, "ps -eo args"),
                "argv in the containers": run_on(
                    host, f"for c in {names}; do sudo docker exec $c ps -eo args; done"
                ),
                "unit and environment files": run_on(
                    host, "cat /etc/systemd/system/spark-*.service /etc/spark/lanes/*.env"
                    " /etc/spark/memguard.json /etc/spark/cluster.env"
                    " /etc/nginx/conf.d/spark-lanes.conf"
                ),
                "nginx's logs": run_on(host, "sudo cat /var/log/nginx/access.log"
                                       " /var/log/nginx/error.log"),
                "the journal": run_on(host, "sudo journalctl --no-pager -o cat"),
                "docker inspect": run_on(host, f"sudo docker inspect {names}"),
                "docker logs": run_on(
                    host, f"for c in {names}; do sudo docker logs $c 2>&1; done"
                ),
                "pyinfra's output": output,
                "the client configuration": (CLIENTS / f"{host.name}.json")
                .read_text(),
            }  # fmt: skip
            for place, text in places.items():
                for secret in (sentinel, *keys):
                    assert secret not in text, f"{host.name}: a secret in {place}"
            for directory in ("/etc/spark/secrets", "/etc/nginx/spark-keys"):
                stat = f"sudo sh -c \"stat -c '%U %a' {directory} {directory}/*\""
                modes = run_on(host, stat).split("\n")
                assert modes[0] == "root 700" and set(modes[1:-1]) == {"root 600"}, modes
            # The token reaches the lanes, from the file.
            read = "sudo docker exec spark-lane-{} sh -c 'cat \"$HF_TOKEN_PATH\"'"
            assert run_on(host, read.format(A["name"])) == sentinel
    finally:
        (STATE / "hf-token").unlink()
    deploy()


def test_memory_guard_stops_the_lowest_priority_lane_first(deployed: dict[str, Any]) -> None:
    host = deployed["lab"].hosts[1]
    guard = "journalctl -u spark-memguard -o cat --no-pager"
    seen = len(run_on(host, f"sudo {guard}").splitlines())
    # A threshold above all the memory this lab has, as an operator could set it on the box.
    run_on(host, "sudo sed -i 's/\"min_available_gib\": .*,/\"min_available_gib\": 100000,/'"
                 " /etc/spark/memguard.json && sudo systemctl restart spark-memguard")  # fmt: skip
    until(
        lambda: show(host, B, "ActiveState")["ActiveState"] in ("inactive", "failed"),
        30,
        f"the guard stopping {unit(B)}",
    )
    assert show(host, A, "ActiveState")["ActiveState"] == "active"
    said = run_on(host, f"sudo {guard}").splitlines()[seen:]
    stops = [line for line in said if "stopping lane" in line]
    assert stops[0].startswith("MemAvailable "), said
    assert f"below 100000 GiB: stopping lane {B['name']} ({unit(B)}, priority 1" in stops[0]
    # The deploy puts the inventory's threshold back and starts the stopped lanes.
    deploy()
    for lane in (A, B):
        assert show(host, lane, "ActiveState")["ActiveState"] == "active"
    assert changes(deploy()) == 0

"""The serving image's `vllm` stand-in and its assembly, on this machine (loopback only).

The stand-in runs with this machine's python on 127.0.0.1 and a free port; every server is
stopped within the test. The Ray path (placement group, node death) needs a Ray cluster and is
exercised on the lab; vLLM's own multi-node mode (executor mp) runs here, its head and headless
rank both on 127.0.0.1 with a free master port.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.simlab import serving
from tests.simlab.loopback import START_TIMEOUT, Server, Servers, free_port, request
from tests.simlab.serving import vllm_standin

STANDIN = Path(vllm_standin.__file__)
DATA = serving.DATA
RELEASE = vllm_standin.Release.read(DATA, "0.19.0")  # the default image's
OPTIONS = RELEASE.options


@pytest.fixture(autouse=True)
def model_cached(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face cache holding test/model, as `hf download` leaves it, for every server
    started here; the hub is out of reach, as in the lab."""
    home = tmp_path_factory.getbasetemp() / "hf-home"
    snapshot = home / "hub/models--test--model/snapshots/0123abcd"
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text("{}\n")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return home


def standin_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    return {**env, "SIMLAB_VLLM_SHARE": str(DATA), "SIMLAB_VLLM_RELEASE": "0.19.0", **extra}


def run_vllm(*args: str, release: str = "0.19.0") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(STANDIN), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=standin_env(SIMLAB_VLLM_RELEASE=release),
        check=False,
    )


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start `vllm serve test/model ARGS` on loopback; every server is stopped afterwards."""
    servers = Servers(tmp_path, "vllm")

    def _start(*args: str, wait: bool = True, **env: str) -> Server:
        def command(port: int) -> list[str]:
            return [sys.executable, str(STANDIN), "serve", "test/model", "--host", "127.0.0.1",
                    "--port", str(port), *args]  # fmt: skip

        return servers.start(command, standin_env(**env), wait)

    yield _start
    servers.stop()


def test_version() -> None:
    result = run_vllm("--version")
    assert (result.returncode, result.stdout.strip()) == (0, "0.19.0")


def test_health_is_refused_while_loading_then_ok(start: Callable[..., Server]) -> None:
    server = start(wait=False, SIMLAB_VLLM_LOAD_SECONDS="1.5")
    server.wait_for_log("Starting to load model test/model")
    with pytest.raises(urllib.error.URLError) as refused:
        request(f"{server.url}/health")
    assert isinstance(refused.value.reason, ConnectionRefusedError)
    server.wait_healthy()
    status, body, _ = request(f"{server.url}/health")
    assert (status, body) == (200, "")
    log = server.log.read_text()
    assert "non-default args: {'model_tag': 'test/model'" in log
    assert f"Starting vLLM API server on http://127.0.0.1:{server.port}" in log


def in_order(log: str, *texts: str) -> list[int]:
    """Where each text first comes in the log, -1 where it does not."""
    return [log.find(text) for text in texts]


# vLLM's lines from the weights to serving, in vLLM's order (vllm/v1/engine/core.py
# _initialize_kv_caches, vLLM 0.19.0: gpu_model_runner.py load_model, gpu_worker.py
# determine_available_memory, gpu_model_runner.py capture_model, then the engine's own).
START_LINES = (
    "Model loading took 0.0 GiB memory and ",
    "Available KV cache memory: 0.0 GiB",
    "Graph capturing finished in 2 secs, took 0.00 GiB",
    "init engine (profile, create kv cache, warmup model) took 2.00 seconds",
    "Starting vLLM API server on",
)


def test_the_start_logs_vllms_lines_in_vllms_order_and_serves_after_the_graphs(
    start: Callable[..., Server],
) -> None:
    server = start(SIMLAB_VLLM_CAPTURE_SECONDS="2")
    # The API server listens once the graphs are captured: its line comes last.
    found = in_order(server.log.read_text(), *START_LINES)
    assert -1 not in found and found == sorted(found), found


def test_the_start_captures_no_graphs_under_enforce_eager(start: Callable[..., Server]) -> None:
    server = start("--enforce-eager", SIMLAB_VLLM_CAPTURE_SECONDS="30")
    log = server.log.read_text()
    assert "Available KV cache memory: 0.0 GiB" in log and "Graph capturing" not in log
    assert "init engine (profile, create kv cache, warmup model) took 0.00 seconds" in log


def test_models_list_the_served_names_and_context(start: Callable[..., Server]) -> None:
    server = start("--served-model-name", "lane-a", "lane-b", "--max-model-len", "32k")
    status, body, _ = request(f"{server.url}/v1/models")
    assert status == 200
    listing = json.loads(body)
    assert listing["object"] == "list"
    assert [(m["id"], m["root"], m["max_model_len"]) for m in listing["data"]] == [
        ("lane-a", "test/model", 32000),
        ("lane-b", "test/model", 32000),
    ]
    assert json.loads(request(f"{server.url}/version")[1]) == {"version": "0.19.0"}
    placement = json.loads(request(f"{server.url}/simlab/placement")[1])
    assert placement == {
        "distributed_executor_backend": "uni",
        "world_size": 1,
        "bundle_node_ips": [],
    }


def test_chat_completion_echoes_the_last_user_message(start: Callable[..., Server]) -> None:
    server = start("--served-model-name", "lane-a")
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": [{"type": "text", "text": "are you real?"}]},
    ]
    status, body, _ = request(
        f"{server.url}/v1/chat/completions", {"model": "lane-a", "messages": messages}
    )
    assert status == 200
    completion = json.loads(body)
    assert completion["object"] == "chat.completion"
    assert completion["model"] == "lane-a"
    assert completion["id"].startswith("chatcmpl-")
    (choice,) = completion["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert "stand-in" in choice["message"]["content"]
    assert choice["message"]["content"].endswith("are you real?")
    usage = completion["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def test_chat_completion_streams_events(start: Callable[..., Server]) -> None:
    server = start()
    status, body, headers = request(
        f"{server.url}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "stream": True},
    )
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in body.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[1]["choices"][0]["delta"]["content"].endswith("hi")
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "`other`"),
        ({"messages": []}, 400, "messages"),
    ],
)
def test_chat_completion_refuses_bad_requests(
    start: Callable[..., Server], body: dict[str, Any], status: int, fragment: str
) -> None:
    server = start()
    got, text, _ = request(f"{server.url}/v1/chat/completions", body)
    assert got == status
    error = json.loads(text)["error"]
    assert error["code"] == status
    assert fragment in error["message"]


def test_api_key_guards_v1_only(start: Callable[..., Server]) -> None:
    server = start("--api-key", "s3cret")
    chat = {"messages": [{"role": "user", "content": "x"}]}
    for key in (None, "wrong"):
        status, body, _ = request(f"{server.url}/v1/models", key=key)
        assert (status, json.loads(body)) == (401, {"error": "Unauthorized"})
        assert request(f"{server.url}/v1/chat/completions", chat, key=key)[0] == 401
    assert request(f"{server.url}/v1/models", key="s3cret")[0] == 200
    assert request(f"{server.url}/v1/chat/completions", chat, key="s3cret")[0] == 200
    for open_path in ("/health", "/ping", "/version"):
        assert request(f"{server.url}{open_path}")[0] == 200


def test_metrics_answer_anyone_with_vllms_own_series(start: Callable[..., Server]) -> None:
    """vLLM's /metrics is outside /v1: its key does not guard it (vLLM's security guide). The
    names and labels are vllm/v1/metrics/loggers.py's (PrometheusStatLogger: labelnames
    model_name and engine; a counter's name gets _total from prometheus_client)."""
    server = start("--api-key", "s3cret")
    status, body, _ = request(f"{server.url}/metrics")
    assert status == 200
    samples = {line.split("{")[0] for line in body.splitlines() if line[:1] != "#"}
    assert samples == {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    }
    assert 'vllm:num_requests_waiting{engine="0",model_name="test/model"} 0.0' in body


def test_api_key_from_environment_and_cli_precedence(start: Callable[..., Server]) -> None:
    from_env = start(VLLM_API_KEY="env-key")
    assert request(f"{from_env.url}/v1/models")[0] == 401
    assert request(f"{from_env.url}/v1/models", key="env-key")[0] == 200
    both = start("--api-key", "cli-key", VLLM_API_KEY="env-key")
    assert request(f"{both.url}/v1/models", key="env-key")[0] == 401
    assert request(f"{both.url}/v1/models", key="cli-key")[0] == 200


def test_valid_options_from_the_list_are_accepted(start: Callable[..., Server]) -> None:
    assert "TRITON_ATTN" in OPTIONS["--attention-backend"]["choices"]
    assert not OPTIONS["--enable-prefix-caching"]["takes_value"]
    server = start(
        "--kv-cache-dtype", "fp8", "--attention-backend=TRITON_ATTN", "--enable-prefix-caching",
        "--gpu-memory-utilization", "0.85", "--max_num_seqs", "4",
    )  # fmt: skip
    log = server.log.read_text()
    assert "'kv_cache_dtype': 'fp8'" in log
    assert "'max_num_seqs': '4'" in log
    assert "'enable_prefix_caching': True" in log


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--no-such-option", "1"], "unrecognized arguments: --no-such-option 1"),
        (["--kv-cache-dtype", "nonsense"], "argument --kv-cache-dtype: invalid choice: 'nonsense'"),
        (["--enforce-eager=true"], "argument --enforce-eager: ignored explicit argument 'true'"),
        (["--port"], "argument --port: expected one argument"),
        (["--port", "eighty"], "argument --port: invalid int value: 'eighty'"),
        (["--max-num-seqs", "8; touch x"], "argument --max-num-seqs: invalid int value"),
        (["--gpu-memory-utilization", "most"], "--gpu-memory-utilization: invalid float value"),
        (["--served-model-name"], "argument --served-model-name: expected at least one argument"),
        (["other/model"], "unrecognized arguments: other/model"),
    ],
)
def test_invalid_command_lines_are_refused(args: list[str], fragment: str) -> None:
    result = run_vllm("serve", "test/model", *args)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: vllm serve")
    assert fragment in result.stderr


@pytest.mark.parametrize(
    ("offline", "fragment"),
    [("1", "outgoing traffic has been disabled"), ("", "We couldn't connect to")],
)
def test_a_model_not_in_the_cache_stops_the_start(
    start: Callable[..., Server], offline: str, fragment: str
) -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, str(STANDIN), "serve", "other/model", "--port", str(port)],
        capture_output=True, text=True, timeout=30, check=False,
        env=standin_env(HF_HUB_OFFLINE=offline),
    )  # fmt: skip
    assert result.returncode == 1
    assert fragment in result.stdout and "other/model" in result.stdout
    assert start(HF_HUB_OFFLINE="1").process.poll() is None  # test/model is cached: it serves


def test_world_size_beyond_one_gpu_needs_ray_or_nnodes() -> None:
    result = run_vllm(
        "serve", "test/model", "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"
    )
    assert result.returncode == 1
    assert "World size (2) is larger than the number of available GPUs (1)" in result.stdout
    assert "- multiprocessing, set '--nnodes' appropriately." in result.stdout


def rank_args(master_port: int, rank: int, nnodes: int = 2) -> list[str]:
    """vLLM's multi-node mode as its docs run it (parallelism_scaling.md): one GPU a box, so the
    tensor parallel size is the number of nodes; --headless above rank 0."""
    args = ["--tensor-parallel-size", str(nnodes), "--nnodes", str(nnodes),
            "--node-rank", str(rank), "--master-addr", "127.0.0.1",
            "--master-port", str(master_port)]  # fmt: skip
    return [*args, "--headless"] if rank else args


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def sockets_on(port: int, state: str) -> set[tuple[Address, Address]]:
    """(local, remote) addresses of this machine's TCP sockets whose local port is port, in the
    kernel's state (0A listening, 01 established), as ss reads them from /proc/net/tcp{,6}."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote, got = line.split()[1:4]
            hex_local, _, hex_port = local.rpartition(":")
            if got == state and int(hex_port, 16) == port:
                found.add((_address(hex_local), _address(remote.rpartition(":")[0])))
    return found


def _address(hex_address: str) -> Address:
    raw = bytes.fromhex(hex_address)  # 32-bit words in host order (little-endian here)
    return ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))


def chat(server: Server) -> tuple[int, str, dict[str, str]]:
    return request(
        f"{server.url}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
    )


@pytest.fixture
def cluster(start: Callable[..., Server]) -> Callable[[], tuple[Server, Server, int]]:
    """Two ranks in the order of eugr/spark-vllm-docker's launch-cluster.sh: the headless one
    first (it retries until the head listens), then the head; (head, rank, master port)."""

    def _cluster() -> tuple[Server, Server, int]:
        master = free_port()
        rank = start(*rank_args(master, 1), "--distributed-executor-backend", "mp", wait=False)
        rank.wait_for_log(f"[c10d] The client socket has failed to connect to [127.0.0.1]:{master}")
        head = start(*rank_args(master, 0), "--distributed-executor-backend", "mp")
        rank.wait_for_log(f"rank 1 joined the torch.distributed group at 127.0.0.1:{master}")
        return head, rank, master

    return _cluster


def test_mp_head_serves_once_every_rank_joined(start: Callable[..., Server]) -> None:
    master = free_port()
    head = start(*rank_args(master, 0), wait=False)  # the backend left out: mp, as in vLLM
    head.wait_for_log(
        f"Waiting for 1 headless rank(s) to join the torch.distributed group on port {master}"
    )
    # The rendezvous listens on every interface, before the model loads and the API listens.
    listening = sockets_on(master, "0A")
    assert listening and all(local.is_unspecified for local, _ in listening)
    with pytest.raises(urllib.error.URLError) as refused:
        request(f"{head.url}/health")
    assert isinstance(refused.value.reason, ConnectionRefusedError)
    assert "Starting to load model" not in head.log.read_text()
    rank = start(*rank_args(master, 1), wait=False)
    head.wait_healthy()
    assert chat(head)[0] == 200
    log = head.log.read_text()
    assert "rank 1 joined the torch.distributed group from 127.0.0.1 (2/2 ranks)" in log
    assert log.index("All 2 ranks joined") < log.index("Starting to load model test/model")
    # On an IPv6 listener, as torch's, the head sees a rank come over IPv4 as ::ffff:a.b.c.d.
    ((_, peer),) = sockets_on(master, "01")  # the head's end: the local port is the master's
    v4 = ipaddress.IPv4Address("127.0.0.1")
    assert peer == v4 or (isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped == v4)
    if any(local.version == 6 for local, _ in listening):
        assert peer.version == 6
    # A headless rank logs its workers' lines as the head's do, in the same order.
    rank.wait_for_log("Graph capturing finished in")
    found = in_order(rank.log.read_text(), *START_LINES[:2], "Graph capturing finished in 0 secs")
    assert -1 not in found and found == sorted(found), found
    assert (
        "Launching vLLM (v0.19.0) headless multiproc executor, with head node address"
        f" 127.0.0.1:{master} for torch.distributed process group." in rank.log.read_text()
    )
    # A headless rank starts no API server: its --port stays closed.
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", rank.port)):
        pass
    placement = json.loads(request(f"{head.url}/simlab/placement")[1])
    assert placement["distributed_executor_backend"] == "mp"


def test_mp_a_rank_lost_fails_completions_not_health(
    cluster: Callable[[], tuple[Server, Server, int]], start: Callable[..., Server]
) -> None:
    head, rank, master = cluster()
    rank.process.terminate()
    assert rank.process.wait(timeout=5) == 0
    head.wait_for_log("rank 1 (127.0.0.1) left the torch.distributed group")
    status, body, _ = chat(head)
    assert status == 500
    error = json.loads(body)["error"]
    assert error["code"] == 500 and error["message"].startswith("rank 1 of the torch.distributed")
    assert request(f"{head.url}/health")[0] == 200
    assert head.process.poll() is None
    # The rank started again is not taken back: the head closes on it, completions still fail.
    again = start(*rank_args(master, 1), wait=False)
    head.wait_for_log(f"connection from 127.0.0.1 on port {master} refused: rank 1 already joined")
    again.wait_for_log("Connection was likely closed. Did the remote server shutdown or crash?")
    assert chat(head)[0] == 500
    assert head.process.poll() is None


def test_mp_the_head_lost_leaves_the_rank_up_and_never_rejoining(
    cluster: Callable[[], tuple[Server, Server, int]], start: Callable[..., Server]
) -> None:
    head, rank, master = cluster()
    head.process.kill()
    head.process.wait(timeout=5)
    rank.wait_for_log("[c10d] recvValue failed on SocketImpl(fd=")
    rank.wait_for_log(
        f"remote=[127.0.0.1]:{master}): Connection was likely closed. Did the remote server"
        " shutdown or crash?"
    )
    assert rank.process.poll() is None
    # A head started again on the same port waits for the rank in vain (vllm#32136).
    again = start(*rank_args(master, 0), wait=False, SIMLAB_VLLM_DISTRIBUTED_TIMEOUT="2")
    assert again.process.wait(timeout=START_TIMEOUT) == 1
    assert (
        "Timed out after 2 seconds waiting for clients. 1/2 clients joined."
        in again.log.read_text()
    )
    assert rank.process.poll() is None
    rank.process.terminate()
    assert rank.process.wait(timeout=5) == 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--tensor-parallel-size", "2", "--nnodes", "3"],
         "world_size=2 must be divisible by nnodes=3."),
        (["--tensor-parallel-size", "4", "--nnodes", "2"],
         "World size (4) over 2 nodes puts 2 workers on each node"),
        (["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "2", "--headless"],
         "node_rank=2 must be less than nnodes=2."),
        (["--tensor-parallel-size", "2", "--nnodes", "2", "--headless"],
         "--headless is for the ranks above 0"),
        (["--headless"], "--headless is for the ranks above 0"),
        (["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1"],
         "collective_rpc should not be called on follower node"),
        (["--tensor-parallel-size", "2", "--nnodes", "2", "--distributed-executor-backend", "ray"],
         "nnodes > 1 can only be set when distributed executor backend is mp, uni or"),
    ],
)  # fmt: skip
def test_mp_refuses_what_vllm_refuses(args: list[str], fragment: str) -> None:
    result = run_vllm("serve", "test/model", *args)
    assert result.returncode == 1, result.stdout
    assert fragment in result.stdout


def test_mp_ranks_give_up_after_the_distributed_timeout(start: Callable[..., Server]) -> None:
    master = free_port()
    head = start(*rank_args(master, 0), "--distributed-timeout-seconds", "1", wait=False)
    assert head.process.wait(timeout=START_TIMEOUT) == 1
    assert (
        "torch.distributed.DistStoreError: Timed out after 1 seconds waiting for clients."
        " 1/2 clients joined." in head.log.read_text()
    )
    rank = start(*rank_args(master, 1), wait=False, SIMLAB_VLLM_DISTRIBUTED_TIMEOUT="2")
    assert rank.process.wait(timeout=START_TIMEOUT) == 1
    assert (
        "torch.distributed.DistNetworkError: The client socket has timed out after 2000ms while"
        f" trying to connect to (127.0.0.1, {master})." in rank.log.read_text()
    )


def test_serve_config_multi_node_defaults() -> None:
    values = {"--tensor-parallel-size": "2", "--nnodes": "2"}
    config = vllm_standin.serve_config("org/m", values, {})
    assert (config.backend, config.node_rank, config.headless) == ("mp", 0, False)
    assert (config.master_addr, config.master_port) == ("127.0.0.1", 29501)
    assert config.distributed_timeout == 600
    env = {"SIMLAB_VLLM_DISTRIBUTED_TIMEOUT": "5"}
    assert vllm_standin.serve_config("org/m", values, env).distributed_timeout == 5
    # What vLLM reads wins over the stand-in's default; "None" is no value.
    given = values | {"--distributed-timeout-seconds": "30"}
    assert vllm_standin.serve_config("org/m", given, env).distributed_timeout == 30
    unset = values | {"--distributed-timeout-seconds": "None"}
    assert vllm_standin.serve_config("org/m", unset, env).distributed_timeout == 5


def test_parse_serve_reads_lists_model_option_and_underscores() -> None:
    model, values = vllm_standin.parse_serve(
        ["--port", "9000", "--served-model-name", "a", "b", "--model=org/m", "--max_model_len=8K"],
        RELEASE,
    )
    assert model == "org/m"
    assert values == {"--port": "9000", "--served-model-name": ["a", "b"], "--max-model-len": "8K"}


def test_serve_config_defaults_and_ray_for_two_boxes() -> None:
    config = vllm_standin.serve_config("org/m", {"--tensor-parallel-size": "2"}, {})
    assert (config.port, config.host, config.served_names) == (8000, None, ["org/m"])
    assert (config.world_size, config.backend, config.api_keys) == (2, "ray", [])
    assert config.max_model_len == vllm_standin.DEFAULT_MAX_MODEL_LEN


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("32k", 32000), ("32K", 32768), ("1.5m", 1500000), ("auto", -1), ("-1", -1)],
)
def test_max_model_len_reads_human_numbers(text: str, value: int) -> None:
    assert vllm_standin.human_readable_int_or_auto(text) == value


def test_assemble_serving_rootfs(tmp_path: Path) -> None:
    """Ray's wheels (downloaded into the cache once, stripped), the commands, the option list
    and the lab's GGUF model land; what debootstrap left that no container reads goes."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/python3.11").touch()
    # A few of what debootstrap --variant=minbase leaves (bookworm's packages' paths).
    left = {
        "var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages": "",
        "var/lib/apt/lists/lock": "",
        "var/lib/apt/lists/partial/": None,
        "usr/share/doc/coreutils/copyright": "GPL-3+",
        "usr/share/doc/coreutils/changelog.Debian.gz": "",
        "usr/share/man/man1/ls.1.gz": "",
        "usr/share/info/coreutils.info.gz": "",
        "usr/share/locale/de/LC_MESSAGES/coreutils.mo": "",
        "usr/share/locale/locale.alias": "german de_DE.ISO-8859-1\n",
    }
    for path, text in left.items():
        (rootfs / path).parent.mkdir(parents=True, exist_ok=True)
        if text is not None:
            (rootfs / path).write_text(text)
    (rootfs / "usr/share/doc/libgmp10").symlink_to("coreutils")  # a doc link to another's
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF and the rest")
    serving.assemble_serving_rootfs(rootfs, model)
    share = rootfs / "usr/share"
    assert sorted(str(path.relative_to(rootfs)) for path in share.rglob("*")) == [
        "usr/share/doc",
        "usr/share/doc/coreutils",
        "usr/share/doc/coreutils/copyright",
        "usr/share/doc/libgmp10",  # the link, kept
        "usr/share/info",
        "usr/share/locale",
        "usr/share/locale/locale.alias",
        "usr/share/man",
    ]
    assert list((rootfs / "var/lib/apt/lists").iterdir()) == []
    assert (rootfs / "usr/local/share/hf-standin/lab-model.gguf").read_bytes() == model.read_bytes()
    site = rootfs / "opt/ray-site"
    assert (site / f"ray-{serving.RAY_VERSION}.dist-info").is_dir()
    assert not (site / "ray/jars").exists()
    assert not (site / "ray/dashboard/client").exists()
    assert (site / "ray/dashboard/__init__.py").exists()  # the dashboard's Python stays
    for executable in ("_raylet.so", "core/src/ray/gcs/gcs_server", "core/src/ray/raylet/raylet"):
        sections = subprocess.run(
            ["readelf", "--section-headers", "--wide", str(site / "ray" / executable)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert ".dynsym" in sections and ".symtab" not in sections, executable
    pth = rootfs / "usr/lib/python3/dist-packages/ray-site.pth"
    assert pth.read_text() == "/opt/ray-site\n"
    vllm = rootfs / "usr/local/bin/vllm"
    assert vllm.read_text() == STANDIN.read_text()
    for command in (vllm, rootfs / "usr/local/bin/ray"):
        assert os.access(command, os.X_OK), command
    # The stand-ins' model, on the image's python3 path.
    model_module = rootfs / serving.MODEL_MODULE
    assert model_module.read_text() == (STANDIN.parent / "standin_model.py").read_text()
    # This machine's python is the image's (3.11): both commands run from the tree.
    env = {**os.environ, "PYTHONPATH": f"{site}:{model_module.parent}"}
    ray = subprocess.run(
        [sys.executable, str(rootfs / "usr/local/bin/ray"), "--version"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert ray.returncode == 0, ray.stderr
    assert serving.RAY_VERSION in ray.stdout
    env["SIMLAB_VLLM_SHARE"] = str(rootfs / "usr/local/share/vllm-standin")
    version = subprocess.run(
        [sys.executable, str(vllm), "--version"],
        capture_output=True, text=True, timeout=30, env=env, check=False,
    )  # fmt: skip
    assert version.stdout.strip() == "0.19.0"  # the default image's, from its `release` file


def test_each_release_accepts_its_own_options_only() -> None:
    # --linear-backend is new in vLLM 0.31.0 (vllm-option-changes.md): the 26.10 stand-in takes
    # it and checks its choices, the 26.04 one refuses it as vLLM 0.19.0's parser does.
    on_0310 = ["serve", "test/model", "--linear-backend", "marlin", "--help"]
    assert run_vllm(*on_0310, release="0.31.0").returncode == 0
    refused = run_vllm(*on_0310, release="0.19.0")
    assert refused.returncode == 2
    assert "unrecognized arguments: --linear-backend marlin" in refused.stderr
    bad_choice = run_vllm("serve", "test/model", "--linear-backend", "cutlas", release="0.31.0")
    assert "argument --linear-backend: invalid choice: 'cutlas'" in bad_choice.stderr


def test_an_optional_value_may_be_left_out_where_the_release_says() -> None:
    # vLLM 0.31.0 reads its one bool | str field with nargs '?' (option-values data).
    release = vllm_standin.Release.read(DATA, "0.31.0")
    (optional,) = [name for name, spec in release.values.items() if spec.get("nargs") == "?"]
    assert vllm_standin.parse_serve([optional, "--port", "1"], release)[1] == {
        optional: True,
        "--port": "1",
    }
    assert vllm_standin.parse_serve([f"{optional}=x"], release)[1] == {optional: "x"}


def test_assemble_refuses_a_tree_without_the_python_ray_is_for(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"no python3\.11"):
        serving.assemble_serving_rootfs(tmp_path, tmp_path / "model.gguf")


def test_a_model_gives_its_load_time_and_answer_beside_its_config(tmp_path: Path) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path)}
    snapshot = tmp_path / "models--org--name" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert vllm_standin.load_time("org/name", env) == 0.0
    (snapshot / "simlab-load-seconds").write_text("20\n")
    assert vllm_standin.load_time("org/name", env) == 20.0
    # The stand-in's own variable, where it is set (the stand-in's own tests), comes first.
    assert vllm_standin.load_time("org/name", env | {"SIMLAB_VLLM_LOAD_SECONDS": "1.5"}) == 1.5
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "simlab-load-seconds").write_text("3")
    assert vllm_standin.load_time(str(tmp_path / "local"), env) == 3.0
    assert vllm_standin.capture_time("org/name", env) == 0.0
    (snapshot / "simlab-capture-seconds").write_text("30\n")
    assert vllm_standin.capture_time("org/name", env) == 30.0
    assert vllm_standin.capture_time("org/name", env | {"SIMLAB_VLLM_CAPTURE_SECONDS": "2"}) == 2.0
    assert vllm_standin.answer_mode("org/name", env) == ""
    (snapshot / "simlab-answer").write_text("gibberish\n")
    assert vllm_standin.answer_mode("org/name", env) == "gibberish"


@pytest.mark.parametrize(
    ("answer", "code", "said"),
    [
        ("", 0, 'canary passed: "42 harbor"'),
        ("gibberish", 1, '"Theorem quantum banana'),
        ("empty-reasoning", 1, "a thinking template hiding the answer"),
    ],
)
def test_the_answer_canary_against_the_standin(
    start: Callable[..., Server], tmp_path: Path, answer: str, code: int, said: str
) -> None:
    """The stand-in answers the canary's sum and word (its model: 'A + B' and the word asked),
    or, told by SIMLAB_STANDIN_ANSWER (a lane is told by a file beside its model's config.json:
    test_a_model_gives_its_load_time_and_answer_beside_its_config), garbage or only reasoning."""
    import jinja2

    server = start("--served-model-name", "lane-b", SIMLAB_STANDIN_ANSWER=answer)
    template = Path(__file__).resolve().parents[2] / "templates/spark-lane-canary.j2"
    canary = tmp_path / "spark-lane-canary"
    canary.write_text(jinja2.Template(template.read_text()).render(secrets_dir=str(tmp_path)))
    result = subprocess.run(
        [sys.executable, str(canary), "lane-b", str(server.port), "a cause"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == code, result.stdout
    assert said in result.stdout

#!/usr/bin/python3
"""Stand-in for vLLM's `vllm` command in the simulated lab's serving images.

It loads no model, uses no GPU and allocates nothing. It keeps what the deploy touches: how
`vllm serve` parses its options (checked against the option list and value types read from
the own parser of the release the image's tag carries, named in the image's `release` file),
the API key on /v1, the shapes of the OpenAI endpoints, a port that refuses connections
while "loading", and the two ways a lane spans boxes (one GPU each):

- Ray: the placement of one GPU bundle per worker across the boxes, with an exit when a box
  holding a worker dies.
- vLLM's own multi-node mode, Ray-free (executor mp: --nnodes N --node-rank R --master-addr
  --master-port, --headless above rank 0). The head (rank 0) listens on --master-port, as
  torch's TCPStore does (IPv6 and IPv4 on one socket), and loads and serves only once every
  other rank has joined; a rank's connection lost after it joined makes chat completions
  answer 500 naming it, the head staying up and /health answering 200. A headless rank binds
  no --port: it connects to the head (retrying until the distributed timeout), "loads", stays
  connected and, once the head is gone, stays up logging torch's c10d error without ever
  joining again (vllm#32136).

Standard library only, plus Ray on the Ray path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import socketserver
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn

try:  # in the image: a module on python3's path beside this command
    import standin_model as shared
except ImportError:  # imported by the lab's own tests
    from tests.simlab.serving import standin_model as shared

# Every release's option lists, and the one this image carries (`release`).
SHARE = Path("/usr/local/share/vllm-standin")
GPUS_PER_NODE = 1  # one GB10 per Spark
# vLLM's multi-node mode without Ray (docs/serving/parallelism_scaling.md, "Running vLLM with
# MultiProcessing"): ParallelConfig's defaults (vllm/config/parallel.py), and torch.distributed's
# default timeout (init_process_group), which --distributed-timeout-seconds replaces.
MASTER_ADDR = "127.0.0.1"
MASTER_PORT = 29501
DISTRIBUTED_TIMEOUT = 600.0
CONNECT_RETRY_SECONDS = 1.0  # a headless rank's tries at the head's rendezvous
C10D_REPEAT_SECONDS = 10.0  # how often an orphaned headless rank says so again
# The stand-ins' own rendezvous protocol: a rank sends this line once connected, then nothing.
RANK_LINE = re.compile(rb"rank (\d+)\n")
DEFAULT_MAX_MODEL_LEN = 32768  # vLLM reads it from the model's config; there is no model here
NODE_CHECK_SECONDS = 2.0
USAGE = "usage: vllm serve [model_tag] [options]"
# argparse reads these as values, not as options.
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgt])", re.IGNORECASE)


class UsageError(Exception):
    """A command line that vLLM's argument parser refuses (exit status 2)."""


class StartupError(Exception):
    """A configuration vLLM accepts on the command line but fails on while starting (status 1)."""


# The process a log line comes from: a headless rank runs workers only, no API server.
PROCESS = {"name": "APIServer"}


def log(level: str, message: str) -> None:
    """One line in vLLM's log format, on stdout as vLLM logs."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"({PROCESS['name']} pid={os.getpid()}) {level} {stamp} [standin] {message}", flush=True)


def _is_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not NEGATIVE_NUMBER.match(token)


def _model_option_first(argv: list[str]) -> list[str]:
    """vLLM moves `--model X` to the front as the positional model before parsing."""
    for i, token in enumerate(argv):
        if token == "--model":
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                raise UsageError("argument --model: expected one argument")
            return [argv[i + 1], *argv[:i], *argv[i + 2 :]]
        if token.startswith("--model="):
            return [token.removeprefix("--model="), *argv[:i], *argv[i + 1 :]]
    return argv


@dataclass
class Release:
    """One vLLM release's `vllm serve` as its data files describe it."""

    version: str
    options: dict[str, dict[str, Any]]  # {name: {takes_value, choices}}
    values: dict[str, dict[str, Any]]  # {name: {type, nargs, none}}: the typed ones

    @classmethod
    def read(cls, share: Path, version: str) -> Release:
        def load(kind: str) -> dict[str, Any]:
            return json.loads((share / f"vllm-{version}-{kind}.json").read_text())

        return cls(version, load("serve-options")["options"], load("option-values")["values"])


# argparse's own types for the typed options; the others are vLLM's and checked by the deploy.
ARGPARSE_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float}


def _checked(name: str, value: str, spec: dict[str, Any]) -> None:
    convert = ARGPARSE_TYPES.get(spec.get("type", ""))
    if convert is None or (spec.get("none") and value in ("None", "")):
        return
    try:
        convert(value)
    except ValueError:
        raise UsageError(f"argument {name}: invalid {convert.__name__} value: {value!r}") from None


def parse_serve(argv: list[str], release: Release) -> tuple[str | None, dict[str, Any]]:
    """Read `vllm serve` arguments as vLLM's parser does: (model, {option: value or True}).

    Names may use underscores (`--max_model_len`) and `--name=value`, as in vLLM's
    FlexibleArgumentParser; short aliases and abbreviations are not in the option list and
    are refused. An option takes one value, one or more (nargs '+') or none or one (nargs
    '?', then True without one) as the release's value types say.
    """
    argv = _model_option_first(argv)
    model: str | None = None
    values: dict[str, Any] = {}
    unrecognized: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not _is_option(token):
            if model is None:
                model = token
            else:
                unrecognized.append(token)
            continue
        name, has_inline, inline = token.partition("=")
        if name.startswith("--"):
            name = name.replace("_", "-")
        spec = release.options.get(name)
        if spec is None:
            unrecognized.append(token)
            continue
        if not spec["takes_value"]:
            if has_inline:
                raise UsageError(f"argument {name}: ignored explicit argument {inline!r}")
            values[name] = True
            continue
        typed = release.values.get(name, {})
        nargs = typed.get("nargs")
        given = [inline] if has_inline else []
        while not has_inline and i < len(argv) and not _is_option(argv[i]):
            given.append(argv[i])
            i += 1
            if nargs != "+":
                break
        if not given and nargs == "?":
            values[name] = True
            continue
        if not given:
            wanted = "at least one argument" if nargs == "+" else "one argument"
            raise UsageError(f"argument {name}: expected {wanted}")
        for value in given:
            if "choices" in spec and value not in spec["choices"]:
                allowed = ", ".join(map(repr, spec["choices"]))
                raise UsageError(
                    f"argument {name}: invalid choice: {value!r} (choose from {allowed})"
                )
            _checked(name, value, typed)
        values[name] = given if nargs == "+" else given[0]
    if unrecognized:
        raise UsageError(f"unrecognized arguments: {' '.join(unrecognized)}")
    return model, values


def human_readable_int_or_auto(value: str) -> int:
    """vLLM's type for --max-model-len: 32k = 32000, 32K = 32768, -1 or auto = the model's."""
    value = value.strip()
    if value in ("-1", "auto"):
        return -1
    match = HUMAN_INT.fullmatch(value)
    if match is None:
        return int(value)
    number, suffix = match.groups()
    power = "kmgt".index(suffix.lower()) + 1
    if suffix.islower():
        return int(float(number) * 1000**power)
    return int(number) * 1024**power


def _typed(values: dict[str, Any], name: str, convert: Callable[[str], Any], default: Any) -> Any:
    if name not in values:
        return default
    try:
        return convert(values[name])
    except ValueError:
        raise UsageError(
            f"argument {name}: invalid {convert.__name__} value: {values[name]!r}"
        ) from None


@dataclass
class ServeConfig:
    model: str
    served_names: list[str]
    host: str | None
    port: int
    api_keys: list[str]
    world_size: int
    backend: str
    gpu_memory_utilization: float
    max_model_len: int
    access_log: bool
    nnodes: int = 1
    node_rank: int = 0
    headless: bool = False
    master_addr: str = MASTER_ADDR
    master_port: int = MASTER_PORT
    distributed_timeout: float = DISTRIBUTED_TIMEOUT
    enforce_eager: bool = False  # no CUDA graphs captured


def more_than_gpus(world_size: int) -> StartupError:
    """vLLM's refusal of more workers than this node's GPUs (ParallelConfig)."""
    return StartupError(
        f"World size ({world_size}) is larger than the number of available GPUs "
        f"({GPUS_PER_NODE}) in this node. If this is intentional and you are using:\n"
        "- ray, set '--distributed-executor-backend ray'.\n"
        "- multiprocessing, set '--nnodes' appropriately."
    )


def multi_node_backend(
    world_size: int, nnodes: int, node_rank: int, headless: bool, backend: str | None
) -> str:
    """The executor of one rank of vLLM's own multi-node mode, or StartupError as vLLM fails.

    vLLM's checks, in its order: create_engine_config (vllm/engine/arg_utils.py) asserts the
    world size divisible by --nnodes and the rank below it; ParallelConfig (vllm/config/
    parallel.py) takes mp when no backend is named and nnodes > 1, and refuses Ray there. With
    one GPU a box, each node holds one worker: the world size must be --nnodes. A rank above 0
    runs only workers under --headless (vllm/entrypoints/cli/serve.py run_headless); without it,
    it starts an engine of its own that fails (vllm-project/vllm#36875).
    """
    if world_size % nnodes:
        raise StartupError(
            f"AssertionError: world_size={world_size} must be divisible by nnodes={nnodes}."
        )
    if node_rank >= nnodes:
        raise StartupError(
            f"AssertionError: node_rank={node_rank} must be less than nnodes={nnodes}."
        )
    backend = backend or "mp"
    if nnodes > 1 and backend not in ("mp", "uni", "external_launcher"):
        raise StartupError(
            "nnodes > 1 can only be set when distributed executor backend is mp, uni or "
            "external_launcher."
        )
    if backend != "mp" and world_size > GPUS_PER_NODE:  # every worker on this node
        raise more_than_gpus(world_size)
    if world_size // nnodes > GPUS_PER_NODE:
        raise StartupError(
            f"World size ({world_size}) over {nnodes} nodes puts {world_size // nnodes} workers "
            f"on each node, more than the number of available GPUs ({GPUS_PER_NODE}) in this "
            f"node: with one GPU a node, --nnodes must be the world size ({world_size})."
        )
    if headless and node_rank == 0:
        # run_headless at rank 0 starts an engine waiting for a front-end that never comes.
        raise StartupError(
            "--headless is for the ranks above 0: rank 0 is the head, which serves the API"
        )
    if node_rank > 0 and not headless:
        raise StartupError(
            f"node_rank={node_rank} without --headless: AssertionError: collective_rpc should "
            "not be called on follower node"
        )
    return backend


def serve_config(model: str | None, values: dict[str, Any], env: dict[str, str]) -> ServeConfig:
    """The settings the stand-in acts on, with vLLM's defaults."""
    if model is None:
        raise UsageError("the stand-in needs the model: vllm serve MODEL [options]")
    world_size = _typed(values, "--tensor-parallel-size", int, 1) * _typed(
        values, "--pipeline-parallel-size", int, 1
    )
    nnodes = _typed(values, "--nnodes", int, 1)
    node_rank = _typed(values, "--node-rank", int, 0)
    headless = "--headless" in values
    backend = values.get("--distributed-executor-backend")
    if nnodes > 1 or node_rank or headless:
        backend = multi_node_backend(world_size, nnodes, node_rank, headless, backend)
    else:
        if backend is None:
            # vLLM turns to Ray by itself when a node has fewer GPUs than the world size.
            backend = "ray" if world_size > GPUS_PER_NODE else "uni"
        if backend != "ray" and world_size > GPUS_PER_NODE:
            raise more_than_gpus(world_size)
    max_model_len = _typed(values, "--max-model-len", human_readable_int_or_auto, -1)
    # torch's default unless --distributed-timeout-seconds says (None: not set); the stand-in's
    # own tests shorten the default with SIMLAB_VLLM_DISTRIBUTED_TIMEOUT.
    timeout = values.get("--distributed-timeout-seconds")
    if timeout in (None, "None", ""):
        timeout = env.get("SIMLAB_VLLM_DISTRIBUTED_TIMEOUT") or DISTRIBUTED_TIMEOUT
    return ServeConfig(
        model=model,
        served_names=values.get("--served-model-name") or [model],
        host=values.get("--host"),
        port=_typed(values, "--port", int, 8000),
        # --api-key wins over VLLM_API_KEY; empty keys do not count (vLLM's build_app).
        api_keys=[key for key in (values.get("--api-key") or [env.get("VLLM_API_KEY")]) if key],
        world_size=world_size,
        backend=backend,
        gpu_memory_utilization=_typed(values, "--gpu-memory-utilization", float, 0.9),
        max_model_len=DEFAULT_MAX_MODEL_LEN if max_model_len == -1 else max_model_len,
        access_log="--disable-uvicorn-access-log" not in values,
        nnodes=nnodes,
        node_rank=node_rank,
        headless=headless,
        master_addr=values.get("--master-addr") or MASTER_ADDR,
        master_port=_typed(values, "--master-port", int, MASTER_PORT),
        distributed_timeout=float(timeout),
        enforce_eager="--enforce-eager" in values,
    )


@dataclass
class Placement:
    """The Ray placement group holding one GPU per worker, and the nodes of its bundles."""

    group: Any
    node_ids: list[str]
    node_ips: list[str]


def place_workers(world_size: int, timeout: float) -> Placement:
    """Reserve one GPU per worker on distinct Ray nodes, as vLLM's Ray executor does."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    log("INFO", "Connecting to the Ray cluster (address=auto)")
    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    driver_ip = os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()
    specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(world_size)]
    # vLLM pins the first worker to the driver's node through its node:<ip> resource, so a
    # VLLM_HOST_IP that is no Ray node's address leaves the group unplaceable, as on real boxes.
    specs[0][f"node:{driver_ip}"] = 0.001
    group = placement_group(specs, strategy="STRICT_SPREAD")
    ready = group.ready()
    start = time.monotonic()
    next_report = 10.0
    while not ray.wait([ready], timeout=1)[0]:
        waited = time.monotonic() - start
        if waited >= timeout:
            raise StartupError(
                f"Cannot provide a placement group of placement_group_specs={specs} within "
                f"{timeout:g} seconds. See `ray status` and `ray list nodes` to make sure the "
                "cluster has enough resources."
            )
        if waited >= next_report:
            log(
                "INFO",
                f"Waiting for creating a placement group of specs for {int(waited)} seconds. "
                f"specs={specs}. Check `ray status` and `ray list nodes` to see if you have "
                "enough resources, and make sure the IP addresses used by ray cluster are the "
                "same as VLLM_HOST_IP environment variable specified in each node if you are "
                "running on a multi-node.",
            )
            next_report *= 2
    bundles = placement_group_table(group)["bundles_to_node_id"]
    addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    node_ids = [bundles[index] for index in range(world_size)]
    return Placement(group, node_ids, [addresses[node_id] for node_id in node_ids])


# What vLLM's Ray executor copies from the driver's environment to its workers (vllm/ray/
# ray_env.py get_env_vars_to_copy: its default prefixes); the rest is the Ray node's own.
CARRIED_PREFIXES = ("VLLM_", "LMCACHE_", "NCCL_", "UCX_", "HF_", "HUGGING_FACE_")


def models_on_workers(placement: Placement, model: str) -> None:
    """Each worker loads the weights on its own node: run where its bundle is, in the Ray
    node's container, with the driver's carried variables, it must find the model there."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    carried = {k: v for k, v in os.environ.items() if k.startswith(CARRIED_PREFIXES)}

    @ray.remote(num_cpus=0, num_gpus=1)
    def missing_here(env: dict[str, str]) -> str | None:
        return model_not_cached(model, os.environ | env)

    answers = ray.get(
        [
            missing_here.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement.group, index)
            ).remote(carried)
            for index in range(len(placement.node_ips))
        ]
    )
    for ip, missing in zip(placement.node_ips, answers, strict=True):
        if missing:
            raise StartupError(f"the Ray worker on {ip}: {missing}")


def dead_workers(placement: Placement) -> str | None:
    """Why the engine cannot go on (a node of the group is dead or Ray is gone), or None."""
    import ray

    try:
        alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    except Exception as error:  # whatever Ray raises once its GCS is gone ends the engine
        return f"lost the Ray cluster: {error}"
    dead = [
        f"{ip} ({node_id[:8]})"
        for node_id, ip in zip(placement.node_ids, placement.node_ips, strict=True)
        if node_id not in alive
    ]
    return f"Ray node {', '.join(dead)} holding a worker died" if dead else None


def _read_line(conn: socket.socket, limit: int = 64) -> bytes:
    """Bytes up to and including the first newline, or what came before the peer stopped."""
    line = b""
    while not line.endswith(b"\n") and len(line) < limit:
        byte = conn.recv(1)
        if not byte:
            break
        line += byte
    return line


class Rendezvous:
    """The head's end of vLLM's multi-node mode: rank 0's torch.distributed store on
    --master-port, where every other rank connects, stays connected while the group lives, and
    is told apart by the line RANK_LINE. A rank whose connection closes after it joined is lost
    for good: torch's group does not take a rank back."""

    def __init__(self, port: int, nnodes: int):
        self.port = port
        self.nnodes = nnodes
        self.listener = self._listen(port)
        self.members: dict[int, tuple[socket.socket, str]] = {}  # every rank that joined
        self.lost: dict[int, str] = {}
        self.changed = threading.Condition()
        self.closing = False
        host, bound = self.listener.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        log("INFO", f"[c10d] The server socket has started to listen on {shown}:{bound}.")
        threading.Thread(target=self._accept, daemon=True).start()

    @staticmethod
    def _listen(port: int) -> socket.socket:
        """Every interface, as torch's TCPStore listens (TCPStoreLibUvBackend.cpp: IPv6 "::",
        which takes IPv4 too, else IPv4 "0.0.0.0"), with SO_REUSEADDR as its socket sets, so a
        restarted head binds again at once. A rank reaching an IPv6 listener over IPv4 is seen
        on the head (by ss, by accept) as ::ffff:a.b.c.d."""
        try:
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        except (OSError, ValueError):  # no IPv6 here
            pass
        try:
            return socket.create_server(("", port))
        except OSError as error:
            raise StartupError(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on "
                f"any local network address. port: {port}, {error}"
            ) from None

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:  # closed
                return
            address = peer[0].removeprefix("::ffff:")  # IPv4 through the IPv6 listener
            threading.Thread(target=self._member, args=(conn, address), daemon=True).start()

    def _member(self, conn: socket.socket, peer: str) -> None:
        """One connection: its rank's join, then its loss once it closes."""
        try:
            conn.settimeout(10)
            line = _read_line(conn)
            conn.settimeout(None)
        except OSError:
            line = b""
        match = RANK_LINE.fullmatch(line)
        rank = int(match[1]) if match else None
        with self.changed:
            refused = (
                "no rank line" if rank is None
                else f"rank {rank} out of 1..{self.nnodes - 1}" if not 0 < rank < self.nnodes
                else f"rank {rank} already joined" if rank in self.members
                else None
            )  # fmt: skip
            if refused is None:
                assert rank is not None
                self.members[rank] = (conn, peer)
                log(
                    "INFO",
                    f"rank {rank} joined the torch.distributed group from {peer} "
                    f"({len(self.members) + 1}/{self.nnodes} ranks)",
                )
                self.changed.notify_all()
        if refused is not None:
            log("WARNING", f"connection from {peer} on port {self.port} refused: {refused}")
            conn.close()
            return
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        with self.changed:
            if self.closing:
                return
            self.lost[rank] = peer
        log(
            "ERROR",
            f"rank {rank} ({peer}) left the torch.distributed group: its connection on port "
            f"{self.port} closed. The engine's next collective cannot complete; vLLM does not "
            "take a rank back.",
        )

    def wait_for_ranks(self, timeout: float) -> None:
        """Return once every other rank joined, or fail as torch's store does after timeout."""
        log(
            "INFO",
            f"Waiting for {self.nnodes - 1} headless rank(s) to join the torch.distributed "
            f"group on port {self.port} (timeout {timeout:g} s)",
        )
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.members) == self.nnodes - 1, timeout):
                raise StartupError(
                    f"torch.distributed.DistStoreError: Timed out after {timeout:g} seconds "
                    f"waiting for clients. {len(self.members) + 1}/{self.nnodes} clients joined."
                )
        log("INFO", f"All {self.nnodes} ranks joined the torch.distributed group")

    def lost_rank(self) -> str | None:
        """Why the engine cannot run (a rank lost), or None."""
        with self.changed:
            if not self.lost:
                return None
            rank, peer = min(self.lost.items())
        return (
            f"rank {rank} of the torch.distributed group ({peer}) is gone: its connection to "
            f"the head on port {self.port} closed, and the engine's collectives need every rank."
        )

    def close(self) -> None:
        with self.changed:
            self.closing = True
            members = [conn for conn, _ in self.members.values()]
        for sock in [self.listener, *members]:
            with contextlib.suppress(OSError):  # not connected
                sock.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked on it
            sock.close()


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True
    # vLLM's uvicorn listens with a backlog of 2048 (uvicorn docs/settings.md, --backlog);
    # socketserver's 5 resets connections under 16 concurrent clients (bench/router.py).
    request_queue_size = 2048

    def __init__(self, config: ServeConfig, version: str):
        host = config.host or ""
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, config.port), Handler, bind_and_activate=False)
        self.server_bind()
        self.config = config
        self.version = version
        self.created = int(time.time())
        self.token_hashes = [hashlib.sha256(key.encode()).digest() for key in config.api_keys]
        self.placement: Placement | None = None
        self.rendezvous: Rendezvous | None = None
        self.exit_code = 0
        self.answer_mode = ""

    def server_bind(self) -> None:
        # HTTPServer's own bind looks up this host's FQDN, which can stall where DNS is absent.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def authorized(self, header: str | None) -> bool:
        """vLLM's check: `Bearer <key>` matching one of the keys, compared in constant time."""
        scheme, _, key = (header or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(key.encode()).digest()
        # A list, not a generator: every key is compared, whichever matches.
        return any([secrets.compare_digest(digest, known) for known in self.token_hashes])

    def watch(self) -> None:
        """Stop serving, with a failure status, once a node holding a worker is gone."""
        assert self.placement is not None
        while (reason := dead_workers(self.placement)) is None:
            time.sleep(NODE_CHECK_SECONDS)
        log("ERROR", f"{reason}: the worker died unexpectedly before finishing its task.")
        log("ERROR", "EngineCore encountered an issue. See stack trace (above) for the root cause.")
        self.exit_code = 1
        self.shutdown()


class Handler(shared.Replies):
    server: StandinServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.config.access_log:
            client = f"{self.client_address[0]}:{self.client_address[1]}"
            print(f'INFO:     {client} - "{self.requestline}" {args[1]}', flush=True)

    def _route(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        # Only /v1 is guarded, as in vLLM 0.19 (build_app's AuthenticationMiddleware): /health,
        # /ping, /invocations, /tokenize, /metrics and the rest answer anyone
        # (vllm-project/vllm#18892; vLLM's security guide).
        guarded = path.startswith("/v1") and self.server.token_hashes
        if guarded and not self.server.authorized(self.headers.get("Authorization")):
            self._json(401, {"error": "Unauthorized"})
            return
        methods = ROUTES.get(path)
        if methods is None:
            self._json(404, {"detail": "Not Found"})
        elif method not in methods:
            self._json(405, {"detail": "Method Not Allowed"})
        else:
            methods[method](self, body)

    def _error(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        error = {"message": message, "type": kind, "param": param, "code": status}
        self._json(status, {"error": error})

    def health(self, _body: bytes) -> None:
        self._send(200, b"", "application/json")

    def version(self, _body: bytes) -> None:
        self._json(200, {"version": self.server.version})

    def models(self, _body: bytes) -> None:
        config = self.server.config
        cards = [
            {
                "id": name,
                "object": "model",
                "created": self.server.created,
                "owned_by": "vllm",
                "root": config.model,
                "parent": None,
                "max_model_len": config.max_model_len,
            }
            for name in config.served_names
        ]
        self._json(200, {"object": "list", "data": cards})

    def tokenize(self, body: bytes) -> None:
        """/tokenize as vLLM answers it: the prompt's tokens (here one per word) and counts."""
        try:
            request = json.loads(body or b"null")
        except ValueError:
            request = None
        prompt = request.get("prompt") if isinstance(request, dict) else None
        if not isinstance(prompt, str):
            self._error(400, "BadRequestError", "prompt: a string is required.")
            return
        tokens = [zlib.crc32(word.encode()) % 151_000 for word in prompt.split()]
        config = self.server.config
        self._json(
            200, {"count": len(tokens), "max_model_len": config.max_model_len, "tokens": tokens}
        )

    def metrics(self, _body: bytes) -> None:
        """/metrics in Prometheus' text format, as vLLM's exporter serves it: a few of the
        series of vllm/v1/metrics/loggers.py (PrometheusStatLogger; labels model_name and
        engine; prometheus_client adds _total to a counter's name)."""
        name = self.server.config.served_names[0]
        rows = (
            ("num_requests_running", "gauge", "Number of requests in model execution batches."),
            ("num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
            ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
            ("prompt_tokens_total", "counter", "Number of prefill tokens processed."),
            ("generation_tokens_total", "counter", "Number of generation tokens processed."),
        )
        text = "".join(
            f"# HELP vllm:{metric} {about}\n# TYPE vllm:{metric} {kind}\n"
            f'vllm:{metric}{{engine="0",model_name="{name}"}} 0.0\n'
            for metric, kind, about in rows
        )
        self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def placement(self, _body: bytes) -> None:
        placement = self.server.placement
        self._json(
            200,
            {
                "distributed_executor_backend": self.server.config.backend,
                "world_size": self.server.config.world_size,
                "bundle_node_ips": placement.node_ips if placement else [],
            },
        )

    def chat_completions(self, body: bytes) -> None:
        try:
            request = json.loads(body or b"null")
        except ValueError:
            self._error(400, "BadRequestError", "The request body is not valid JSON.")
            return
        messages = request.get("messages") if isinstance(request, dict) else None
        if not isinstance(messages, list) or not messages:
            self._error(400, "BadRequestError", "messages: a non-empty list is required.")
            return
        names = self.server.config.served_names
        model = request.get("model") or names[0]
        if model not in names:
            self._error(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
            return
        # Pessimistic about a rank lost after the start: real vLLM hangs or errors on its next
        # collective; the stand-in answers 500 naming it, and stays up (/health still 200).
        lost = self.server.rendezvous.lost_rank() if self.server.rendezvous else None
        if lost:
            self._error(500, "InternalServerError", lost)
            return
        last, prompt_tokens = shared.chat_turns(messages)
        echo = f"[vLLM {self.server.version} stand-in, no model loaded] {model} got: {last}"
        reply, reasoning = shared.reply(last, self.server.answer_mode, echo)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(reply.split()),
            "total_tokens": prompt_tokens + len(reply.split()),
        }
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
        if request.get("stream"):
            self._stream(head, reply)
            return
        message = {"role": "assistant", "content": reply, "tool_calls": []}
        if reasoning is not None:
            message["reasoning_content"] = message["reasoning"] = reasoning
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        self._json(200, {**head, "object": "chat.completion", "choices": [choice], "usage": usage})

    def _stream(self, head: dict[str, Any], reply: str) -> None:
        """Server-sent events as vLLM streams them: role, content, finish, [DONE]."""
        deltas = [
            ({"role": "assistant", "content": ""}, None),
            ({"content": reply}, None),
            ({}, "stop"),
        ]
        events = [
            json.dumps(
                {
                    **head,
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": end}],
                }
            )
            for d, end in deltas
        ]
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in [*events, "[DONE]"]:
            self.wfile.write(f"data: {event}\n\n".encode())


ROUTES: dict[str, dict[str, Callable[[Handler, bytes], None]]] = {
    "/health": {"GET": Handler.health},
    "/ping": {"GET": Handler.health, "POST": Handler.health},
    "/version": {"GET": Handler.version},
    "/v1/models": {"GET": Handler.models},
    "/v1/chat/completions": {"POST": Handler.chat_completions},
    # SageMaker's entry point: the same chat request as /v1/chat/completions, outside /v1.
    "/invocations": {"POST": Handler.chat_completions},
    "/tokenize": {"POST": Handler.tokenize},
    "/metrics": {"GET": Handler.metrics},
    "/simlab/placement": {"GET": Handler.placement},
}


def _interrupt(_signum: int, _frame: Any) -> NoReturn:
    raise KeyboardInterrupt("terminated")


def hub_cache(env: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps repositories: HF_HUB_CACHE, else HF_HOME/hub."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    return Path(env.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")) / "hub"


def model_not_cached(model: str, env: Mapping[str, str]) -> str | None:
    """What vLLM's start fails with when the model's config.json is not on the box and the hub
    is out of reach (huggingface_hub's two errors: offline by HF_HUB_OFFLINE, or no network);
    None when it is there. An absolute path is a local model directory."""
    if model.startswith("/"):
        if (Path(model) / "config.json").is_file():
            return None
        return f"Invalid repository ID or local directory specified: {model!r}"
    repo = hub_cache(env) / f"models--{model.replace('/', '--')}"
    if any(path.is_file() for path in repo.glob("snapshots/*/config.json")):
        return None
    if env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return (
            "Cannot find the requested files in the disk cache and outgoing traffic has been"
            " disabled. To enable hf.co look-ups and downloads online, set 'HF_HUB_OFFLINE=0' as"
            f" environment variable. ({model}: config.json)"
        )
    return (
        "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find"
        f" them in the cached files. ({model}: config.json)"
    )


# Where a lab test gives a model its load time: LOAD_SECONDS_FILE beside its config.json, as if
# its weights took that long to read, and CAPTURE_SECONDS_FILE, its CUDA graphs' capture (the
# deploy refuses variables vLLM does not read, so a lane cannot carry the stand-in's own
# SIMLAB_VLLM_LOAD_SECONDS and SIMLAB_VLLM_CAPTURE_SECONDS).


# Where a lab test makes the model answer badly (standin_model.py): beside its config.json, like
# its load time.


def beside_model(model: str, env: Mapping[str, str], name: str) -> str | None:
    """The text of the lab's file `name` in the model's snapshot (or directory), if any."""
    if model.startswith("/"):
        files = [Path(model) / name]
    else:
        repo = hub_cache(env) / f"models--{model.replace('/', '--')}"
        files = sorted(repo.glob(f"snapshots/*/{name}"))
    return next((f.read_text().strip() for f in files if f.is_file()), None)


def load_time(model: str, env: Mapping[str, str]) -> float:
    """Seconds the stand-in takes to "load" the model: SIMLAB_VLLM_LOAD_SECONDS, else the
    number in LOAD_SECONDS_FILE beside the model's config.json, else 0."""
    if env.get("SIMLAB_VLLM_LOAD_SECONDS"):
        return float(env["SIMLAB_VLLM_LOAD_SECONDS"])
    return float(beside_model(model, env, shared.LOAD_SECONDS_FILE) or 0)


def capture_time(model: str, env: Mapping[str, str]) -> float:
    """Seconds the stand-in takes to "capture" the model's CUDA graphs: SIMLAB_VLLM_CAPTURE_SECONDS,
    else the number in CAPTURE_SECONDS_FILE beside the model's config.json, else 0."""
    if env.get("SIMLAB_VLLM_CAPTURE_SECONDS"):
        return float(env["SIMLAB_VLLM_CAPTURE_SECONDS"])
    return float(beside_model(model, env, shared.CAPTURE_SECONDS_FILE) or 0)


def answer_mode(model: str, env: Mapping[str, str]) -> str:
    """How the model answers: SIMLAB_STANDIN_ANSWER (the stand-in's own tests), else ANSWER_FILE
    beside its config.json, else "" (right)."""
    return env.get(shared.ANSWER_VARIABLE) or beside_model(model, env, shared.ANSWER_FILE) or ""


def load(config: ServeConfig) -> float:
    """Pretend to start a rank's share of the model, logging vLLM's lines in vLLM's order
    (vllm/v1/engine/core.py _initialize_kv_caches, vLLM 0.19.0 to 0.33.0): its weights loaded
    (gpu_model_runner.py load_model), the KV cache sized (gpu_worker.py
    determine_available_memory) and allocated (initialize_from_config: no line), then the CUDA
    graphs captured unless --enforce-eager (gpu_worker.py compile_or_warm_up_model,
    gpu_model_runner.py capture_model). Each waits its time; none takes memory here. Returns
    the seconds from the weights loaded to the graphs captured."""
    load_seconds = load_time(config.model, os.environ)
    log("INFO", f"Starting to load model {config.model}...")
    time.sleep(load_seconds)
    # vLLM's format_gib: round(bytes / GiB, 2) as str.
    log("INFO", f"Model loading took 0.0 GiB memory and {load_seconds:.6f} seconds")
    log("INFO", "Available KV cache memory: 0.0 GiB")
    if config.enforce_eager:
        return 0.0
    capture_seconds = capture_time(config.model, os.environ)
    time.sleep(capture_seconds)
    log("INFO", f"Graph capturing finished in {capture_seconds:.0f} secs, took 0.00 GiB")
    return capture_seconds


def join_head(config: ServeConfig) -> socket.socket:
    """A headless rank's connection to the head's rendezvous, tried every second until the
    distributed timeout as torch's store client does (StartupError then); its rank sent."""
    head = (config.master_addr, config.master_port)
    deadline = time.monotonic() + config.distributed_timeout
    tries = 0
    while True:
        try:
            conn = socket.create_connection(head, timeout=CONNECT_RETRY_SECONDS)
            break
        except OSError as error:
            if tries % 30 == 0:  # torch says it on each try; the stand-in now and then
                log(
                    "WARNING",
                    f"[c10d] The client socket has failed to connect to [{head[0]}]:{head[1]} "
                    f"(errno: {error.errno} - {error.strerror or error}).",
                )
            tries += 1
        if time.monotonic() + CONNECT_RETRY_SECONDS > deadline:
            raise StartupError(
                "torch.distributed.DistNetworkError: The client socket has timed out after "
                f"{config.distributed_timeout * 1000:.0f}ms while trying to connect to "
                f"({head[0]}, {head[1]})."
            )
        time.sleep(CONNECT_RETRY_SECONDS)
    conn.settimeout(None)
    conn.sendall(f"rank {config.node_rank}\n".encode())
    return conn


def run_headless(config: ServeConfig, version: str, non_default: dict[str, Any]) -> int:
    """A rank above 0 (vllm/entrypoints/cli/serve.py run_headless): no API server and no port,
    only its workers, in the head's torch.distributed group. Once the head is gone it stays up,
    saying so, and never joins again, as vLLM's does (vllm-project/vllm#32136): whatever
    supervises the lane restarts it. Returns the exit status."""
    PROCESS["name"] = "Worker"
    log("INFO", f"non-default args: {non_default}")
    try:
        missing = model_not_cached(config.model, os.environ)
        if missing:
            log("ERROR", missing)
            return 1
        head = f"{config.master_addr}:{config.master_port}"
        log(
            "INFO",
            f"Launching vLLM (v{version}) headless multiproc executor, with head node address "
            f"{head} for torch.distributed process group.",
        )
        conn = join_head(config)
        fd, (host, port) = conn.fileno(), conn.getsockname()[:2]
        log("INFO", f"rank {config.node_rank} joined the torch.distributed group at {head}")
        load(config)
        while conn.recv(64):
            pass
        conn.close()
        while True:
            log(
                "WARNING",
                f"[c10d] recvValue failed on SocketImpl(fd={fd}, addr=[{host}]:{port}, "
                f"remote=[{config.master_addr}]:{config.master_port}): Connection was likely "
                "closed. Did the remote server shutdown or crash?",
            )
            time.sleep(C10D_REPEAT_SECONDS)
    except StartupError as error:
        log("ERROR", str(error))
        return 1
    except KeyboardInterrupt:
        log("INFO", "Shutting down.")
    return 0


def serve(config: ServeConfig, version: str, non_default: dict[str, Any]) -> int:
    """Start as vLLM does: bind, gather the workers (Ray's placement or the ranks of the
    multi-node mode), load, then answer. Returns the exit status."""
    signal.signal(signal.SIGTERM, _interrupt)
    if config.headless:
        return run_headless(config, version, non_default)
    log("INFO", f"vLLM API server version {version}")
    # Like the vLLM releases that do not redact it, this prints an --api-key in clear.
    log("INFO", f"non-default args: {non_default}")
    try:
        # vLLM binds its port before building the engine and listens once it is loaded.
        server = StandinServer(config, version)
    except OSError as error:
        log("ERROR", f"cannot bind {config.host or '0.0.0.0'}:{config.port}: {error}")
        return 1
    try:
        # vLLM reads the model's config.json first (its ModelConfig), downloading what the
        # cache lacks: the lab reaches no hub, so a model not on the box stops the start.
        missing = model_not_cached(config.model, os.environ)
        if missing:
            log("ERROR", missing)
            server.server_close()
            return 1
        if config.backend == "ray":
            timeout = float(os.environ.get("SIMLAB_VLLM_PLACEMENT_TIMEOUT", "600"))
            server.placement = place_workers(config.world_size, timeout)
            # ray.init puts in its own SIGTERM handler (a stack dump, status 15): take it back.
            signal.signal(signal.SIGTERM, _interrupt)
            log("INFO", f"Ray workers placed on {', '.join(server.placement.node_ips)}")
            models_on_workers(server.placement, config.model)
        elif config.nnodes > 1:
            # Rank 0's worker makes the group's store and waits for every rank before loading.
            server.rendezvous = Rendezvous(config.master_port, config.nnodes)
            server.rendezvous.wait_for_ranks(config.distributed_timeout)
        server.answer_mode = answer_mode(config.model, os.environ)
        warm_up = load(config)
        # The engine's own line once its ranks are ready (vllm/v1/engine/core.py
        # _initialize_kv_caches: "... took %.2f seconds" in vLLM 0.19.0, "%.2f s" from 0.20.1).
        unit = "seconds" if version.startswith("0.19.") else "s"
        log(
            "INFO",
            f"init engine (profile, create kv cache, warmup model) took {warm_up:.2f} {unit}",
        )
        log(
            "INFO",
            f"gpu_memory_utilization={config.gpu_memory_utilization}, "
            f"max_model_len={config.max_model_len}: the stand-in reserves no memory",
        )
        server.server_activate()
        host = config.host or "0.0.0.0"
        shown = f"[{host}]" if ":" in host else host
        log("INFO", f"Starting vLLM API server on http://{shown}:{config.port}")
        if server.placement is not None:
            threading.Thread(target=server.watch, daemon=True).start()
        server.serve_forever(poll_interval=0.5)
    except StartupError as error:
        log("ERROR", str(error))
        return 1
    except ConnectionError as error:  # ray.init found no cluster
        log("ERROR", f"Ray: {error}")
        return 1
    except KeyboardInterrupt:
        log("INFO", "Shutting down FastAPI HTTP server.")
    finally:
        server.server_close()
        if server.rendezvous is not None:
            server.rendezvous.close()
    return server.exit_code


def main(argv: list[str]) -> int:
    # The lab's own tests run the stand-in outside an image, naming the data and the release.
    share = Path(os.environ.get("SIMLAB_VLLM_SHARE", SHARE))
    version = os.environ.get("SIMLAB_VLLM_RELEASE") or (share / "release").read_text().strip()
    release = Release.read(share, version)
    if argv[:1] == ["--version"]:
        print(version)
        return 0
    if argv[:1] != ["serve"]:
        print("usage: vllm [-h] [--version] {serve} ...", file=sys.stderr)
        given = repr(argv[0]) if argv else "nothing"
        print(f"vllm: error: the stand-in knows only `serve` (got {given})", file=sys.stderr)
        return 2
    try:
        model, values = parse_serve(argv[1:], release)
        if values.get("--help"):
            print(USAGE)
            return 0
        config = serve_config(model, values, dict(os.environ))
    except UsageError as error:
        print(USAGE, file=sys.stderr)
        print(f"vllm serve: error: {error}", file=sys.stderr)
        return 2
    except StartupError as error:
        log("ERROR", str(error))
        return 1
    non_default = {"model_tag": model} | {
        name[2:].replace("-", "_"): value for name, value in values.items()
    }
    return serve(config, version, non_default)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

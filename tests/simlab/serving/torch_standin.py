"""PyTorch in the lab's serving image: the part of `torch` and `torch.distributed` (backend
"nccl") that files/nccl_check.py uses, installed as the image's `torch` package.

What it stands in for: NCCL's choice of transport and its INFO log, and the collectives'
traffic. What is real: the launch (the deploy's `docker run`), the environment, the rendezvous
(a TCP store at MASTER_ADDR:MASTER_PORT, as torch's env:// one), NCCL's bootstrap ring over each
rank's out-of-band address (the first NCCL_SOCKET_IFNAME interface), and the bytes: every collective
moves as many bytes between the boxes as NCCL's ring would (all_gather (n-1)/n of the result
per rank, all_reduce 2(n-1)/n), over TCP between the fabric addresses of the devices NCCL would
use, so a twin left out carries nothing and the lab's veths set the bandwidth.

The transport, as NCCL documents it (NCCL docs, Environment Variables: NCCL_IB_HCA,
NCCL_SOCKET_IFNAME; Troubleshooting, "Docker": the RDMA devices must be passed to the container):
NET/IB when the container has /dev/infiniband and NCCL_IB_HCA (a prefix list, "=" for exact
names, "^" to exclude) names devices present whose port has a RoCE v2 IPv4 GID, else NET/Socket
on NCCL_SOCKET_IFNAME. The lab's kernel has no RDMA: a device is present here when its netdev is
(a Spark's names share the PCI path: rocep1s0f1 and enp1s0f1np1, roceP2p1s0f1 and
enP2p1s0f1np1), and its RoCE v2 IPv4 GID when that netdev has an IPv4 address (the kernel keeps
one for each: tests/simlab/hardware/simlab-rdma.py). Tensors hold their values as runs
(value, count): the values travel as a short header beside the bytes, which are zeros.

NCCL's version is the one the image stands in for carries (NCCL_VERSION_FILE, written into each
stand-in image from the deploy's image table, spark/vllm_release.py), with "+simlab" for its
build. The architecture is not simulated: files/nccl_check.py reads the box's own
(platform.machine()), which in the lab is this machine's, not a Spark's aarch64.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

__version__ = "2.11.0+simlab"
# Beside this package in the image: the NCCL release the image carries ("2.29.7").
NCCL_VERSION_FILE = Path(__file__).with_name("nccl_version")


def _nccl_version() -> tuple[int, ...]:
    return tuple(int(part) for part in NCCL_VERSION_FILE.read_text().strip().split("."))


CHUNK = 1 << 20
NETDEV = re.compile(r"en(?P<path>(?:P\d+)?p\d+s\d+f\d+)np\d+")
CONNECT_TIMEOUT_S = 300
# The peer's bootstrap listener is up before its address is handed round: a connect that keeps
# failing is a route that is not there (NCCL retries refused connects for a while too).
BOOTSTRAP_TIMEOUT_S = 20


class dtype:
    def __init__(self, name: str, size: int):
        self.name, self.itemsize = name, size


float32 = dtype("float32", 4)
int64 = dtype("int64", 8)
bool_ = dtype("bool", 1)


class Tensor:
    """A tensor as runs of equal values: [(value, count), ...] in row-major order."""

    def __init__(self, runs: list[tuple[float, int]], shape: tuple[int, ...], kind: dtype):
        self.runs, self.shape, self.dtype = _merged(runs), shape, kind

    def numel(self) -> int:
        return sum(count for _, count in self.runs)

    def item(self) -> float:
        return self.runs[0][0] if self.runs else 0.0

    def view(self, *shape: int) -> Tensor:
        return Tensor(self.runs, tuple(shape), self.dtype)

    def reshape(self, *shape: int) -> Tensor:
        return self.view(*shape)

    def unsqueeze(self, dim: int) -> Tensor:
        shape = list(self.shape)
        shape.insert(dim, 1)
        return Tensor(self.runs, tuple(shape), self.dtype)

    def fill_(self, value: float) -> Tensor:
        self.runs = [(value, self.numel())]
        return self

    def sum(self) -> Tensor:
        return Tensor([(sum(v * c for v, c in self.runs), 1)], (), self.dtype)

    def __ne__(self, other: object) -> Tensor:  # type: ignore[override]
        theirs = _broadcast(other, self.shape)
        return Tensor(_pairwise(self.runs, theirs, lambda a, b: float(a != b)), self.shape, bool_)


def _merged(runs: list[tuple[float, int]]) -> list[tuple[float, int]]:
    out: list[tuple[float, int]] = []
    for value, count in runs:
        if count and out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + count)
        elif count:
            out.append((value, count))
    return out


def _broadcast(other: object, shape: tuple[int, ...]) -> list[tuple[float, int]]:
    """A number, a tensor of ``shape``, or one of shape (rows, 1) against (rows, columns)."""
    total = 1
    for size in shape:
        total *= size
    if not isinstance(other, Tensor):
        return [(float(other), total)]  # type: ignore[arg-type]
    if other.shape == shape:
        return other.runs
    return [(value, count * shape[-1]) for value, count in other.runs]


def _pairwise(a: list, b: list, op) -> list[tuple[float, int]]:
    out, i, j, left_a, left_b = [], 0, 0, a[0][1] if a else 0, b[0][1] if b else 0
    while i < len(a) and j < len(b):
        step = min(left_a, left_b)
        out.append((op(a[i][0], b[j][0]), step))
        left_a, left_b = left_a - step, left_b - step
        if not left_a and (i := i + 1) < len(a):
            left_a = a[i][1]
        if not left_b and (j := j + 1) < len(b):
            left_b = b[j][1]
    return _merged(out)


def _count(size: tuple[int, ...] | int) -> tuple[int, tuple[int, ...]]:
    shape = (size,) if isinstance(size, int) else tuple(size)
    total = 1
    for n in shape:
        total *= n
    return total, shape


def full(size, value: float, device: str = "cpu", dtype: dtype = float32) -> Tensor:
    total, shape = _count(size)
    return Tensor([(value, total)], shape, dtype)


def empty(size, device: str = "cpu", dtype: dtype = float32) -> Tensor:
    return full(size, 0.0, device, dtype)


def ones(size, device: str = "cpu", dtype: dtype = float32) -> Tensor:
    return full(size, 1.0, device, dtype)


def arange(start: int, end: int, device: str = "cpu", dtype: dtype = int64) -> Tensor:
    return Tensor([(float(v), 1) for v in range(start, end)], (end - start,), dtype)


def tensor(values: list[float], device: str = "cpu", dtype: dtype = float32) -> Tensor:
    return Tensor([(float(v), 1) for v in values], (len(values),), dtype)


# --- torch.cuda: the lab's "GPU" (its nvidia-smi stand-in) needs nothing here ---------------

cuda = types.SimpleNamespace(
    set_device=lambda device: None,
    synchronize=lambda: None,
    nccl=types.SimpleNamespace(version=_nccl_version),
)


# --- NCCL's log ---------------------------------------------------------------------------


class _Log:
    """NCCL's INFO lines (NCCL_DEBUG=INFO), to NCCL_DEBUG_FILE (%h host, %p pid) or stdout, in
    NCCL's format: "host:pid:tid [cudaDev] NCCL INFO ..." (NVIDIA/nccl src/debug.cc)."""

    def __init__(self) -> None:
        self.on = os.environ.get("NCCL_DEBUG", "").upper() == "INFO"
        self.host, self.pid = socket.gethostname(), os.getpid()
        name = os.environ.get("NCCL_DEBUG_FILE")
        if self.on and name:
            self.out = open(name.replace("%h", self.host).replace("%p", str(self.pid)), "a")  # noqa: SIM115
        else:
            self.out = sys.stdout

    def __call__(self, message: str, level: str = "INFO") -> None:
        if self.on or level == "WARN":
            tid = threading.get_native_id()
            print(f"{self.host}:{self.pid}:{tid} [0] NCCL {level} {message}", file=self.out)
            self.out.flush()


def _ipv4(ifname: str) -> str | None:
    shown = subprocess.run(
        ["ip", "-j", "-4", "address", "show", "dev", ifname], capture_output=True, text=True
    )
    links = json.loads(shown.stdout or "[]") if shown.returncode == 0 else []
    return next((a["local"] for link in links for a in link.get("addr_info", [])), None)


def _selected(names: list[str], spec: str) -> list[str]:
    """NCCL's list syntax (NCCL_IB_HCA, NCCL_SOCKET_IFNAME): prefixes, "=" exact, "^" none of."""
    exclude, spec = spec.startswith("^"), spec.lstrip("^")
    exact, spec = spec.startswith("="), spec.lstrip("=")
    wanted = [item.split(":")[0] for item in spec.split(",") if item]
    hit = [n for n in names if any(n == w if exact else n.startswith(w) for w in wanted)]
    return [n for n in names if n not in hit] if exclude else hit


def _rdma_devices() -> dict[str, str]:
    """The RDMA devices the container can use, each with its netdev (empty without
    /dev/infiniband: what a container not handed the devices sees)."""
    verbs = Path("/dev/infiniband")
    if not verbs.is_dir() or not any(verbs.glob("uverbs*")):
        return {}
    netdevs = sorted(p.name for p in Path("/sys/class/net").iterdir())
    return {f"roce{m['path']}": name for name in netdevs if (m := NETDEV.fullmatch(name))}


def _network(log: _Log) -> tuple[str, list[tuple[str, str, str]], str]:
    """("IB", [(device, netdev, address)...]) or ("Socket", [(ifname, ifname, address)...]),
    and the out-of-band address NCCL's bootstrap listens on (the first socket interface's)."""
    hca_spec = os.environ.get("NCCL_IB_HCA")
    if hca_spec:
        log(f"NCCL_IB_HCA set to {hca_spec}")
    sockets = _selected(
        sorted(p.name for p in Path("/sys/class/net").iterdir()),
        os.environ.get("NCCL_SOCKET_IFNAME", "^docker,lo"),
    )
    oob = [(name, _ipv4(name)) for name in sockets]
    oob = [(name, address) for name, address in oob if address]
    if not oob:
        log("Bootstrap : no socket interface found", "WARN")
        raise RuntimeError("NCCL error: no socket interface found")
    oob_text = f"{oob[0][0]}:{oob[0][1]}<0>"
    present = _rdma_devices()
    chosen = _selected(sorted(present), hca_spec) if hca_spec else sorted(present)
    # A device's RoCE v2 IPv4 GID: the kernel keeps one for every IPv4 address of its netdev.
    usable = [(d, present[d], a) for d in chosen if (a := _ipv4(present[d]))]
    if usable:
        devices = " ".join(f"[{i}]{d}:1/RoCE" for i, (d, _, _) in enumerate(usable))
        log(f"NET/IB : Using {devices} [RO]; OOB {oob_text}")
        log("Using network IB")
        return "IB", usable, oob[0][1]
    log("NET/IB : No device found.")
    log(f"NET/IB : Using [RO]; OOB {oob_text}")
    log("NET/Socket : Using " + " ".join(f"[{i}]{n}:{a}<0>" for i, (n, a) in enumerate(oob)))
    log("Using network Socket")
    return "Socket", [(name, name, address) for name, address in oob], oob[0][1]


# --- torch.distributed ----------------------------------------------------------------------


def _send_all(conn: socket.socket, data: bytes) -> None:
    conn.sendall(struct.pack("!Q", len(data)) + data)


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        part = conn.recv(min(size - len(buffer), CHUNK))
        if not part:
            raise RuntimeError("NCCL error: remote process exited or there was a network error")
        buffer += part
    return bytes(buffer)


def _recv_message(conn: socket.socket) -> bytes:
    (size,) = struct.unpack("!Q", _recv_exact(conn, 8))
    return _recv_exact(conn, size)


def _connect(address: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((address, port), timeout=timeout)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class _Group:
    """One communicator: this rank's links to the next rank (send) and from the one before
    (receive), one per device both ends share a subnet on (NCCL's channels)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.log = _Log()
        self.log(f"NCCL version {'.'.join(map(str, _nccl_version()))}+simlab")
        self.kind, devices, oob = _network(self.log)
        # NCCL's bootstrap: every rank listens on its out-of-band address and the ranks join a
        # ring over them (NVIDIA/nccl src/bootstrap.cc), so NCCL_SOCKET_IFNAME must reach the
        # next rank; torch's store only hands the addresses round.
        bootstrap = socket.create_server((oob, 0))
        listeners = []
        for name, _netdev, address in devices:
            server = socket.create_server((address, 0))
            listeners.append((name, address, server.getsockname()[1], server))
        mine = {
            "host": socket.gethostname(),
            "kind": self.kind,
            "devices": [(name, address, port) for name, address, port, _ in listeners],
            "bootstrap": [oob, bootstrap.getsockname()[1]],
        }
        self.peers = _rendezvous(rank, world, mine)
        self._bootstrap_ring(bootstrap)
        # NCCL's "Init START" and "Init COMPLETE" lines (the real captures in tests/unit/captured/).
        init = (
            f"ncclCommInitRankConfig comm 0x{secrets.token_hex(6)} rank {rank} nranks {world}"
            f" cudaDev 0 nvmlDev 0 busId f01000 commId 0x{secrets.token_hex(8)} - Init"
        )
        self.log(f"{init} START")
        self.next, self.prev = (rank + 1) % world, (rank - 1) % world
        self.send = self._links_to(self.peers[self.next], devices)
        self.recv = self._links_from(self.peers[self.prev], listeners)
        net = "IB" if self.kind == "IB" else "Socket"
        for channel, (index, _) in enumerate(self.send):
            self.log(
                f"Channel {channel:02d}/0 : {rank}[0] -> {self.next}[0] [send]"
                f" via NET/{net}/{index}"
            )
        for channel, (index, _) in enumerate(self.recv):
            self.log(
                f"Channel {channel:02d}/0 : {self.prev}[0] -> {rank}[0] [receive]"
                f" via NET/{net}/{index}"
            )
        if not self.send or not self.recv:
            self.log("no channel to the next or the previous rank", "WARN")
            raise RuntimeError("NCCL error: unhandled system error (no shared network)")
        self.log(f"{init} COMPLETE")

    def _bootstrap_ring(self, server: socket.socket) -> None:
        """Connect to the next rank's bootstrap address and take the previous rank's: a rank
        whose out-of-band interface does not reach the next fails as NCCL does (socket.cc's
        WARN, then "unhandled system error")."""
        address, port = self.peers[(self.rank + 1) % self.world]["bootstrap"]
        try:
            conn = _connect(address, port, BOOTSTRAP_TIMEOUT_S)
        except OSError as error:
            self.log(
                f"socketStartConnect: Connect to {address}<{port}> failed :"
                f" {error.strerror or error}",
                "WARN",
            )
            raise RuntimeError("NCCL error: unhandled system error") from None
        server.settimeout(CONNECT_TIMEOUT_S)
        taken, _ = server.accept()
        for sock in (conn, taken, server):
            sock.close()

    @staticmethod
    def _subnet(address: str) -> str:
        return address.rsplit(".", 1)[0]  # the lab's and NVIDIA's fabric subnets are /24s

    def _links_to(self, peer: dict, devices: list) -> list[tuple[int, socket.socket]]:
        theirs = {self._subnet(a): (a, p) for _, a, p in peer["devices"]}
        links = []
        for index, (_, _, address) in enumerate(devices):
            if self._subnet(address) in theirs:
                conn = _connect(*theirs[self._subnet(address)])
                _send_all(conn, str(self.rank).encode())
                links.append((index, conn))
        return links

    def _links_from(self, peer: dict, listeners: list) -> list[tuple[int, socket.socket]]:
        theirs = {self._subnet(a) for _, a, _ in peer["devices"]}
        links = []
        for index, (_, address, _, server) in enumerate(listeners):
            if self._subnet(address) in theirs:
                server.settimeout(CONNECT_TIMEOUT_S)
                conn, _ = server.accept()
                _recv_message(conn)
                links.append((index, conn))
            server.close()
        return links

    def shift(self, header: bytes, size: int) -> bytes:
        """Send ``header`` and ``size`` bytes to the next rank, split over the channels, while
        receiving the previous rank's; its header back."""
        shares = [size // len(self.send)] * len(self.send)
        shares[-1] += size - sum(shares)
        got: dict[int, bytes] = {}
        errors: list[BaseException] = []

        def send(position: int, conn: socket.socket, share: int) -> None:
            if position == 0:
                _send_all(conn, header)
            zeros = bytes(CHUNK)
            conn.sendall(struct.pack("!Q", share))
            left = share
            while left:
                step = min(left, CHUNK)
                conn.sendall(zeros[:step])
                left -= step

        def receive(position: int, conn: socket.socket) -> None:
            if position == 0:
                got[0] = _recv_message(conn)
            (left,) = struct.unpack("!Q", _recv_exact(conn, 8))
            buffer = bytearray(CHUNK)
            while left:
                n = conn.recv_into(buffer, min(left, CHUNK))
                if not n:
                    raise RuntimeError("NCCL error: remote process exited")
                left -= n

        def guarded(target, *args) -> None:
            try:
                target(*args)
            except BaseException as error:
                errors.append(error)

        threads = [
            threading.Thread(target=guarded, args=(send, i, conn, shares[i]))
            for i, (_, conn) in enumerate(self.send)
        ] + [
            threading.Thread(target=guarded, args=(receive, i, conn))
            for i, (_, conn) in enumerate(self.recv)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return got[0]

    def gather_runs(self, runs: list, size_each: int) -> list[list]:
        """Every rank's ``runs`` by rank, moving ``size_each`` bytes per ring step."""
        pieces: list[list] = [[] for _ in range(self.world)]
        pieces[self.rank] = runs
        for step in range(self.world - 1):
            sending = (self.rank - step) % self.world
            received = self.shift(json.dumps(pieces[sending]).encode(), size_each)
            pieces[(self.rank - step - 1) % self.world] = json.loads(received)
        return pieces

    def tune(self, func: str, size: int) -> None:
        if self.rank == 0:  # NCCL logs the choice on rank 0 (src/enqueue.cc, NCCL_TUNING)
            self.log(
                f"{func}: {size} Bytes -> Algo RING proto SIMPLE"
                f" channel{{Lo..Hi}}={{0..{len(self.send) - 1}}}"
            )


def _rendezvous(rank: int, world: int, mine: dict) -> list[dict]:
    """Every rank's ``mine``, through a store at MASTER_ADDR:MASTER_PORT that rank 0 holds
    (torch's env:// rendezvous with its TCPStore, which listens on every interface)."""
    address = os.environ["MASTER_ADDR"]
    port = int(os.environ.get("MASTER_PORT", "29500"))
    if rank == 0:
        server = socket.create_server(("", port), reuse_port=True)
        threading.Thread(target=_store, args=(server, world), daemon=True).start()
    conn = _connect(address, port)
    _send_all(conn, json.dumps([rank, mine]).encode())
    everyone = json.loads(_recv_message(conn))
    conn.close()
    return [everyone[str(r)] for r in range(world)]


def _store(server: socket.socket, world: int) -> None:
    joined: dict[int, dict] = {}
    conns = []
    while len(joined) < world:
        conn, _ = server.accept()
        rank, info = json.loads(_recv_message(conn))
        joined[rank] = info
        conns.append(conn)
    for conn in conns:
        _send_all(conn, json.dumps(joined).encode())
        conn.close()
    server.close()


_group: _Group | None = None


def _init_process_group(
    backend: str = "nccl", rank: int | None = None, world_size: int | None = None, **_: object
) -> None:
    global _group
    rank = int(os.environ["RANK"]) if rank is None else rank
    world = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    _group = _Group(rank, world)


def _all_gather_into_tensor(output: Tensor, input: Tensor) -> None:
    assert _group is not None
    _group.tune("AllGather", input.numel() * input.dtype.itemsize)
    pieces = _group.gather_runs(input.runs, input.numel() * input.dtype.itemsize)
    output.runs = _merged([tuple(run) for piece in pieces for run in piece])


def _all_reduce(tensor: Tensor) -> None:
    assert _group is not None
    size = tensor.numel() * tensor.dtype.itemsize
    _group.tune("AllReduce", size)
    # The ring's reduce-scatter then all-gather: 2(n-1) steps of size/n bytes each.
    per_step = size // _group.world
    pieces = _group.gather_runs(tensor.runs, per_step)
    _group.gather_runs([], per_step)
    total = pieces[0]
    for piece in pieces[1:]:
        total = _pairwise(total, piece, lambda a, b: a + b)
    tensor.runs = _merged([tuple(run) for run in total])


def _all_gather_object(objects: list, obj: object) -> None:
    assert _group is not None
    for rank, piece in enumerate(_group.gather_runs([[json.dumps(obj), 1]], 0)):
        objects[rank] = json.loads(piece[0][0])


def _barrier() -> None:
    assert _group is not None
    _group.gather_runs([], 0)


def _destroy_process_group() -> None:
    global _group
    if _group is not None:
        for _, conn in _group.send + _group.recv:
            conn.close()
        if _group.log.out is not sys.stdout:
            _group.log.out.close()
    _group = None


distributed = types.ModuleType("torch.distributed")
distributed.init_process_group = _init_process_group  # type: ignore[attr-defined]
distributed.all_gather_into_tensor = _all_gather_into_tensor  # type: ignore[attr-defined]
distributed.all_reduce = _all_reduce  # type: ignore[attr-defined]
distributed.all_gather_object = _all_gather_object  # type: ignore[attr-defined]
distributed.barrier = _barrier  # type: ignore[attr-defined]
distributed.destroy_process_group = _destroy_process_group  # type: ignore[attr-defined]
if __name__ == "torch":  # the image's torch; imported here (the lab's tests) it stays apart
    sys.modules["torch.distributed"] = distributed

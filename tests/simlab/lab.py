"""Boot, wire, reimage and tear down the lab's hosts.

Each host is a systemd-nspawn container booting the cached bare-Spark image through a per-host
overlay, in a network namespace of its own. This machine reaches the hosts over a management
bridge (their `enP7s7`); the hosts reach each other over the fabric: two veth links named as a
Spark's QSFP-DD twins, cabled as one of the fabric shapes (CABLINGS): directly between two
hosts on one port or both, port 0 of each host to port 1 of the next in a ring of three, or
through a simulated switch on port 1, port 0 or both (a bridge per twin of each cabled port, in a
namespace of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.simlab import llama_build, registry
from tests.simlab.paths import LAB_ID, PREFIX, REPO, STATE, log
from tests.simlab.rootfs import (
    ADMIN_USER,
    ensure_host_tools,
    spark_base,
    stand_in_repositories,
)
from tests.simlab.serving import hf_standin
from tests.simlab.waits import until

MGMT_BRIDGE = PREFIX
MGMT_PREFIX = f"10.77.{LAB_ID}"  # this machine's side is .1; hosts are .11, .12, ...
REGISTRY_ADDRESS = f"{MGMT_PREFIX}.1"  # the lab's registry, on this machine's side (registry.py)
FABRIC_TWINS = [("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")]  # port 1
PORT0_TWINS = [("enp1s0f0np0", "rocep1s0f0"), ("enP2p1s0f0np0", "roceP2p1s0f0")]
PORT_TWINS = {1: FABRIC_TWINS, 0: PORT0_TWINS}
# How the lab cables its hosts, named as the fabric_topology it is (docs/reference.md, Fabric
# shapes): the
# QSFP ports each host has a cable in, and how many hosts it takes. "pair": one cable on port 1;
# "pair-dual": both ports (a DAC per twin of each); "ring3": port 0 of each host to port 1 of the
# next (NVIDIA's connect-three-sparks); "switch": the same ports of every host into a switch,
# the ports the lab is told (None here: Lab.switch_ports).
CABLINGS: dict[str, tuple[tuple[int, ...] | None, int, int]] = {
    "pair": ((1,), 2, 2),
    "pair-dual": ((1, 0), 2, 2),
    "ring3": ((1, 0), 3, 3),
    "switch": (None, 2, 8),
}
# The ports a switch cabling takes, in the planner's order (the first port's first twin carries
# the sockets): what group_data's fabric_switch_ports accepts (spark/inventory/fabric.py).
SWITCH_PORTS = ((1,), (0,), (1, 0))
SWITCH_NS = f"{PREFIX}-switch"
# The lab's Hugging Face hub stand-in (hub.py), on this machine's side of the management bridge:
# the hosts' hf_endpoint (inventories/sim.py). Its rate, while no test sets another: fast enough
# that a deploy's fetches land within a lane's wait for them (operations/lanes.py FETCH_WAIT_S).
HUB_PORT = 8790
HUB_RATE = 1 << 30
# The lab's Python package index (pypi.py), beside the hub: the hosts' router_pip_index.
PYPI_PORT = 8791
REPOS_MOUNT = "/srv/simlab-repos"
HARDWARE_FILE = "/usr/local/lib/simlab/hardware.json"
# What every cabled twin of a Spark reports (ethtool `Speed: 200000Mb/s`; NVIDIA's
# spark_cluster_setup.py errs where "200000" is not in it) and what the lab's twins read unless a
# test sets another rate: the deploy, compliance and the collector all read it, so a healthy lab
# reads green.
SPARK_LINK_SPEED = 200000
# A host boots in under a second on an idle machine (systemd-analyze critical-chain: multi-user
# at 0.7 s, docker the slowest unit); the suite once saw a boot pass 90 s while other labs loaded
# the 2 cores. The limit is there to catch a hung boot, not a slow one: a host whose container
# has exited fails at once (boot_wait), one still booting gets five minutes.
BOOT_TIMEOUT = 300


@dataclass
class Host:
    name: str
    index: int
    ipv4_roce_v2_index: int = 3
    # What else the hardware file says (HARDWARE_FILE; set_hardware): the ports with no cable,
    # the RDMA devices with no RoCE v2 entry of their IPv4 address, and twins whose link rate
    # reads as given instead of a Spark's (SPARK_LINK_SPEED).
    unplugged: list[int] = field(default_factory=list)
    no_ipv4_roce_v2: list[str] = field(default_factory=list)
    link_speeds: dict[str, int] = field(default_factory=dict)
    # A kernel release the host shows in /proc/sys/kernel/osrelease (DGX OS 7.6's
    # 7.0.0-1019-nvidia, say) in place of the lab machine's own; None: its own.
    kernel: str | None = None
    pid: int | None = None

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def mgmt_ip(self) -> str:
        return f"{MGMT_PREFIX}.{10 + self.index}"

    @property
    def dir(self) -> Path:
        return STATE / "hosts" / self.name


@dataclass
class Lab:
    hosts: list[Host] = field(default_factory=list)
    cabling: str = "pair"
    switch_ports: tuple[int, ...] = (1,)  # the ports cabled to the switch ("switch" only)

    @property
    def ports(self) -> tuple[int, ...]:
        """The QSFP ports each host has a cable in."""
        ports, _fewest, _most = CABLINGS[self.cabling]
        return self.switch_ports if ports is None else ports

    def twins(self, host: Host) -> list[tuple[str, str]]:
        """(interface, RDMA device) of every twin cabled on the host."""
        return [
            twin for port in self.ports if port not in host.unplugged for twin in PORT_TWINS[port]
        ]

    @classmethod
    def load(cls) -> Lab:
        path = STATE / "lab.json"
        if not path.exists():
            return cls()
        data = json.loads(path.read_text())
        fields = set(Host.__dataclass_fields__)
        return cls(
            [Host(**{k: v for k, v in host.items() if k in fields}) for host in data["hosts"]],
            data.get("cabling", "pair"),
            tuple(data.get("switch_ports", (1,))),
        )

    def save(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        hosts = [asdict(host) | {"mgmt_ip": host.mgmt_ip} for host in self.hosts]
        (STATE / "lab.json").write_text(
            json.dumps(
                {
                    "hosts": hosts,
                    "cabling": self.cabling,
                    "switch_ports": self.switch_ports,
                    "hub": hub_url(),
                    "pypi": pypi_url(),
                },
                indent=2,
            )
        )
        write_ssh_files(self)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise SystemExit(f"no lab host named {name!r} (hosts: {[h.name for h in self.hosts]})")


def run(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, stdin=subprocess.DEVNULL, **kwargs)


def in_ns(netns: str, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return run("ip", "netns", "exec", netns, *args, check=check, **kwargs)


# --- SSH: the key, known_hosts and ssh_config pyinfra and testinfra use -----------------------


def ensure_client_key() -> Path:
    key = STATE / "id_ed25519"
    if not key.exists():
        STATE.mkdir(parents=True, exist_ok=True)
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "simlab-admin", "-f", str(key))
    return key


# The key exchange of the tests' ssh calls: OpenSSH 9.2's default, sntrup761x25519-sha512, cost
# 0.28 CPU s a call (client and sshd) where curve25519-sha256 (its default before 9.0,
# ssh_config(5)) costs 0.10, measured over 50 calls to a lab host; a CI run makes over a thousand.
# The deploy is not concerned: pyinfra connects through paramiko, which offers no sntrup.
KEX = "curve25519-sha256"


def write_ssh_files(lab: Lab) -> None:
    known, config = [], []
    for host in lab.hosts:
        pub = (host.dir / "upper/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
        known.append(f"{host.mgmt_ip} {pub[0]} {pub[1]}")
        config.append(
            f"Host {host.name}\n  HostName {host.mgmt_ip}\n  User {ADMIN_USER}\n"
            f"  IdentityFile {STATE / 'id_ed25519'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {STATE / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
            f"  ConnectTimeout 5\n  KexAlgorithms {KEX}\n"
        )
    (STATE / "known_hosts").write_text("".join(line + "\n" for line in known))
    (STATE / "ssh_config").write_text("\n".join(config))


# What ssh says when it never reached the host's shell (it exits 255 on its own errors, ssh(1)):
# the connection timed out, was refused, or closed before the session began (an sshd slow to
# answer on a loaded machine, or still starting). A session that began and lost its connection
# says "Connection to ... closed": its command may have run, and is not run again.
NOT_CONNECTED = (
    "ssh: connect to host",
    "during banner exchange",
    "kex_exchange_identification",
    "Connection closed by",
)


def ssh(host: Host, command: str, check: bool = True, timeout: float = 120) -> str:
    """The command's stdout on the host, as its admin. A connection ssh could not make is tried
    again until ``timeout`` (one slow answer is no failure); after that, ssh's own last words."""
    deadline = time.monotonic() + timeout
    tried: list[subprocess.CompletedProcess[str]] = []

    def connected() -> subprocess.CompletedProcess[str] | None:
        argv = ["ssh", "-F", str(STATE / "ssh_config"), "-o", "BatchMode=yes", host.name, command]
        left = max(1.0, deadline - time.monotonic())
        tried.append(
            subprocess.run(
                argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=left
            )
        )
        unanswered = tried[-1].returncode == 255 and any(
            words in tried[-1].stderr for words in NOT_CONNECTED
        )
        return None if unanswered else tried[-1]

    try:  # no retry of an exception: a command past its timeout may have run
        result = until(connected, timeout, f"{host.name}: ssh", deadline=deadline, retried=())
    except TimeoutError:
        result = tried[-1]
    if check and result.returncode != 0:
        raise RuntimeError(f"{host.name}: {command!r} exited {result.returncode}: {result.stderr}")
    return result.stdout


# --- one host's disk: overlay upper holding what differs from the bare image -----------------


def _admin_ids(base: Path) -> tuple[int, int]:
    for line in (base / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == ADMIN_USER:
            return int(fields[2]), int(fields[3])
    raise RuntimeError(f"no {ADMIN_USER} user in the base image")


def _write(path: Path, text: str, mode: int = 0o644, owner: tuple[int, int] = (0, 0)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, *owner)


def prepare_disk(host: Host, lab: Lab, base: Path) -> None:
    """A freshly imaged disk: new machine id and SSH host keys, the admin's key, management IP."""
    shutil.rmtree(host.dir / "upper", ignore_errors=True)
    shutil.rmtree(host.dir / "work", ignore_errors=True)
    shutil.rmtree(host.dir / "docker", ignore_errors=True)
    for sub in ("upper", "work", "root", "docker"):
        (host.dir / sub).mkdir(parents=True, exist_ok=True)
    upper = host.dir / "upper"
    _write(upper / "etc/hostname", host.name + "\n")
    _write(upper / "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
    hosts = "127.0.0.1 localhost\n" + "".join(f"{h.mgmt_ip} {h.name}\n" for h in lab.hosts)
    # The registries of the serving images' names are the lab's registry, which the hosts'
    # docker trusts by the lab's authority (a registry's CA, docker's certs.d documentation).
    hosts += f"{REGISTRY_ADDRESS} {' '.join(registry.names())}\n"
    _write(upper / "etc/hosts", hosts)
    for name in registry.names():
        _write(upper / f"etc/docker/certs.d/{name}/ca.crt", registry.AUTHORITY.read_text())
    (upper / "etc/ssh").mkdir(parents=True, exist_ok=True)
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}",
        "-f", str(upper / "etc/ssh/ssh_host_ed25519_key"))  # fmt: skip
    uid_gid = _admin_ids(base)
    home = upper / "home" / ADMIN_USER
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, *uid_gid)
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    os.chown(home / ".ssh", *uid_gid)
    pub = (ensure_client_key().with_suffix(".pub")).read_text()
    _write(home / ".ssh/authorized_keys", pub, 0o600, uid_gid)
    _write(
        upper / "etc/NetworkManager/system-connections/management.nmconnection",
        "[connection]\nid=management\ntype=ethernet\ninterface-name=enP7s7\n\n"
        f"[ipv4]\nmethod=manual\naddress1={host.mgmt_ip}/24\nnever-default=true\n\n"
        "[ipv6]\nmethod=disabled\n",
        0o600,
    )
    # DGX OS ships with NVIDIA's archive configured; the lab's stand-in of it is bound in.
    keyring = stand_in_repositories() / "dgx/archive-keyring.gpg"
    (upper / "usr/share/keyrings").mkdir(parents=True, exist_ok=True)
    shutil.copy(keyring, upper / "usr/share/keyrings/dgx-os-archive-keyring.gpg")
    _write(
        upper / "etc/apt/sources.list.d/dgx-os.list",
        "deb [signed-by=/usr/share/keyrings/dgx-os-archive-keyring.gpg] "
        f"file:{REPOS_MOUNT}/dgx /\n",
    )
    write_hardware(host, lab)


def write_hardware(host: Host, lab: Lab) -> None:
    """The hardware file the host's simlab-rdma service reads (bound in at HARDWARE_FILE)."""
    _write(host.dir / "hardware.json", json.dumps({
        "hcas": {hca: twin for twin, hca in lab.twins(host)},
        "ipv4_roce_v2_index": host.ipv4_roce_v2_index,
        "no_ipv4_roce_v2": host.no_ipv4_roce_v2,
        "link_speeds": {twin: SPARK_LINK_SPEED for twin, _hca in lab.twins(host)}
        | host.link_speeds,
        "kernel": host.kernel,
    }))  # fmt: skip


# --- networks -----------------------------------------------------------------------------------


def _link_exists(name: str, netns: str | None = None) -> bool:
    cmd = ["ip", "link", "show", name]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    return subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL).returncode == 0


def ensure_mgmt_bridge() -> None:
    if _link_exists(MGMT_BRIDGE):
        return
    run("ip", "link", "add", MGMT_BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{MGMT_PREFIX}.1/24", "dev", MGMT_BRIDGE)
    run("ip", "link", "set", MGMT_BRIDGE, "up")


def hub_url() -> str:
    return f"http://{MGMT_PREFIX}.1:{HUB_PORT}"


def start_hub() -> None:
    """The lab's hub, listening on the management bridge once this returns."""
    log_file = (STATE / "hub.log").open("w")
    model = {hf_standin.GGUF_MODEL_VARIABLE: str(llama_build.lab_model())}  # its GGUF files
    hub = subprocess.Popen(
        [sys.executable, "-m", "tests.simlab.hub", "--bind", f"{MGMT_PREFIX}.1",
         "--port", str(HUB_PORT), "--rate", str(HUB_RATE)],
        cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        env=os.environ | model,
    )  # fmt: skip
    (STATE / "hub.pid").write_text(str(hub.pid))
    until(
        lambda: "hub at" in (STATE / "hub.log").read_text(), 30, "the lab's hub did not start",
        every=0.1, hopeless=lambda: None if hub.poll() is None else (STATE / "hub.log").read_text(),
    )  # fmt: skip


def pypi_url() -> str:
    return f"http://{MGMT_PREFIX}.1:{PYPI_PORT}/simple/"


def start_pypi() -> None:
    """The lab's package index, listening on the management bridge once this returns (its
    wheelhouse downloaded first, once per machine)."""
    log_file = (STATE / "pypi.log").open("w")
    index = subprocess.Popen(
        [sys.executable, "-m", "tests.simlab.pypi", "--bind", f"{MGMT_PREFIX}.1",
         "--port", str(PYPI_PORT)],
        cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    (STATE / "pypi.pid").write_text(str(index.pid))
    until(
        lambda: "index at" in (STATE / "pypi.log").read_text(), 1800,
        "the lab's package index did not start", every=0.5,
        hopeless=lambda: None if index.poll() is None else (STATE / "pypi.log").read_text(),
    )  # fmt: skip


def stop_pypi() -> None:
    pid_file = STATE / "pypi.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        pid_file.unlink()


def stop_hub() -> None:
    pid_file = STATE / "hub.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        pid_file.unlink()


def wire_host(host: Host) -> None:
    """Its namespace and management link (the host end is named as a Spark's: enP7s7)."""
    run("ip", "netns", "add", host.netns)
    in_ns(host.netns, "ip", "link", "set", "lo", "up")
    outside = f"{PREFIX}m{host.index}"
    run("ip", "link", "add", outside, "type", "veth", "peer", "name", "enP7s7",
        "netns", host.netns)  # fmt: skip
    run("ip", "link", "set", outside, "master", MGMT_BRIDGE, "up")


def power_cycle_nics(host: Host) -> None:
    """What a reboot does to the NICs: no addresses, default MTU, down; links the old system
    made (docker's bridge and veths) and its firewall rules are gone."""
    keep = {"lo", "enP7s7", *(twin for twin, _hca in FABRIC_TWINS + PORT0_TWINS)}
    links = in_ns(host.netns, "ip", "-o", "link", "show", capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name not in keep:
            in_ns(host.netns, "ip", "link", "del", name, check=False, stderr=subprocess.DEVNULL)
        elif name != "lo":
            in_ns(host.netns, "ip", "addr", "flush", "dev", name)
            in_ns(host.netns, "ip", "link", "set", name, "down", "mtu", "1500")
    in_ns(host.netns, "nft", "flush", "ruleset", check=False)


def _cable(a: Host, a_twin: str, b: Host, b_twin: str) -> None:
    """One DAC between two twins: a veth pair, an end in each host's namespace."""
    run("ip", "link", "add", "sltmp", "netns", a.netns, "type", "veth",
        "peer", "name", "sltmp", "netns", b.netns)  # fmt: skip
    in_ns(a.netns, "ip", "link", "set", "sltmp", "name", a_twin)
    in_ns(b.netns, "ip", "link", "set", "sltmp", "name", b_twin)


def switch_segments(lab: Lab) -> list[tuple[str, str]]:
    """(bridge, twin) of each L2 segment of the switch: one per twin of each cabled port, as
    the planner gives each its own subnet (spark/topology.py links: a switch's port p is one
    "cable", each of its twins one /24)."""
    return [
        (f"fabric{port}{n}", twin)
        for port in lab.ports
        for n, (twin, _hca) in enumerate(PORT_TWINS[port])
    ]


def wire_fabric(lab: Lab) -> None:
    """Cable the hosts as lab.cabling says: a DAC per twin end to end (a pair on one port or
    both; a ring, port 0 of each host to port 1 of the next), or each twin of each cabled port
    into a switch (bridge) port, one bridge per twin (switch_segments)."""
    hosts = lab.hosts
    if lab.cabling == "ring3":
        for host, after in zip(hosts, hosts[1:] + hosts[:1], strict=True):
            for (port0, _), (port1, _) in zip(PORT0_TWINS, FABRIC_TWINS, strict=True):
                _cable(host, port0, after, port1)
    elif lab.cabling != "switch":
        a, b = hosts
        for twin, _hca in lab.twins(a):
            _cable(a, twin, b, twin)
    else:
        run("ip", "netns", "add", SWITCH_NS)
        for bridge, twin in switch_segments(lab):
            in_ns(SWITCH_NS, "ip", "link", "add", bridge, "mtu", "9000", "type", "bridge")
            in_ns(SWITCH_NS, "ip", "link", "set", bridge, "up")
            for host in hosts:
                port = f"{bridge}h{host.index}"  # the switch's port of the host's twin
                run("ip", "link", "add", "sltmp", "netns", host.netns, "type", "veth",
                    "peer", "name", port, "netns", SWITCH_NS)  # fmt: skip
                in_ns(host.netns, "ip", "link", "set", "sltmp", "name", twin)
                in_ns(SWITCH_NS, "ip", "link", "set", port, "mtu", "9000", "master", bridge, "up")


def unplug_port(lab: Lab, host: Host, port: int) -> list[Host]:
    """Pull the cable out of a host's port: its twins are gone from the host, and from the host
    at the cable's other end (a switch's port goes with it); the hosts whose twins went, each
    with the port in `unplugged`. Their hardware files follow; their RDMA devices go at their
    next boot, as a Spark shows no ConnectX functions for a port with no cable
    (dgx-spark-playbooks connect-three-sparks, ibdev2netdev)."""
    for twin, _hca in PORT_TWINS[port]:
        in_ns(host.netns, "ip", "link", "del", twin, check=False, stderr=subprocess.DEVNULL)
    if port not in host.unplugged:
        host.unplugged.append(port)
    ends = [host]
    for other in lab.hosts:
        for other_port in lab.ports:
            gone = not any(_link_exists(twin, other.netns) for twin, _ in PORT_TWINS[other_port])
            if gone and other_port not in other.unplugged:
                other.unplugged.append(other_port)
                ends.append(other)
    for end in ends:
        write_hardware(end, lab)
    return ends


# --- booting and stopping -----------------------------------------------------------------------


def boot(host: Host, base: Path) -> None:
    merged = host.dir / "root"
    options = f"lowerdir={base},upperdir={host.dir / 'upper'},workdir={host.dir / 'work'}"
    run("mount", "-t", "overlay", "overlay", "-o", options, str(merged))
    env = dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1",
               SYSTEMD_NSPAWN_API_VFS_WRITABLE="network")  # fmt: skip
    logfile = open(host.dir / "console.log", "ab")  # noqa: SIM115 - handed to the child
    cgroups = own_cgroups(host)
    for cgroup in cgroups:
        cgroup.mkdir(exist_ok=True)
    process = subprocess.Popen(
        ["sh", "-c", JOIN_CGROUPS, "sh", *map(str, cgroups), "--",
         "systemd-nspawn", "-D", str(merged), "--boot", "--register=no", "--keep-unit",
         f"--network-namespace-path=/run/netns/{host.netns}", "--capability=all",
         "--system-call-filter=@system-service @mount @privileged keyctl bpf",
         f"--machine={host.name}", f"--bind-ro={stand_in_repositories()}:{REPOS_MOUNT}",
         f"--bind={host.dir / 'docker'}:/var/lib/docker",
         f"--bind-ro={host.dir / 'hardware.json'}:{HARDWARE_FILE}"],
        stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT, env=env,
        start_new_session=True,
    )  # fmt: skip
    host.pid = process.pid


# systemd-nspawn --keep-unit makes its container's cgroup tree under the cgroup it starts in:
# hosts started from one cgroup would share one tree, their systemds racing over the same
# units' cgroups (seen: a unit failing with 219/CGROUP as another host's unit of that name
# ended, and the admin locked out by the failed systemd-user-sessions). So each host's nspawn
# starts in a cgroup of its own; the shell execs it there, keeping its pid.
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs"; shift; done; shift; exec "$@"'


def own_cgroups(host: Host) -> list[Path]:
    """The host's own cgroup, below this process's, in each hierarchy systemd uses (cgroup2
    and, on a hybrid machine, v1's name=systemd)."""
    mine = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        if controllers in ("", "name=systemd"):
            mine[controllers] = path
    mounts: dict[str, str] = {}
    for line in Path("/proc/mounts").read_text().splitlines():
        _device, mountpoint, fstype, options, *_ = line.split()
        if fstype == "cgroup2":
            mounts.setdefault("", mountpoint)
        elif fstype == "cgroup" and "name=systemd" in options.split(","):
            mounts.setdefault("name=systemd", mountpoint)
    return [
        Path(mounts[kind] + path) / f"{PREFIX}-{host.name}"
        for kind, path in mine.items()
        if kind in mounts
    ]


def remove_cgroups(host: Host) -> None:
    """The host's cgroups, once its processes are gone (a cgroup goes with rmdir, leaves first)."""
    for top in own_cgroups(host):
        if top.is_dir():
            below = [path for path in top.rglob("*") if path.is_dir()]
            for cgroup in [*sorted(below, key=lambda path: -len(path.parts)), top]:
                with contextlib.suppress(OSError):
                    cgroup.rmdir()


def _alive(pid: int) -> bool:
    """Running, not gone nor a zombie waiting for this process to reap it (proc(5): stat's 3rd
    field is the state)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def console(host: Host) -> str:
    """The end of the host's console: what a boot that went wrong last said."""
    return (host.dir / "console.log").read_text(errors="replace")[-2000:]


def boot_wait(host: Host, answer: Callable[[], object], what: str, deadline: float) -> None:
    """Ask ``answer`` until it is true, up to ``deadline``; fails at once where the host's
    container has exited, and at the deadline, with its console's end either way."""

    def exited() -> str | None:
        return "its container exited" if host.pid and not _alive(host.pid) else None

    try:
        until(answer, BOOT_TIMEOUT, f"{host.name}: {what}", deadline=deadline, every=0.5,
              hopeless=exited)  # fmt: skip
    except (TimeoutError, RuntimeError) as error:
        raise RuntimeError(f"{error}; console:\n{console(host)}") from None


# What systemd says of the boot, then the jobs it still waits for: the console's end rarely
# names what a boot that never finishes is stuck on.
BOOT_STATE = "systemctl is-system-running --wait; systemctl list-jobs --no-pager | head -20"


# What `systemctl is-system-running` says once the boot's jobs are done (degraded: some failed).
BOOTED = ("running", "degraded")


# What it says while the boot still has jobs to do (`systemctl is-system-running`, no --wait).
STARTING = "starting"


def wait_ready(host: Host, deadline: float, finished: bool = True) -> None:
    """Until sshd answers for the admin and systemd has finished starting up (or, not
    `finished`, is still starting: a boot held up by a unit that may take hours), asked again
    until the deadline: on a loaded machine one answer may not come. A boot that finished
    without letting the admin in by then says so, with what systemd says inside."""
    command = BOOT_STATE if finished else "systemctl is-system-running"
    accepted = BOOTED if finished else (*BOOTED, STARTING)

    def booted() -> bool:
        answer = ssh(host, command, check=False, timeout=60)
        return answer.split("\n", 1)[0] in accepted

    try:
        boot_wait(host, booted, "did not come up", deadline)
    except RuntimeError:
        if inside(host, "systemctl is-system-running").strip() in BOOTED:
            raise RuntimeError(
                f"{host.name}: booted, but the admin's ssh fails:\n{inside(host, FAILED_UNITS)}"
            ) from None
        raise


# The failed units of a boot and their own words.
FAILED_UNITS = (
    "systemctl --failed --no-pager; for unit in $(systemctl --failed --plain --no-legend"
    " | cut -d' ' -f1); do journalctl -b --no-pager -n 20 -u $unit; done"
)


def inside(host: Host, command: str) -> str:
    """A command's output, run by root in the host's namespaces without ssh (what a boot that
    locked the admin out can still be asked)."""
    inits = _children(host.pid) if host.pid else []
    if not inits:
        return ""
    result = subprocess.run(
        ["nsenter", "-t", str(inits[0]), "-a", "sh", "-c", command],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30,
    )  # fmt: skip
    return result.stdout + result.stderr


def wait_for_sshd(host: Host, deadline: float) -> None:
    """Until the host's sshd accepts connections (its key may not be trusted yet)."""

    def greets() -> bool:
        with socket.create_connection((host.mgmt_ip, 22), timeout=10) as conn:
            conn.settimeout(10)
            return conn.recv(4).startswith(b"SSH-")

    boot_wait(host, greets, "sshd did not answer", deadline)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def stop(host: Host) -> None:
    """Pull the plug: SIGKILL the container's init, so every process of the host ends at once."""
    if host.pid and Path(f"/proc/{host.pid}").exists():
        for child in _children(host.pid):
            os.kill(child, signal.SIGKILL)
        for _ in range(100):
            if not Path(f"/proc/{host.pid}").exists():
                break
            try:
                if os.waitpid(host.pid, os.WNOHANG) != (0, 0):
                    break
            except ChildProcessError:
                pass
            time.sleep(0.1)
        else:
            os.kill(host.pid, signal.SIGKILL)
    host.pid = None
    remove_cgroups(host)
    merged = host.dir / "root"
    if os.path.ismount(merged):
        run("umount", "-R", str(merged))


def pull_image(host: Host, image: str | None = None) -> str:
    """`docker pull` of a stand-in serving image (NGC's default vLLM one unless `image` names
    another the lab's registry serves) on the host, outside a deploy: for what needs an image on
    a box without deploying it (the lab's own tests of the images; the bench, which times its
    converges without the pull); the image."""
    from tests.simlab.serving import SERVING_IMAGE_TAG

    image = image or SERVING_IMAGE_TAG
    ssh(host, f"sudo docker pull --quiet {shlex.quote(image)} >/dev/null", timeout=600)
    return image


def set_hardware(host: Host, **hardware: object) -> None:
    """Change what a running host's RDMA, link and kernel stand-ins show (Host's hardware
    fields: the IPv4 RoCE v2 GID entry's index, devices with none, twins' link rates, the
    kernel release), as some units show them in the field; kept until changed again, a reimage
    included."""
    lab = Lab.load()
    for name, value in hardware.items():
        setattr(host, name, value)
        setattr(lab.host(host.name), name, value)
    lab.save()
    write_hardware(host, lab)
    ssh(host, "sudo systemctl restart simlab-rdma")


def unplug(name: str, port: int) -> list[Host]:
    """Pull the cable out of a host's port (unplug_port) and reboot the hosts it was in, which
    come back without that port's twins and RDMA devices; those hosts."""
    lab = Lab.load()
    ends = unplug_port(lab, lab.host(name), port)
    lab.save()
    return [reboot(end.name) for end in ends]


# --- the commands --------------------------------------------------------------------------------


def up(
    count: int = 2,
    gid_index: dict[str, int] | None = None,
    cabling: str | None = None,
    switch_ports: tuple[int, ...] | None = None,
) -> Lab:
    """Boot `count` bare hosts (tearing down any lab that is already up), cabled as `cabling`
    says (CABLINGS; a pair for two hosts, a switch for more), a switch on `switch_ports`
    (SWITCH_PORTS; port 1 unless given)."""
    cabling = cabling or ("pair" if count == 2 else "switch")
    ports, fewest, most = CABLINGS.get(cabling, ((), 0, 0))
    if not fewest <= count <= most:
        shapes = ", ".join(f"{name} {low}-{high}" for name, (_, low, high) in CABLINGS.items())
        raise SystemExit(f"cabling {cabling!r} with {count} hosts: the cablings take {shapes}")
    switch_ports = None if switch_ports is None else tuple(switch_ports)
    if switch_ports is not None and (ports is not None or switch_ports not in SWITCH_PORTS):
        takes = " or ".join(map(str, map(list, SWITCH_PORTS)))
        raise SystemExit(
            f"switch ports {list(switch_ports)} with cabling {cabling!r}: only a switch takes"
            f" ports, {takes}"
        )
    ensure_host_tools()
    down()
    stand_in_repositories()
    base = spark_base()
    gid_index = gid_index or {}
    lab = Lab(
        [Host(f"spark-{i}", i, gid_index.get(f"spark-{i}", 3)) for i in range(1, count + 1)],
        cabling,
        switch_ports or (1,),
    )
    ensure_client_key()
    ensure_mgmt_bridge()
    registry.start(REGISTRY_ADDRESS)
    start_hub()
    start_pypi()
    for host in lab.hosts:
        prepare_disk(host, lab, base)
        wire_host(host)
    wire_fabric(lab)
    log(f"booting {count} hosts")
    for host in lab.hosts:
        boot(host, base)
    lab.save()
    deadline = time.monotonic() + BOOT_TIMEOUT
    for host in lab.hosts:
        wait_ready(host, deadline)
        log(f"{host.name} is up at {host.mgmt_ip}")
    return lab


def reimage(name: str) -> Host:
    """Back to the bare image with new SSH host keys; the lab's known_hosts keeps the old key,
    as an admin's would."""
    lab = Lab.load()
    host = lab.host(name)
    known = (STATE / "known_hosts").read_text()
    stop(host)
    power_cycle_nics(host)
    base = spark_base()
    prepare_disk(host, lab, base)
    boot(host, base)
    lab.save()
    (STATE / "known_hosts").write_text(known)
    wait_for_sshd(host, time.monotonic() + BOOT_TIMEOUT)
    return host


def reboot(name: str, finished: bool = True) -> Host:
    """The host's own `systemctl reboot`, and the lab bringing it back as its power would:
    systemd-nspawn exits once the host's systemd has shut down (a reboot ends a --boot
    container), and the lab boots the same disk again, its NICs reset as a power cycle does.
    Not `finished`: back once the admin gets in, its boot perhaps still starting (wait_ready)."""
    lab = Lab.load()
    host = lab.host(name)
    ssh(host, "sudo systemctl reboot", check=False)  # the connection may drop before it answers
    until(lambda: not (host.pid and _alive(host.pid)), BOOT_TIMEOUT,
          f"{name}: still running after `systemctl reboot`", every=0.5)  # fmt: skip
    stop(host)  # reaps the container and unmounts its disk
    power_cycle_nics(host)
    boot(host, spark_base())
    lab.save()
    wait_ready(host, time.monotonic() + BOOT_TIMEOUT, finished)
    return host


def down() -> None:
    """Remove every process, mount, namespace and link the lab made (also after a crash)."""
    lab = Lab.load()
    stop_hub()
    stop_pypi()
    for host in lab.hosts:
        stop(host)
    registry.remove()
    # Leftovers of a lab whose state file was lost: our namespaces and mounts, by name.
    for line in run("ip", "netns", "list", capture_output=True, text=True).stdout.splitlines():
        netns = line.split()[0]
        if netns.startswith(f"{PREFIX}-"):
            pids = run("ip", "netns", "pids", netns, capture_output=True, text=True, check=False)
            for pid in pids.stdout.split():
                os.kill(int(pid), signal.SIGKILL)
            run("ip", "netns", "del", netns)
    for root in sorted((STATE / "hosts").glob("*/root")) if (STATE / "hosts").exists() else []:
        if os.path.ismount(root):
            run("umount", "-R", str(root))
    for link in run("ip", "-o", "link", "show", capture_output=True, text=True).stdout.splitlines():
        name = link.split(":")[1].strip().split("@")[0]
        if name.startswith(f"{PREFIX}m") or name == MGMT_BRIDGE:
            run("ip", "link", "del", name, check=False, stderr=subprocess.DEVNULL)
    if (STATE / "lab.json").exists():
        (STATE / "lab.json").unlink()

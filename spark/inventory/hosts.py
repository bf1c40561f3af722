"""One box's validated configuration (HostConfig), grouped by concern, from its checked keys;
and the error that lists every problem that kept the inventory from it."""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Interface
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from spark import fleet, topology
from spark.lane import Lane

if TYPE_CHECKING:
    from spark.inventory.settings import HostSettings


class ConfigError(Exception):
    """Every problem found in the host data, one per line: "<host>: <key>: <what>; <do>"."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"the inventory data has {len(problems)} problem(s); fix them in the inventory"
            " or in group_data/all.py:\n" + "\n".join(problems)
        )


class Frozen(BaseModel):
    """A part of a host's validated configuration: set once, never changed."""

    model_config = ConfigDict(frozen=True)


class FabricLink(Frozen):
    """One fabric interface ("twin") of a host and its RDMA device."""

    ifname: str
    hca: str
    address: IPv4Interface

    @property
    def port(self) -> int | None:
        """The QSFP port the twin belongs to (None for an interface of another name)."""
        return next((p for p, twins in topology.PORT_TWINS.items() if self.ifname in twins), None)


class Driver(Frozen):
    branch: int
    package: str
    version: str | None  # None: the build apt installs first, kept


class Toolkit(Frozen):
    version: str
    repo_url: str
    key_url: str


class NcclTest(Frozen):
    """The NCCL test of a cluster (operations/nccl.py); None on a lone box or when turned off."""

    min_busbw_gbs: float  # the pass mark: all_gather bus bandwidth at the largest size
    max_bytes: int


class Ray(Frozen):
    """The Ray cluster the boxes form over the fabric (operations/ray.py)."""

    port: int
    image: str
    auth: bool


class HostConfig(Frozen):
    """One host's validated configuration, grouped by concern."""

    name: str
    role: Literal["head", "worker"]
    address: str  # where pyinfra and the clients reach the box
    ssh_port: int
    fabric: tuple[FabricLink, ...]  # in the order given: the first carries the sockets
    topology: str
    switch_ports: tuple[int, ...]
    link_speed_mbps: int
    link_speed_low: Literal["refuse", "warn"]
    management_ifname: str
    management_address: IPv4Address | None
    mtu: int
    gid_index: int
    kernel_kho_off: bool
    take_over_netplan: bool
    kernel_hold: bool
    driver: Driver
    gpu_clock_lock_mhz: tuple[int, int] | None  # (min, max); None: no lock
    toolkit: Toolkit
    env_file: str
    nccl_debug: bool
    nccl_test: NcclTest | None
    ray: Ray
    unified_memory_gib: float
    lanes: tuple[Lane, ...]  # in start order, each after the one before
    memory_guard_min_available_gib: float
    lane_start_timeout_min: int
    hf_token_file: str | None  # on this machine
    fetch_weights: bool
    hf_endpoint: str  # huggingface_hub's HF_ENDPOINT, without a trailing slash
    fleet_copy_weights: bool
    prune_unused: bool
    front_allow_networks: tuple[str, ...]
    front_tls: tuple[str, str] | None  # certificate and key files on this machine
    front_tls_ca: str | None  # the authority that signed the certificate, on this machine
    metrics: bool
    metrics_port: int
    metrics_interval_s: int
    metrics_allow_networks: tuple[str, ...]
    router: fleet.RouterKeys  # the same on every box (fleet.key_problems)

    @classmethod
    def from_settings(
        cls,
        name: str,
        role: Literal["head", "worker"],
        data: HostSettings,
        reached: tuple[str, int] = ("", 22),
    ) -> HostConfig:
        return cls(
            name=name,
            role=role,
            address=reached[0] or name,
            ssh_port=reached[1],
            fabric=tuple(
                FabricLink(ifname=ifname, hca=data.fabric_hcas[ifname], address=address)
                for ifname, address in data.fabric_addresses.items()
            ),
            topology=data.fabric_topology,
            switch_ports=tuple(data.fabric_switch_ports),
            link_speed_mbps=data.fabric_link_speed_mbps,
            link_speed_low=data.fabric_link_speed_low,
            management_ifname=data.management_ifname,
            management_address=(
                IPv4Address(data.management_address) if data.management_address else None
            ),
            mtu=data.fabric_mtu,
            gid_index=data.roce_gid_index,
            kernel_kho_off=data.fabric_kernel_kho_off,
            take_over_netplan=data.fabric_take_over_netplan,
            kernel_hold=data.kernel_hold,
            driver=Driver(
                branch=data.driver_branch,
                package=data.driver_package,
                version=data.driver_version,
            ),
            gpu_clock_lock_mhz=data.gpu_clock_lock_mhz,
            toolkit=Toolkit(
                version=data.toolkit_version,
                repo_url=data.toolkit_repo_url,
                key_url=data.toolkit_repo_key_url,
            ),
            env_file=data.env_file,
            nccl_debug=data.nccl_debug,
            nccl_test=NcclTest(
                min_busbw_gbs=data.nccl_test_min_busbw_gbs
                or topology.SHAPES[data.fabric_topology].nccl_pass_mark_gbs,
                max_bytes=data.nccl_test_max_bytes,
            )
            if data.nccl_test
            else None,
            ray=Ray(port=data.ray_port, image=data.ray_image, auth=data.ray_auth),
            unified_memory_gib=data.unified_memory_gib,
            # Without a priority, later lanes are stopped first by the memory guard.
            lanes=tuple(
                lane
                if lane.priority is not None
                else lane.model_copy(update={"priority": len(data.lanes) - index})
                for index, lane in enumerate(data.lanes)
            ),
            memory_guard_min_available_gib=data.memory_guard_min_available_gib,
            lane_start_timeout_min=data.lane_start_timeout_min,
            hf_token_file=data.hf_token_file and str(Path(data.hf_token_file).expanduser()),
            fetch_weights=data.fetch_weights,
            hf_endpoint=str(data.hf_endpoint).rstrip("/"),
            fleet_copy_weights=data.fleet_copy_weights,
            prune_unused=data.prune_unused,
            front_allow_networks=tuple(str(network) for network in data.front_allow_networks),
            front_tls=(
                (
                    str(Path(data.front_tls_certificate_file).expanduser()),
                    str(Path(data.front_tls_key_file).expanduser()),
                )
                if data.front_tls_certificate_file and data.front_tls_key_file
                else None
            ),
            front_tls_ca=data.front_tls_ca_file and str(Path(data.front_tls_ca_file).expanduser()),
            metrics=data.metrics,
            metrics_port=data.metrics_port,
            metrics_interval_s=data.metrics_interval_s,
            metrics_allow_networks=tuple(str(network) for network in data.metrics_allow_networks),
            router=fleet.RouterKeys.of(data),
        )

    def cluster_environment(self, head: HostConfig) -> dict[str, str]:
        """The environment NCCL, Gloo, UCX, Ray and vLLM on this host need.

        NCCL gets the RDMA device of every twin the topology uses: one left out halves the
        bandwidth silently (dgx-spark-playbooks#102). Sockets (bootstrap, Gloo, TensorPipe,
        Open MPI TCP) go over the first twin, except on a ring, where no fabric subnet reaches
        every box: there they use the management interface, as eugr/spark-vllm-docker
        docs/NETWORKING.md ("For 3-node mesh we have to use 10G interface for OOB
        communication") and NVIDIA's spark_cluster_setup.py (run_nccl_test: enP7s7) do.
        UCX_NET_DEVICES takes "<device>:<port>" for RDMA devices and an interface name for
        TCP (UCX FAQ); NVIDIA's playbook gives only the interface name, which leaves UCX on
        TCP, so we list the twins' RoCE ports (port 1) and the socket interface for TCP.

        MASTER_ADDR (torch's env:// rendezvous, its TCPStore on the head) and VLLM_HOST_IP (the
        address vLLM tells the other ranks to reach this box at: vLLM docs, environment
        variables) must be reached by every box: the first twin elsewhere, the management
        address on a ring, where a twin reaches one neighbour only. NVIDIA's
        spark_cluster_setup.py run_nccl_test does the same on rings: mpirun starts the ranks at
        each node's ip_address of its spark_config.json (the management address it also SSHes
        to), NCCL's sockets on enP7s7.
        """
        environment = {"RAY_memory_monitor_refresh_ms": "0"}  # Ray misreads the page cache
        if self.fabric:
            first = self.fabric[0]
            hcas = [link.hca for link in self.fabric]
            sockets = self.management_ifname if self.shape.neighbours_only else first.ifname
            environment |= {
                # No NCCL_IB_GID_INDEX: NCCL takes each device's RoCE v2 entry of an IPv4
                # address wherever it is (NVIDIA/nccl net_ib/connect.cc, ncclIbGetGidIndex;
                # NCCL 2.21 and later, the NGC images carry 2.29: CUDA DL release notes 26.03),
                # where a fixed index failed on a box whose entry was at 4 (roce.py says more).
                "NCCL_IB_ADDR_FAMILY": "AF_INET",
                "NCCL_IB_ROCE_VERSION_NUM": "2",
                "NCCL_IB_HCA": ",".join(hcas),
                "NCCL_SOCKET_IFNAME": sockets,
                "GLOO_SOCKET_IFNAME": sockets,
                "TP_SOCKET_IFNAME": sockets,
                "OMPI_MCA_btl_tcp_if_include": sockets,
                "UCX_NET_DEVICES": ",".join([f"{hca}:1" for hca in hcas] + [sockets]),
                "VLLM_HOST_IP": str(self.reached_at),
                "MASTER_ADDR": str(head.reached_at),
            } | {key: value for key, (value, _) in self.shape.nccl_variables.items()}
        if self.nccl_debug:
            environment["NCCL_DEBUG"] = "INFO"  # shows NET/IB vs a silent NET/Socket fallback
        return environment

    @property
    def shape(self) -> topology.Shape:
        """The fabric shape's record (spark/topology.py)."""
        return topology.SHAPES[self.topology]

    @property
    def reached_at(self) -> IPv4Address:
        """The address every other box of the cluster reaches this one at: its first twin, or
        on a ring its management address (fabric.cabled_problems makes sure a ring's boxes
        have one)."""
        if self.shape.neighbours_only and self.management_address is not None:
            return self.management_address
        return self.fabric[0].address.ip

    def environment_notes(self) -> dict[str, str]:
        """Where each fabric setting of cluster_environment comes from, one line each."""
        if not self.fabric:
            return {}
        notes = FABRIC_NOTES | {
            key: source for key, (_, source) in self.shape.nccl_variables.items()
        }
        if self.shape.neighbours_only:
            notes["NCCL_SOCKET_IFNAME"] = RING_SOCKETS
            notes["MASTER_ADDR"] = RING_RENDEZVOUS
        return notes


# Sources of the variables every topology gets, for the environment file.
FABRIC_NOTES = {
    "NCCL_IB_HCA": "every twin in use: one left out halves the bandwidth silently"
    " (dgx-spark-playbooks#102, PR#103; eugr NETWORKING.md)",
    "NCCL_IB_ADDR_FAMILY": "NCCL picks each device's RoCE v2 IPv4 GID entry itself, wherever"
    " it is (NVIDIA/nccl ncclIbGetGidIndex, NCCL 2.21+)",
    "NCCL_IB_ROCE_VERSION_NUM": "with NCCL_IB_ADDR_FAMILY (NVIDIA/nccl ncclIbGetGidIndex)",
}
RING_SOCKETS = (
    "no fabric subnet reaches every box of a ring: sockets on the management port (eugr"
    " NETWORKING.md, 3-node mesh; spark_cluster_setup.py run_nccl_test)"
)
RING_RENDEZVOUS = (
    "the head's management address: its twins reach one neighbour each (spark_cluster_setup.py"
    " run_nccl_test launches a ring's ranks at the nodes' management addresses)"
)


def names(hosts: Iterable[HostConfig]) -> str:
    """The boxes' names, each once, as a message lists them."""
    return ", ".join(dict.fromkeys(host.name for host in hosts))

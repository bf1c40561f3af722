"""Every port a box's services hold: Ray's, the distributed back-end's, the kernel's
ephemeral range, SSH's; what no lane may take, each range with its owner."""

DASHBOARD_PORT = 8265  # bound to 127.0.0.1 only: its job API runs code (CVE-2023-48022)
CLIENT_PORT = 10001
# Out of Ray's default 10002-19999, which holds the lanes' API ports (10101, 10102: seed 003).
WORKER_PORTS = (20000, 20999)
# Ray's own ports after the GCS port, in this order, each one above the one before.
PORT_OPTIONS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-grpc-port",
    "--dashboard-agent-listen-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)

# Two rendezvous ports, both right, for two programs (a box may hold both at once: the NCCL
# test runs again while the cluster lane serves):
# vLLM's own multi-node mode (a cluster lane on executor mp): the head's --master-port, where
# every rank joins its torch.distributed group; vLLM's default (vllm/config/parallel.py
# ParallelConfig.master_port), and the one eugr/spark-vllm-docker's launch-cluster.sh passes.
MASTER_PORT = 29501
# The NCCL test's (files/nccl_check.py, env:// rendezvous): the MASTER_PORT its ranks are given,
# rank 0's TCPStore; torch.distributed's usual one (torchrun's --master-port default,
# torch/distributed/run.py), and the TCPStore and data-parallel master port vLLM's security
# page lists.
TORCH_STORE_PORT = 29500
# The distributed back-end's fixed ports (vLLM docs, usage/security.md): torch's TCPStore and
# the data-parallel master at TORCH_STORE_PORT, KV cache transfer at 14579, and the multi-node
# master port above. NCCL, Gloo and vLLM's other sockets take ports from the kernel's ephemeral
# range, which the rules add.
BACKEND_PORTS = [(14579, 14579), (TORCH_STORE_PORT, TORCH_STORE_PORT), (MASTER_PORT, MASTER_PORT)]


def listen_ports(port: int) -> list[tuple[int, int]]:
    """Every port (as ranges) Ray listens on with `port` as its GCS port."""
    return [
        (port, port + len(PORT_OPTIONS)),
        (DASHBOARD_PORT, DASHBOARD_PORT),
        (CLIENT_PORT, CLIENT_PORT),
        WORKER_PORTS,
    ]


# Linux's default net.ipv4.ip_local_port_range (the kernel's ip-sysctl documentation): the
# ports outgoing connections are given, which NCCL, Gloo and vLLM also listen on and the cluster
# firewall closes to all but the fabric (firewall.py; a box with another range is checked there).
EPHEMERAL_PORTS = (32768, 60999)


def port_owners(ray_port: int, ssh_port: int = 22) -> list[tuple[int, int, str]]:
    """The port ranges of a box that no lane may take, each with its owner: Ray's (with
    ``ray_port`` as its GCS port), the distributed back-end's fixed ports and the ephemeral
    range (both closed to all but the fabric in a cluster), and SSH's."""
    ranges = listen_ports(ray_port)
    ray_owner = "Ray's (" + ", ".join(f"{a}-{b}" if a < b else str(a) for a, b in ranges) + ")"
    low, high = EPHEMERAL_PORTS
    return [
        *((low, high, ray_owner) for low, high in ranges),
        *(
            (
                low,
                high,
                f"the distributed back-end's (torch's TCPStore {TORCH_STORE_PORT}, vLLM's 14579"
                f" and its multi-node master port {MASTER_PORT})",
            )
            for low, high in BACKEND_PORTS
        ),
        (
            low,
            high,
            f"in the kernel's ephemeral range ({low}-{high}), which outgoing connections take and"
            " a cluster's firewall closes to all but the fabric",
        ),
        (ssh_port, ssh_port, "SSH's (ssh_port)"),
    ]


def metrics_exporter_port(metrics_port: int) -> int:
    """Where the node exporter listens on 127.0.0.1: the port after the one nginx serves."""
    return metrics_port + 1


# A lane on demand (on_demand_idle_s): systemd's socket holds its loopback_port, where the front
# forwards, and systemd-socket-proxyd passes each connection on to the server, which listens this
# far above it (docs/on-demand.md). The front, the socket and the server: three listeners, one each.
ON_DEMAND_SERVER_OFFSET = 1000


def on_demand_server_port(loopback_port: int) -> int:
    """Where an on-demand lane's server listens on 127.0.0.1: above its loopback_port, which its
    socket holds (loopback_port defaults to port + 1000, so this to port + 2000)."""
    return loopback_port + ON_DEMAND_SERVER_OFFSET

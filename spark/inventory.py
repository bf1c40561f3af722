"""Validate the inventory's host data before any host is contacted."""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from collections.abc import Iterable
from ipaddress import (
    AddressValueError,
    IPv4Address,
    IPv4Interface,
    IPv4Network,
    NetmaskValueError,
)
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    HttpUrl,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from spark import fleet, memory, topology
from spark.catalog import ModelSpec
from spark.checks import LINE_BREAK, matching, refused
from spark.lane import (
    SLUG,
    Lane,
    clash_problems,
    context_warnings,
    image_with_ray,
    listeners,
)
from spark.memory import box_budget
from spark.options import option
from spark.ports import metrics_exporter_port, port_owners
from spark.topology import FABRIC_MTU
from spark.vllm_release import nccl_deadlock_warning

# host.data keys that pyinfra and its connectors read themselves: they pass unchecked and
# are never echoed (`_sudo_password`, `ssh_password` are secrets).
PYINFRA_KEY_PREFIXES = ("ssh_", "_", "docker_", "local_", "winrm_", "chroot_")
# What `--data` gives teardown.py for one run (stages/teardown.py options): no box's setting,
# so a box's checks pass them by, and the teardown checks their values.
TEARDOWN_KEYS = frozenset(
    {"teardown_confirm", "teardown_driver", "teardown_fabric", "teardown_weights"}
)
# Of those, the ones this collection connects with (pyinfra's SSH connector, its global
# arguments such as `_sudo`): a misspelt one (`ssh_usr`) would be ignored by pyinfra, which then
# logs in as someone else, so each must be a key pyinfra knows.
CHECKED_PYINFRA_PREFIXES = ("ssh_", "_")

IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # the kernel's IFNAMSIZ less the NUL
HCA = re.compile(r"[A-Za-z0-9_.-]{1,63}")  # the kernel's IB_DEVICE_NAME_MAX less the NUL
DRIVER_PACKAGE = re.compile(r"nvidia-driver-(\d+)(-open)?")
DEBIAN_VERSION = re.compile(r"(\d+:)?\d[A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]+)*")
ABSOLUTE_PATH = re.compile(r"(/[A-Za-z0-9_.-]+)+")
SUPPORTED_BRANCH = 580
# The highest graphics clock a GB10 reports (nvidia-smi's clocks.max.gr, 3003 MHz on driver
# 580.178.04, its applications clock 2418; boosting it reaches ~2400 under load: public GB10
# write-ups). A lock's maximum above it locks nothing.
GB10_MAX_GRAPHICS_MHZ = 3003
# Its message sizes: 1 MiB (files/nccl_check.py's first) to 16 GiB (NVIDIA's -b 16G -e 16G);
# a mark above two twins' line rate (2 x 200 Gb/s = 50 GB/s) cannot be reached.
NCCL_TEST_MIN_BYTES, NCCL_TEST_MAX_BYTES = 1 << 20, 16 << 30
NCCL_TEST_MAX_GBS = 50
# Keys whose value may be a secret: no message ever shows their value (a key pasted as api_key,
# a token pasted into hf_token_file). Keys of pyinfra's own are never shown either.
SECRET_KEYS = frozenset({"api_key", "hf_token_file", "front_tls_key_file"})
# A Spark has 128 GB of LPDDR5X in all, shared by CPU and GPU (seed 003); CUDA reports 121.69
# GiB of it. No value of unified_memory_gib or of the guard's floor can be above that.
SPARK_MEMORY_GIB = 128
PEM_PRIVATE_KEY = re.compile(r"-----BEGIN (RSA |EC )?PRIVATE KEY-----")
SPARK_TWINS = frozenset(ifname for twins in topology.PORT_TWINS.values() for ifname in twins)


class ConfigError(Exception):
    """Every problem found in the host data, one per line: "<host>: <key>: <what>; <do>"."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"the inventory data has {len(problems)} problem(s); fix them in the inventory"
            " or in group_data/all.py:\n" + "\n".join(problems)
        )


class HostSettings(BaseModel):
    """What one host's data may hold (inventory host data over group_data/all.py).

    Field names are the data keys, so every message names the key the user edits; a
    description says what is allowed and ends the messages pydantic itself writes.
    Each key is declared once, with spark.options.option: its allowed values, scope and why;
    its default lives in group_data/all.py (but for the per-host keys), and docs/variables.md
    is generated from both.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    spark_role: Literal["head", "worker"] | None = option(
        "'head' on exactly one host, 'worker' on the others"
        " (a lone host may leave it out: it is the head)",
        why="A cluster's head serves its cluster lanes, runs Ray's GCS and rank 0 of the NCCL"
        " test; the workers join it (docs/reference.md, A cluster, step by step).",
        scope="host",
        default=None,
    )
    fabric_addresses: dict[str, str] = option(
        '{ifname: "A.B.C.D/prefix"}, one subnet per twin interface,'
        ' e.g. {"enp1s0f1np1": "192.168.100.10/24", "enP2p1s0f1np1": "192.168.101.10/24"}',
        why="Each twin of a cable needs its own subnet (eugr/spark-vllm-docker"
        " docs/NETWORKING.md); left out, each box's are derived from its place in the"
        " inventory, one /24 per twin per cable from 192.168.100.0/24 (spark/topology.py).",
        scope="host",
        default_factory=dict,
    )
    fabric_hcas: dict[str, str] = option(
        '{ifname: RDMA device}, e.g. {"enp1s0f1np1": "rocep1s0f1"};'
        " one distinct device for each fabric interface",
        why="One QSFP DAC shows two ~200 Gb/s twins; NCCL needs every twin in use in"
        " NCCL_IB_HCA or runs at ~3 GB/s (seed 001; dgx-spark-playbooks#102). Port 0 is next to"
        " the RJ-45 port, port 1 further away (dgx-spark-playbooks connect-three-sparks, Step 2;"
        " ibdev2netdev there).",
    )
    fabric_mtu: int = option(
        f"an integer {FABRIC_MTU}..9216, the same on every host ({FABRIC_MTU});"
        " lower only with fabric_mtu_below_9000_because",
        why="Jumbo frames on every fabric interface (seed 001); NVIDIA's own two-Spark guide"
        " leaves 1500, which measured 18.9-21 GB/s of NCCL against 23.74 GB/s at 9000"
        " (dgx-spark-playbooks#25).",
        scope="fleet",
        ge=1500,
        le=9216,
    )
    fabric_mtu_below_9000_because: str | None = option(
        "None, or one line saying why the fabric runs below 9000 (e.g. a switch"
        " without jumbo frames)",
        why="A fabric below 9000 loses NCCL bandwidth (18.9-21 GB/s at 1500 against 23.74 GB/s"
        " at 9000: dgx-spark-playbooks#25), so it is refused unless the owner says why.",
        max_length=200,
    )
    fabric_topology: Literal["pair", "pair-dual", "ring3", "switch", "independent"] = option(
        "'pair' (one cable), 'pair-dual' (two cables, two boxes), 'ring3' (three"
        " boxes, port 0 of each to port 1 of the next), 'switch' (2 to 8 boxes) or"
        " 'independent' (no cluster: each box its own server), the same on every host",
        why="How the QSFP ports are cabled decides the twins used, the subnets and what NCCL is"
        " told: pair is the field's two-box guides, ring3 NVIDIA's connect-three-sparks, switch"
        " NVIDIA's multi-sparks-through-switch (docs/reference.md, Fabric shapes).",
        scope="fleet",
    )
    fabric_switch_ports: list[int] = option(
        "the QSFP ports cabled to the switch, [1], [0] or [1, 0] (switch only)",
        why="A switch may take one port of each box or both; the twins NCCL uses follow.",
        scope="fleet",
        min_length=1,
        max_length=2,
    )
    fabric_link_speed_mbps: int = option(
        "200000, or 100000 for a switch whose ports run at 100 Gb/s",
        why='A Spark\'s ConnectX-7 links each twin at 200 Gb/s (ibstat "Rate: 200":'
        " geerlingguy/sbc-reviews#92). A slower twin is a known fault: a switch port"
        " auto-negotiating 100G (the field forces 200G on MikroTik CRS8xx), a degraded ConnectX"
        " start (dgx-spark-playbooks PR#108), a reseated or damaged cable.",
    )
    fabric_link_speed_low: Literal["refuse", "warn"] = option(
        "'refuse' (stop the box) or 'warn' when a twin links below fabric_link_speed_mbps",
        why="'warn' says so loudly and goes on (a pair behind a 100G switch, say): `make status`"
        " and the alerts then show it as a warning, not red.",
    )
    management_ifname: str = option(
        "the management interface, enP7s7 on a Spark (a ring's sockets use it)",
        why="The 10 GbE RJ-45 port: a ring's sockets (NCCL bootstrap, Gloo) use it, as no fabric"
        " subnet reaches every box (eugr/spark-vllm-docker docs/NETWORKING.md, 3-node mesh;"
        " NVIDIA's spark_cluster_setup.py run_nccl_test).",
    )
    management_address: str | None = option(
        "None, or the box's IPv4 address on management_ifname, A.B.C.D (`ip -4 -br"
        " address show enP7s7`); needed on every box of a ring3, whose rendezvous uses it",
        why="On a ring the head's management address is MASTER_ADDR and each box's is"
        " VLLM_HOST_IP, as NVIDIA's spark_cluster_setup.py does.",
        scope="host",
        default=None,
    )
    roce_gid_index: int = option(
        "an integer 0..255 (where the RoCE v2 + IPv4 entry should be: 3)",
        why="NVIDIA's design puts it at 3 (seed 001). NCCL finds the entry itself wherever it is"
        " (no NCCL_IB_GID_INDEX: it was seen at 4 on one box of two,"
        " GLM-5.3-Flash-EXL3-2x-DGX-Sparks PR#26, and moving after a network re-apply,"
        " sparkring#186); the deploy checks each twin has exactly one and says where when it is"
        " not here.",
        ge=0,
        le=255,
    )
    fabric_kernel_kho_off: bool = option(
        "True (a box of the fabric on a 7.x kernel gets kho=off through GRUB) or"
        " False (such a box is refused with the fix)",
        why="Kernels 7.0 and later, as DGX OS 7.6 ships them (7.0.0-1019-nvidia), turn kexec"
        " handover on at boot, and RDMA memory registration then fails under GPU memory pressure"
        " (`ibv_reg_mr_iova2 failed with error Cannot allocate memory`; 6.17.0-1032 passes): the"
        " fabric's NCCL breaks. The boot option kho=off is the workaround (NVIDIA/NV-Kernels PRs"
        " 590, 591); a reboot is needed after it.",
    )
    fabric_take_over_netplan: bool = option(
        "True (netplan files naming a fabric twin, NVIDIA's 40-cx7.yaml, moved aside"
        " once, a dated copy beside each) or False (such a box is refused, naming the files)",
        why="NVIDIA's two-Spark guide writes /etc/netplan/40-cx7.yaml (dgx-spark-playbooks"
        " connect-two-sparks, Step 3, Option 1); netplan's boot generator makes NetworkManager a"
        " profile of its own from it beside the deploy's (canonical/netplan doc/netplan.md). A"
        " file that configures more than twins, or is no YAML, stays and stops the box.",
    )
    kernel_hold: bool = option(
        "True (the kernel metapackages held, apt pinned to the running kernel's ABI) or False",
        why="Owners ask fleet tools for kernel holds: no upgrade then moves a fleet off a"
        " known-good kernel (DGX OS 7.6 moved boxes to 7.0, see fabric_kernel_kho_off). The"
        " owner moves it: apt-mark unhold, the pin file removed. Off: DGX OS updates the kernel"
        " as it ships.",
    )
    driver_branch: int = option(
        f"the integer {SUPPORTED_BRANCH}",
        why="590.x has a confirmed CUDA-graph deadlock on GB10 (seed 001).",
    )
    driver_package: str = option(
        f"nvidia-driver-{SUPPORTED_BRANCH}-open or nvidia-driver-{SUPPORTED_BRANCH}",
        why="Installed when no 580 driver package is present; DeepOps installs the -open flavour"
        " on DGX OS 7 (NVIDIA/deepops roles/nvidia-dgx/vars/ubuntu-24.04.yml).",
    )
    driver_version: str | None = option(
        "None (the build of the branch apt installs first, kept), or a Debian"
        f" version of branch {SUPPORTED_BRANCH} that `apt-cache madison"
        f" nvidia-driver-{SUPPORTED_BRANCH}-open` lists, e.g. 580.159.03-0ubuntu1",
        why="A held box never moves by itself: an upgrade under a loaded module leaves"
        ' nvidia-smi failing with "Driver/library version mismatch" until a reboot'
        " (oddmario/NVIDIA-Ubuntu-Driver-Guide#4). A newer build of the branch (a security"
        " fix): the deploy moves every driver package there, holds them again and says the box"
        " needs a reboot.",
        default=None,
    )
    gpu_clock_lock_mhz: tuple[int, int] | None = option(
        "(min, max): the MHz `nvidia-smi -lgc min,max` locks the GPU's graphics clock"
        f" to at every boot, integers with 0 <= min <= max <= {GB10_MAX_GRAPHICS_MHZ} (a GB10's"
        " highest), e.g. (300, 2200); None or False: no lock",
        why="A hot GB10 powers OFF (no reboot, no log, standby until AC is cycled) seconds into"
        " a 131k-token prefill at default clocks, boosting to ~2400 MHz: 2 losses in 22 long"
        " onsets on one unit, none in 15 locked; 0 in 66 long-input onsets with the lock on a"
        " loaded 7-unit pod. Cost: 1-3% of decode at one user, none at 32"
        " (capetron/gb10-cluster-bench docs/power-offs-and-clock-lock.md; the same power-offs in"
        " tonyd2wild/dgx-spark-hard-poweroff-fix and NVIDIA forum threads 373251 and 377478,"
        " where a user locks 300,2400; caps of 2100-2400 are reported).",
    )
    toolkit_version: Annotated[
        str,
        matching(
            DEBIAN_VERSION,
            "{!r} is not a Debian version; use one that `apt-cache madison"
            " nvidia-container-toolkit` lists, e.g. 1.19.0-1",
        ),
    ] = option(
        "a Debian version of nvidia-container-toolkit, e.g. 1.19.0-1",
        why="Pinned and held as NVIDIA's install guide pins it, so `apt upgrade` leaves it.",
    )
    toolkit_repo_url: str = option(
        "an https:// or file:/// URL of the apt repository",
        why="NVIDIA's apt repository for the container toolkit (NVIDIA's install guide);"
        " $(ARCH) is left for apt to fill in.",
    )
    toolkit_repo_key_url: str = option(
        "an https:// or file:/// URL of the signing key",
        why="The repository's signing key (NVIDIA's install guide).",
    )
    env_file: str = option(
        "an absolute path, e.g. /etc/spark/cluster.env",
        why="The cluster environment file units and login shells read (no secrets go in it).",
    )
    nccl_debug: bool = option(
        "True or False",
        why="NCCL_DEBUG=INFO shows whether NCCL uses NET/IB or silently fell back to NET/Socket"
        " (vllm PR#42075); off by default because it is verbose.",
    )
    nccl_test: bool = option(
        "True or False (the NCCL test of a cluster)",
        why="all_gather and all_reduce between the boxes, one rank per box in the serving image,"
        " from 1 MiB up to nccl_test_max_bytes (operations/nccl.py): it fails the deploy on a"
        " socket fallback, a twin NCCL does not use, or a bus bandwidth under the mark. It runs"
        " again only when what it depends on changed, or when it last failed.",
        scope="fleet",
    )
    nccl_test_min_busbw_gbs: float | None = option(
        "None (the topology's pass mark: 21.875 GB/s, a ring 10), or the all_gather"
        f" bus bandwidth in GB/s the NCCL test must reach, at most {NCCL_TEST_MAX_GBS:g}",
        why="None takes NVIDIA's MIN_NCCL_TEST_BW for the topology (dgx-spark-playbooks"
        " multi-sparks-through-switch spark_cluster_setup.py); above two twins' line rate"
        " (2 x 200 Gb/s = 50 GB/s) nothing can pass.",
        scope="fleet",
        gt=0,
        le=NCCL_TEST_MAX_GBS,
    )
    nccl_test_max_bytes: int = option(
        f"bytes, {NCCL_TEST_MIN_BYTES} (1 MiB) to {NCCL_TEST_MAX_BYTES} (16 GiB):"
        " the NCCL test's largest message (1 << 30)",
        why="The issue's \"at least 1 GiB\"; 16 GiB is NVIDIA's -b 16G -e 16G. A cluster lane"
        " beside the test needs about three times this free.",
        scope="fleet",
        ge=NCCL_TEST_MIN_BYTES,
        le=NCCL_TEST_MAX_BYTES,
    )
    ray_port: int = option(
        "an integer 1024..32000, the head's GCS port (6379)",
        why="Ray's default GCS port; Ray's next six ports follow it (operations/ray.py), and the"
        " firewall admits them from the fabric only.",
        ge=1024,
        le=32000,
    )
    ray_image: Annotated[str, AfterValidator(image_with_ray)] = option(
        "registry/repository:tag of the image Ray runs in, with Ray in it,"
        " e.g. nvcr.io/nvidia/vllm:26.04-py3",
        why="The lanes' serving image: a cluster lane's ranks run in Ray's containers. NGC's"
        " may ship without Ray (dgx-spark-playbooks#109), which the deploy refuses.",
    )
    ray_auth: bool = option(
        "True or False (Ray's token authentication)",
        why="Ray has no authentication of its own by default, and whoever reaches it runs code"
        " (CVE-2023-48022, exploited in the wild). Ray 2.52 and later take a token, made once on"
        " this machine and copied to every box root-only; without it only the firewall keeps"
        " others off Ray.",
    )
    unified_memory_gib: float = option(
        f"the GiB CUDA reports as total memory (121.69 on a Spark), at most the"
        f" {SPARK_MEMORY_GIB} GB the box has",
        why="What vLLM's --gpu-memory-utilization is a fraction of: on a Spark's 128 GB LPDDR5X"
        " CUDA reports 121.69 GiB (vLLM asks 105.87 GiB at 0.87:"
        " MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47), /proc/meminfo's MemTotal byte for"
        " byte (130663006208: unslothai/unsloth PR 10486): no carve-out.",
        ge=1,
        le=SPARK_MEMORY_GIB,
    )
    lanes: list[Lane] = option(
        "a list of lanes, each a dict of name, image, model, served_name, port,"
        " memory_fraction, max_model_len and optional keys (docs/variables.md, A lane's keys)",
        why="The model servers of each box, started in this order, one after the other"
        " (simultaneous starts contend for memory: seed 003). The default is the field's"
        " two-lane appliance (seed 003); memory fractions add up to 0.80: at most 0.87 is safe,"
        " above 0.90 is refused (seed 001). A box's own data replaces the whole list.",
    )
    memory_guard_min_available_gib: float = option(
        "GiB of MemAvailable below which a lane is stopped, e.g. 8; below what the"
        " lanes leave free",
        why="On unified memory the box freezes (SSH too) before the OOM killer acts, and cgroup"
        " limits do not hold CUDA allocations. The driver fails its allocations with ~2.5 GiB"
        " still free, and the host can then wedge (open-gpu-kernel-modules#1358); MemAvailable"
        " has fallen ~2.9 GiB/s (vllm#56824): 8.5 stops a lane the two seconds before that which"
        " the guard needs (spark/memory.py GUARD_FLOOR_GIB). It stays clear of the default"
        " appliance at rest (about 14 GiB left, seed 003). No floor catches a failure while"
        " MemAvailable still counts page cache the driver does not get (22.5 GiB 'available' at"
        " one: vllm#56824); the lanes drop it before each load.",
        gt=0,
        le=SPARK_MEMORY_GIB,
    )
    lane_start_timeout_min: int = option(
        "minutes a lane may take to load until /health answers (20)",
        why="A 120B model loads in about 8 minutes, a 235B one over two boxes in about 15"
        " (seed 004).",
        ge=1,
        le=240,
    )
    hf_token_file: str | None = option(
        "None, or a file on this machine holding a Hugging Face token",
        why="Gated models need a token: the deploy copies it to /etc/spark/secrets/hf-token"
        " (root 0600) on each box, where the lanes and fetches read it, never from a command"
        " line or an environment.",
    )
    fetch_weights: bool = option(
        "True or False (fetch a lane's missing model in the background, the lane"
        " starting once it lands)",
        why="A lane itself never downloads (HF_HUB_OFFLINE=1); a ~120 GB model can take hours"
        " per box, not a wait to hide in a deploy. False stops the box with the `hf download`"
        " command to run; True starts a resumable, hash-checked fetch unit and goes on"
        " (docs/reference.md, The weights).",
    )
    hf_endpoint: HttpUrl = option(
        "the Hugging Face hub the boxes fetch from, e.g. https://huggingface.co",
        why="huggingface_hub's default endpoint (constants.py, _HF_DEFAULT_ENDPOINT; HF_ENDPOINT"
        " overrides it there), or a mirror of it.",
    )
    fleet_copy_weights: bool = option(
        "True or False (a model several boxes serve comes from the hub to one of"
        " them, the others copying it over the fabric)",
        why="From the internet once per fleet: the first box in the inventory fetches from the"
        " hub, the others copy from it over the fabric (a shape where one address reaches every"
        " box), every file checked against the hub's hash.",
    )
    prune_unused: bool = option(
        "True or False (remove the cached models and serving images no lane of the"
        " box uses any more, and the router's virtualenv where the box runs no router)",
        why="Never by default: a model is hours of download and an image may serve what the"
        " owner runs by hand (docker's `image prune -a` asks before it removes an image no"
        " container uses: docker's reference); off, a box without room names them instead.",
    )
    front_allow_networks: list[IPv4Network] = option(
        'client networks the lanes\' front admits, e.g. ["192.168.1.0/24"];'
        " [] admits any (each lane still asks its key)",
        why="nginx owns each lane's port and asks the lane's key on every path: vLLM's own"
        " --api-key leaves /invocations, /tokenize and /metrics open (vLLM's security guide);"
        " this narrows who may connect at all.",
    )
    front_tls_certificate_file: str | None = option(
        "None, or a PEM certificate (chain) file on this machine: the lanes' ports speak HTTPS",
        why="TLS at the front: the file is copied to each box.",
    )
    front_tls_key_file: str | None = option(
        "None, or the certificate's PEM private key file on this machine",
        why="The certificate's key, unencrypted, copied root-only to each box (/etc/spark/front/).",
    )
    metrics: bool = option(
        "True or False (the metrics endpoint on every box)",
        why="Between deploys each box says what it is doing (issue 28): the distribution's"
        " Prometheus node exporter on 127.0.0.1, with the box's own figures from"
        " files/spark_metrics.py, behind nginx asking the box's metrics key.",
    )
    metrics_port: int = option(
        "an integer 1024..65534, the metrics endpoint's port (9100)",
        why="The node exporter's port in Prometheus' default port allocations; the exporter"
        " itself listens on 127.0.0.1 at the next port.",
        ge=1024,
        le=65534,
    )
    metrics_interval_s: int = option(
        "seconds between two collections, 5..3600 (30)",
        why="spark-metrics.timer's period; a fault is seen within one collection.",
        ge=5,
        le=3600,
    )
    metrics_allow_networks: list[IPv4Network] = option(
        'scraper networks the metrics endpoint admits, e.g. ["192.168.1.0/24"];'
        " [] admits any (the metrics key is still asked)",
        why="Narrows who may reach the metrics endpoint at all, beside its key.",
    )
    # The fleet endpoint (spark/fleet.py), checked across the boxes in load_from_dicts.
    fleet_router: fleet.FleetRouter
    router_box: fleet.RouterBox
    router_failover_box: fleet.FailoverBox
    router_port: fleet.RouterPort
    router_health_interval_s: fleet.HealthInterval
    router_memory_gib: fleet.RouterMemory
    router_pip_index: fleet.PipIndex

    @field_validator("fabric_addresses")
    @classmethod
    def _fabric_addresses(cls, addresses: dict[str, str]) -> dict[str, str]:
        problems = []
        for ifname, text in addresses.items():
            problems += _ifname_problems(ifname)
            try:
                interface = _interface(text)
            except ValueError as error:
                problems.append(f"{ifname}: {error}")
                continue
            problems += [f"{ifname}: {problem}" for problem in _address_problems(interface)]
        problems += _twin_problems(addresses) if not problems else []
        return refused(addresses, problems)

    @field_validator("fabric_hcas")
    @classmethod
    def _fabric_hcas(cls, hcas: dict[str, str]) -> dict[str, str]:
        problems = [
            f"{ifname}: {hca!r} is not an RDMA device name; use the name under"
            " /sys/class/infiniband/"
            for ifname, hca in hcas.items()
            if not HCA.fullmatch(hca)
        ]
        return refused(hcas, problems)

    @field_validator("fabric_switch_ports")
    @classmethod
    def _switch_ports(cls, ports: list[int]) -> list[int]:
        if len(set(ports)) != len(ports) or not set(ports) <= set(topology.PORT_TWINS):
            raise ValueError(
                f"{ports!r} is not a set of a Spark's ports (0 and 1); use [1], [0] or [1, 0]"
            )
        return ports

    @field_validator("management_ifname")
    @classmethod
    def _management_ifname(cls, ifname: str) -> str:
        problems = _ifname_problems(ifname)
        if problems:
            raise ValueError(problems[0])
        return ifname

    @field_validator("management_address")
    @classmethod
    def _management_address(cls, address: str | None) -> str | None:
        if address is not None:
            try:
                IPv4Address(address)
            except AddressValueError:
                raise ValueError(
                    f"{address!r} is not an IPv4 address A.B.C.D; give the box's address on its"
                    " management interface (`ip -4 -br address show`)"
                ) from None
        return address

    @field_validator("driver_branch")
    @classmethod
    def _driver_branch(cls, branch: int) -> int:
        if branch != SUPPORTED_BRANCH:
            problem = (
                "is refused: it has a confirmed CUDA-graph deadlock on GB10"
                if branch == 590
                else "is not supported on GB10"
            )
            raise ValueError(f"branch {branch} {problem}; set driver_branch = {SUPPORTED_BRANCH}")
        return branch

    @field_validator("driver_package")
    @classmethod
    def _driver_package(cls, package: str) -> str:
        match = DRIVER_PACKAGE.fullmatch(package)
        if not match:
            raise ValueError(
                f"{package!r} is not a driver package of a branch;"
                f" use nvidia-driver-{SUPPORTED_BRANCH}-open or nvidia-driver-{SUPPORTED_BRANCH}"
            )
        if int(match[1]) != SUPPORTED_BRANCH:
            raise ValueError(
                f"{package} is of branch {match[1]}, not of driver_branch {SUPPORTED_BRANCH};"
                f" use nvidia-driver-{SUPPORTED_BRANCH}-open or nvidia-driver-{SUPPORTED_BRANCH}"
            )
        return package

    @field_validator("driver_version")
    @classmethod
    def _driver_version(cls, version: str | None) -> str | None:
        if version is None:
            return None
        if not DEBIAN_VERSION.fullmatch(version):
            raise ValueError(
                f"{version!r} is not a Debian version; use one that `apt-cache madison"
                f" nvidia-driver-{SUPPORTED_BRANCH}-open` lists, e.g. 580.159.04-0ubuntu1"
            )
        if not version.startswith(f"{SUPPORTED_BRANCH}."):
            raise ValueError(
                f"{version} is not a build of driver branch {SUPPORTED_BRANCH}; the deploy moves"
                f" a box within the branch only: use a {SUPPORTED_BRANCH}.x version"
            )
        if "-" not in version:
            # A version without a hyphen has no Debian revision (deb-version(5): "If there is no
            # debian-revision then hyphens are not allowed"); Ubuntu's driver packages all have
            # one, so apt would find no such version on the box.
            raise ValueError(
                f"{version} has no Debian revision (it is the driver's own version, as nvidia-smi"
                " prints it), and apt has no such version; use the version `apt-cache madison"
                f" nvidia-driver-{SUPPORTED_BRANCH}-open` lists for it, e.g. {version}-0ubuntu1"
            )
        return version

    @field_validator("gpu_clock_lock_mhz", mode="before")
    @classmethod
    def _gpu_clock_lock_off_or_pair(cls, value: object) -> object:
        # False reads as off; a list (as JSON or an owner writes it) as the pair it holds.
        if value is False or value is None:
            return None
        if not isinstance(value, tuple | list) or len(value) != 2:
            example = value if type(value) is int else 2200
            raise ValueError(
                f"{value!r} is not a pair (min, max) of MHz; e.g. (300, {example}) to cap the"
                " clock there, or None for no lock"
            )
        return tuple(value)

    @field_validator("gpu_clock_lock_mhz")
    @classmethod
    def _gpu_clock_lock(cls, pair: tuple[int, int] | None) -> tuple[int, int] | None:
        if pair is not None and not 0 <= pair[0] <= pair[1] <= GB10_MAX_GRAPHICS_MHZ:
            raise ValueError(
                f"{pair} is not a range (min, max) with 0 <= min <= max <="
                f" {GB10_MAX_GRAPHICS_MHZ} MHz (a GB10's highest graphics clock); e.g. (300, 2200),"
                " or None for no lock"
            )
        return pair

    @field_validator("toolkit_repo_url", "toolkit_repo_key_url")
    @classmethod
    def _url(cls, url: str) -> str:
        parts = urlsplit(url)
        usable = (parts.scheme == "https" and parts.netloc) or (
            parts.scheme == "file" and not parts.netloc and parts.path.startswith("/")
        )
        if not usable or re.search(r"[\s\"'\\]", url):
            raise ValueError(
                f"{url!r} is not an https:// or file:/// URL (without spaces or quotes);"
                " use one: over plain http anyone on the path could swap packages or key"
            )
        return url

    @field_validator("env_file")
    @classmethod
    def _env_file(cls, path: str) -> str:
        parts = path.split("/")[1:]
        if not ABSOLUTE_PATH.fullmatch(path) or "." in parts or ".." in parts:
            raise ValueError(
                f"{path!r} is not a plain absolute file path (letters, digits, '._-',"
                " no '.' or '..' parts); e.g. /etc/spark/cluster.env"
            )
        return path

    @field_validator("hf_token_file")
    @classmethod
    def _hf_token_file(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).expanduser().is_file():
            raise ValueError(
                "the value is no file on this machine (not shown: it may be a token pasted by"
                " mistake); put the Hugging Face token in a file and give its path, or set None"
            )
        return path

    @field_validator("front_allow_networks", "metrics_allow_networks", mode="before")
    @classmethod
    def _front_allow_networks(cls, networks: object) -> object:
        # strict=False for this one: the networks are written as strings in group_data.
        if not isinstance(networks, list):
            return networks
        parsed = []
        for item in networks:
            try:
                if not isinstance(item, str):
                    raise TypeError
                parsed.append(IPv4Network(item, strict=False))
            except (ValueError, TypeError):
                raise ValueError(
                    f"{item!r} is not an IPv4 network; write it as a string A.B.C.D/prefix,"
                    ' e.g. "192.168.1.0/24"'
                ) from None
        return parsed

    @field_validator("front_tls_certificate_file", "front_tls_key_file")
    @classmethod
    def _pem_file(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is None:
            return None
        file = Path(path).expanduser()
        if not file.is_file():
            # Not shown: a key pasted in place of its path would be printed.
            raise ValueError("the value is no file on this machine (not shown); give a path")
        text = file.read_text(errors="replace")
        if info.field_name == "front_tls_certificate_file":
            if "-----BEGIN CERTIFICATE-----" not in text:
                raise ValueError("the file holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        elif "-----BEGIN ENCRYPTED PRIVATE KEY-----" in text:
            # nginx would ask for the passphrase at every start, with nobody to type it.
            raise ValueError("the key is encrypted; give nginx an unencrypted key (root 0600)")
        elif not PEM_PRIVATE_KEY.search(text):
            raise ValueError("the file holds no PEM private key (-----BEGIN PRIVATE KEY-----)")
        return path

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> HostSettings:
        """The checks of one field against another, once each is valid on its own; a problem
        is reported under the field the user edits. The context may give the host's SSH port
        (pyinfra's own `ssh_port`), which no lane may take."""
        ssh_port = (info.context or {}).get("ssh_port", 22)
        box = memory.budget(self.lanes, self.unified_memory_gib)  # a worker's rank: cross-host
        problems = {
            "fabric_addresses": _not_twins(
                self.fabric_addresses, self.fabric_topology, self.fabric_switch_ports
            ),
            "fabric_hcas": _device_problems(
                {
                    ifname: text
                    for ifname, text in self.fabric_addresses.items()
                    if ifname in SPARK_TWINS
                },
                self.fabric_hcas,
            ),
            "fabric_link_speed_mbps": _speed_problems(
                self.fabric_link_speed_mbps, self.fabric_topology
            ),
            "fabric_mtu": _mtu_problems(self.fabric_mtu, self.fabric_mtu_below_9000_because),
            "lanes": clash_problems(self.lanes, port_owners(self.ray_port, ssh_port))
            + box.problems(),
            "metrics_port": _metrics_port_problems(
                self.metrics_port, self.lanes, port_owners(self.ray_port, ssh_port)
            )
            if self.metrics
            else [],
            "memory_guard_min_available_gib": box.guard_problems(
                self.memory_guard_min_available_gib
            ),
            "front_tls_key_file": (
                ["front_tls_certificate_file and front_tls_key_file: give both, or neither"]
                if (self.front_tls_certificate_file is None) != (self.front_tls_key_file is None)
                else []
            ),
        }
        errors = [
            InitErrorDetails(
                type="value_error",
                loc=(field,),
                input=getattr(self, field),
                ctx={"error": ValueError("\n".join(lines))},
            )
            for field, lines in problems.items()
            if lines
        ]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


def _metrics_port_problems(
    metrics_port: int, lanes: list[Lane], owners: list[tuple[int, int, str]]
) -> list[str]:
    """Neither the metrics endpoint's port nor the exporter's among the ports a box's services
    hold (spark/ports.py port_owners), nor any lane's port (nginx's) or backend port (its
    server's, on loopback)."""
    taken = {metrics_port: "the metrics endpoint's", metrics_exporter_port(metrics_port): "the"
             " node exporter's (on 127.0.0.1)"}  # fmt: skip
    problems = [
        f"port {port} ({whose}) is {owner}; give metrics_port another port"
        for port, whose in taken.items()
        for low, high, owner in owners
        if low <= port <= high
    ]
    return problems + [
        f"lane {lane.name}: port {port} is {taken[port]}; give metrics_port another port"
        for lane in lanes
        for port in dict.fromkeys(port for _, port in listeners(lane))
        if port in taken
    ]


def _not_twins(fabric: dict[str, str], shape: str, switch_ports: list[int]) -> list[str]:
    """Each fabric interface a Spark's twin: a misspelt one (enp1s0f1np0 for enp1s0f1np1) is
    named with the twins the box's cabling uses, not as a missing RDMA device. (A twin of the
    other port is the cross-host check's, topology.problems; independent boxes use no fabric.)"""
    if topology.SHAPES[shape].independent:
        return []
    ports = topology.ports(shape, tuple(switch_ports))
    twins = [ifname for port in ports for ifname in topology.PORT_TWINS[port]]
    where = f"port{'s' if len(ports) > 1 else ''} {' and '.join(map(str, ports))}"
    return [
        f"{ifname!r} is not one of the box's twins for its cabling ({shape}, {where}:"
        f" {', '.join(twins)}); use those names, as `ip link` shows them, or give no"
        " fabric_addresses (they are derived from the boxes' order)"
        for ifname in fabric
        if ifname not in SPARK_TWINS
    ]


def _device_problems(fabric: dict[str, str], hcas: dict[str, str]) -> list[str]:
    """Each fabric interface has its own RDMA device."""
    problems = [
        f"no RDMA device for fabric interface {ifname}; add {ifname!r} to fabric_hcas"
        for ifname in fabric
        if ifname not in hcas
    ]
    by_hca = defaultdict(list)
    for ifname in fabric:
        if ifname in hcas:
            by_hca[hcas[ifname]].append(ifname)
    return problems + [
        f"{' and '.join(ifnames)} share the RDMA device {hca}; each twin has its own"
        " (rocep1s0f1 and roceP2p1s0f1 on a Spark)"
        for hca, ifnames in by_hca.items()
        if len(ifnames) > 1
    ]


def _speed_problems(speed: int, shape: str) -> list[str]:
    """A rate the shape's twins link at (spark/topology.py DIRECT_RATE and the switch's)."""
    allowed = topology.SHAPES[shape].link_speeds_mbps
    if speed in allowed:
        return []
    rates = " or ".join(map(str, allowed))
    why = "" if len(allowed) > 1 else " (a direct cable links at 200G)"
    return [f"{speed} Mb/s is not a link rate of a {shape}; use {rates}{why}"]


def _mtu_problems(mtu: int, because: str | None) -> list[str]:
    """Jumbo frames unless the owner says why not, in one line."""
    if because is not None and LINE_BREAK.search(because):
        return ["fabric_mtu_below_9000_because: a line break or NUL; write one line"]
    if mtu < FABRIC_MTU and not (because and because.strip()):
        return [
            f"{mtu} is below {FABRIC_MTU}: NCCL measured 18.9-21 GB/s at 1500 against 23.74 GB/s"
            f" at 9000 (dgx-spark-playbooks#25); set {FABRIC_MTU} (seed 001), or keep it and say"
            " why in fabric_mtu_below_9000_because"
        ]
    return []


def _ifname_problems(ifname: str) -> list[str]:
    if IFNAME.fullmatch(ifname) and ifname not in (".", ".."):
        return []
    return [
        f"{ifname!r} is not a network interface name; use the name `ip link` shows"
        " (1..15 of A-Z a-z 0-9 _ . -)"
    ]


def _interface(text: str) -> IPv4Interface:
    """The interface address of "A.B.C.D/prefix"; the prefix is required (no silent /32)."""
    if "/" not in text:
        raise ValueError(f"{text!r} has no prefix; write it as A.B.C.D/prefix, e.g. /24")
    try:
        return IPv4Interface(text)
    except (AddressValueError, NetmaskValueError):
        raise ValueError(
            f"{text!r} is not an IPv4 address with a prefix; write A.B.C.D/prefix, e.g."
            " 192.168.100.10/24"
        ) from None


def _address_problems(interface: IPv4Interface) -> list[str]:
    ip, network = interface.ip, interface.network
    if network.prefixlen > 30:
        return [f"{interface} is a /{network.prefixlen}; use a subnet of /30 or wider, e.g. /24"]
    if ip.is_loopback or ip.is_multicast or ip.is_unspecified:
        return [f"{ip} is not a unicast address for a link; use a private one, e.g. 192.168.100.x"]
    if ip in (network.network_address, network.broadcast_address):
        return [f"{interface} is the network or broadcast address of {network}; pick a host in it"]
    return []


def _twin_problems(addresses: dict[str, str]) -> list[str]:
    """Twins on one subnet would make the kernel route both rails through one interface."""
    networks = [(ifname, IPv4Interface(text).network) for ifname, text in addresses.items()]
    return [
        f"{a} ({net_a}) and {b} ({net_b}) share a subnet; give each twin its own,"
        " e.g. 192.168.100.0/24 and 192.168.101.0/24"
        for i, (a, net_a) in enumerate(networks)
        for b, net_b in networks[i + 1 :]
        if net_a.overlaps(net_b)
    ]


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
        on a ring its management address (_fabric_problems makes sure a ring's boxes have one)."""
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


class SparkConfig(Frozen):
    """The whole inventory, validated: each host on its own, then across hosts."""

    hosts: tuple[HostConfig, ...]
    # What is allowed but risky, one "<host>: <key>: <what>" line each: shown before the run.
    warnings: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _across_hosts(self) -> SparkConfig:
        # ConfigError is no ValueError: pydantic lets it through unwrapped.
        problems = _cluster_problems(self.hosts)
        if problems:
            raise ConfigError(problems)
        return self

    @property
    def head(self) -> HostConfig:
        return next(host for host in self.hosts if host.role == "head")

    def host(self, name: str) -> HostConfig:
        return next(host for host in self.hosts if host.name == name)

    @property
    def independent(self) -> bool:
        """The boxes are each their own server (one fabric_topology on every box)."""
        return bool(self.hosts) and self.hosts[0].shape.independent

    def alone(self, name: str) -> SparkConfig:
        """One box as an inventory of its own: how an independent box is planned."""
        return SparkConfig(hosts=(self.host(name),))

    @property
    def cluster_lane(self) -> Lane | None:
        """The lane served from the head over every box, in an inventory of several boxes."""
        if len(self.hosts) < 2 or self.independent:
            return None
        return next((lane for lane in self.head.lanes if lane.is_cluster), None)

    @property
    def ranks(self) -> tuple[HostConfig, ...]:
        """The boxes in node-rank order: the head (rank 0, which serves), then the others in the
        inventory's order."""
        return (self.head, *(host for host in self.hosts if host.role != "head"))

    def node_rank(self, name: str) -> int:
        """A box's place in ``ranks``: 0 for the head."""
        return [host.name for host in self.ranks].index(name)

    def units(self, name: str) -> tuple[Lane, ...]:
        """The lanes with a unit on a box: its own and, on a box other than the head, the
        cluster lane's rank where that lane runs on vLLM's own multi-node mode (executor mp);
        on Ray, the box's Ray node holds the rank."""
        host, lane = self.host(name), self.cluster_lane
        if host.role != "head" and lane is not None and lane.cluster_executor == "mp":
            return (*host.lanes, lane)
        return host.lanes


def _names(hosts: Iterable[HostConfig]) -> str:
    return ", ".join(dict.fromkeys(host.name for host in hosts))


def _listing(pairs: Iterable[tuple[HostConfig, object]]) -> str:
    return ", ".join(f"{host.name}: {value}" for host, value in pairs)


def _cluster_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """The checks across the boxes: of a cluster, or of boxes that are each their own."""
    if any(host.shape.independent for host in hosts):
        return _mixed_topologies(hosts) or _independent_problems(hosts)
    return _joined_problems(hosts)


def _joined_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    problems = []
    heads = [host for host in hosts if host.role == "head"]
    if not heads:
        # A box holding a cluster lane is the one meant to serve it: the head.
        serving = [(host, lane) for host in hosts for lane in host.lanes if lane.is_cluster]
        problems.append(
            f"{_names(hosts)}: spark_role: no host is the head; "
            + (
                f"set spark_role = 'head' on {serving[0][0].name}, whose lanes hold the cluster"
                f" lane {serving[0][1].name} (served from the head), and 'worker' on the others"
                if len(serving) == 1
                else "set spark_role = 'head' on exactly one host"
            )
        )
    elif len(heads) > 1:
        problems.append(
            f"{_names(heads)}: spark_role: {len(heads)} hosts are the head;"
            " keep 'head' on one and set 'worker' on the others"
        )

    # Every box of a cluster must use one MTU; the head's is the reference. (The GID entry may
    # differ per box: NCCL finds each box's own.)
    reference = heads[0] if heads else hosts[0]
    problems += [
        f"{host.name}: fabric_mtu: {host.mtu} differs from {reference.name}'s {reference.mtu};"
        " use one MTU on every host (remove the host's own fabric_mtu)"
        for host in hosts
        if host.mtu != reference.mtu
    ]

    # The NCCL test's ranks run one program together: the same sizes and the same mark
    problems += [
        f"{host.name}: nccl_test: {_shown_test(host.nccl_test)} differs from {reference.name}'s"
        f" {_shown_test(reference.nccl_test)}; set nccl_test, nccl_test_min_busbw_gbs and"
        " nccl_test_max_bytes in group_data for every host"
        for host in hosts
        # (a topology that differs, and with it the default mark, is _fabric_problems')
        if host.nccl_test != reference.nccl_test and host.topology == reference.topology
    ]
    if len(hosts) > 1:
        problems += _fabric_problems(hosts)
    return problems + _cluster_lane_problems(hosts)


def _shown_test(test: NcclTest | None) -> str:
    if test is None:
        return "off"
    return f"{test.min_busbw_gbs:g} GB/s up to {test.max_bytes} bytes"


def _cluster_lane_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """A cluster lane runs on the head and on every box: one of them, as wide as the cluster,
    and room for its share next to each worker's own lanes."""
    problems = []
    heads = [host for host in hosts if host.role == "head"]
    cluster_lanes = [(host, lane) for host in hosts for lane in host.lanes if lane.is_cluster]
    for host, lane in cluster_lanes:
        where = f"{host.name}: lanes: {lane.name}: tensor_parallel_size"
        size = lane.tensor_parallel_size
        if len(hosts) == 1:
            problems.append(
                f"{where}: {size} makes a cluster lane, but the inventory has one box; set 1,"
                " or add the other boxes (a head and its workers)"
            )
        elif host.role != "head" and not heads:
            continue  # the missing head's problem names this box (_joined_problems)
        elif host.role != "head":
            problems.append(
                f"{where}: {size} makes a cluster lane, which is served from the head; move the"
                f" lane to the head's lanes ({_names(heads)}'s), or make this box the head"
            )
        elif lane.cluster_executor == "ray" and lane.image != host.ray.image:
            problems.append(
                f"{host.name}: lanes: {lane.name}: image: {lane.image}, but a cluster lane's"
                f" ranks run in Ray's containers ({host.ray.image}); set ray_image and the"
                " lane's image to the same image"
            )
        elif size != len(hosts):
            problems.append(
                f"{where}: {size}, but the cluster has {len(hosts)} boxes ({_names(hosts)});"
                f" set {len(hosts)}: one rank on each box (each box has one GPU)"
            )
        elif host.shape.neighbours_only:
            problems.append(
                f"{where}: {size} makes a cluster lane, and this collection does not yet run"
                " one over a ring3 (each box's fabric addresses reach one neighbour each; Ray's"
                " head and vLLM's --master-addr need one address every box reaches); serve it"
                " from a pair or a switch, or set 1"
            )
    if len(cluster_lanes) > 1:
        problems.append(
            f"{_names(host for host, _ in cluster_lanes)}: lanes:"
            f" {' and '.join(lane.name for _, lane in cluster_lanes)} are cluster lanes; keep"
            " one (each holds the one GPU of every box)"
        )
    if problems or not cluster_lanes or len(heads) != 1:
        return problems
    lane = cluster_lanes[0][1]
    for host in hosts:
        if host.role == "head":
            continue  # the head's lanes, the cluster lane among them, were checked together
        box = box_budget(host, lane)
        problems += [f"{host.name}: lanes: {problem}" for problem in box.problems()]
        problems += [
            f"{host.name}: memory_guard_min_available_gib: {problem}"
            for problem in box.guard_problems(host.memory_guard_min_available_gib)
        ]
    return problems


def _independent_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """Boxes that are each their own server: each its own head, with no fabric and no cluster
    lane. Nothing else need agree across them (an MTU, the NCCL test: a cluster's)."""
    why = "fabric_topology 'independent' makes every box its own server"
    problems = [
        f"{host.name}: spark_role: 'worker', but {why} (its own head); remove spark_role"
        for host in hosts
        if host.role != "head"
    ]
    problems += [
        f"{host.name}: fabric_addresses: given, but {why}, using no fabric; remove them, or set"
        " the fabric_topology the boxes are cabled as"
        for host in hosts
        if host.fabric
    ]
    problems += [
        f"{host.name}: lanes: {lane.name}: tensor_parallel_size: {lane.tensor_parallel_size}"
        f" makes a cluster lane, but {why}; set 1, or set the fabric_topology the boxes are"
        " cabled as (a head and its workers)"
        for host in hosts
        for lane in host.lanes
        if lane.is_cluster
    ]
    return problems


def _mixed_topologies(hosts: tuple[HostConfig, ...]) -> list[str]:
    """One topology (and switch ports) on every host, or the one problem that they differ."""
    shape, first = hosts[0].topology, hosts[0]
    differ = [
        host for host in hosts if (host.topology, host.switch_ports) != (shape, first.switch_ports)
    ]
    if not differ:
        return []
    listing = _listing((h, f"{h.topology} {list(h.switch_ports)}") for h in hosts)
    return [
        f"{_names(differ)}: fabric_topology: the hosts differ ({listing}); set one"
        " fabric_topology (and fabric_switch_ports) in group_data for every host"
    ]


def _fabric_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """One topology on every host, as many boxes as it takes, every twin it uses addressed,
    the twins of one cable (or switch segment) on one subnet, every address its own."""
    if differ := _mixed_topologies(hosts):
        return differ
    shape, first = hosts[0].topology, hosts[0]
    low, high = topology.SHAPES[shape].boxes
    if len(hosts) < low or (high is not None and len(hosts) > high):
        wanted = f"{low}" if low == high else f"{low} to {high}"
        return [
            f"{_names(hosts)}: fabric_topology: {shape} joins {wanted} boxes, the inventory"
            f" has {len(hosts)}; change fabric_topology or the boxes"
        ]
    # Given addresses fill no gap: an empty fabric_addresses was derived (load_from_dicts).
    problems = topology.problems(
        shape,
        [(host.name, {link.ifname: link.address for link in host.fabric}) for host in hosts],
        first.switch_ports,
    )
    firsts = {host.fabric[0].ifname for host in hosts if host.fabric}
    if not problems and topology.SHAPES[shape].one_address_for_all and len(firsts) > 1:
        listing = _listing((h, "+".join(link.ifname for link in h.fabric)) for h in hosts)
        return [
            f"{_names(hosts)}: fabric_addresses: the interfaces differ ({listing}); list the"
            " same interfaces in the same order on every host (the first carries the sockets)"
        ]
    if topology.SHAPES[shape].neighbours_only:
        problems += [
            f"{host.name}: management_address: missing; a ring's rendezvous and sockets go over"
            f" {host.management_ifname} (no twin reaches every box): give the box's IPv4 address"
            f" there (`ip -4 -br address show {host.management_ifname}`)"
            for host in hosts
            if host.management_address is None
        ]
    users = defaultdict(list)
    for host in hosts:
        for link in host.fabric:
            users[link.address.ip].append((host, link.ifname))
    return problems + [
        f"{_names(host for host, _ in used)}: fabric_addresses: {ip} is used by"
        f" {' and '.join(f'{host.name} ({ifname})' for host, ifname in used)};"
        " give every host its own address"
        for ip, used in users.items()
        if len(used) > 1
    ]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _owner(loc: tuple[int | str, ...]) -> tuple[type[BaseModel], str]:
    """The model and the field an error location ends in: lanes nest Lane and ModelSpec."""
    if loc[0] == "lanes" and len(loc) > 2 and isinstance(loc[1], int):
        if loc[2] == "model_spec" and len(loc) > 3:
            return ModelSpec, str(loc[3])
        return Lane, str(loc[2])
    return HostSettings, str(loc[0])


def _lane_label(data: dict[str, Any], index: int) -> str:
    """A lane by its name where it has a usable one, else by its place (#1 is the first)."""
    lanes = data.get("lanes")
    lane = lanes[index] if isinstance(lanes, list | tuple) and index < len(lanes) else None
    name = lane.get("name") if isinstance(lane, dict) else None
    return name if isinstance(name, str) and SLUG.fullmatch(name) else f"#{index + 1}"


def _problems(
    name: str, error: ValidationError, data: dict[str, Any], pyinfra_keys: Iterable[str]
) -> list[str]:
    """pydantic's errors as "<host>: <key>: <what>; <allowed>" lines (values of unknown
    keys are never shown: a misspelt `_sudo_password` may hold a secret)."""
    problems = []
    for item in error.errors():
        loc = item["loc"]
        parts = [str(part) for part in loc]
        if len(loc) > 1 and loc[0] == "lanes" and isinstance(loc[1], int):
            parts[1] = _lane_label(data, loc[1])
        where = f"{name}: " + "".join(f"{part}: " for part in parts)
        model, field = _owner(loc)
        if item["type"] == "extra_forbidden":
            candidates = [*model.model_fields]
            if model is HostSettings:
                candidates += pyinfra_keys
            guess = difflib.get_close_matches(field, candidates, 1)
            known = ", ".join(model.model_fields)
            hint = f"did you mean {guess[0]}?" if guess else f"known keys: {known}"
            theirs = f" (keys starting with {', '.join(PYINFRA_KEY_PREFIXES)} are pyinfra's)"
            problems.append(f"{where}unknown key; {hint}{theirs if model is HostSettings else ''}")
        elif item["type"] == "value_error":
            problems += [where + line for line in str(item["ctx"]["error"]).splitlines()]
        elif item["type"] == "missing":
            allowed = model.model_fields[field].description
            place = "group_data/all.py" if model is HostSettings else "the lane"
            problems.append(f"{where}missing; set it in {place} ({allowed})")
        else:
            allowed = model.model_fields[field].description
            got = "not shown: it may be a secret" if field in SECRET_KEYS else _shown(item["input"])
            problems.append(f"{where}{item['msg']} (got {got}); allowed: {allowed}")
    return problems


def _ssh_port(value: object) -> int:
    """The port pyinfra connects to (its `ssh_port`, which pyinfra checks itself), else 22."""
    return int(value) if str(value).isdigit() else 22


def unknown_pyinfra_keys(name: str, data: dict[str, Any], pyinfra_keys: Iterable[str]) -> list[str]:
    """A problem for each key of ``data`` in pyinfra's SSH or global-argument namespace that
    pyinfra does not know, naming the nearest known one (its value never shown: a misspelt
    `_sudo_password` holds a secret)."""
    known = [key for key in pyinfra_keys if key.startswith(CHECKED_PYINFRA_PREFIXES)]
    return [
        f"{name}: {key}: unknown pyinfra key, which pyinfra would ignore;"
        f" did you mean {difflib.get_close_matches(key, known, 1, cutoff=0)[0]}?"
        for key in data
        if key.startswith(CHECKED_PYINFRA_PREFIXES) and key not in known
    ]


def ssh_key_problems(name: str, data: dict[str, Any], cwd: str | None) -> list[str]:
    """The box's `ssh_key` a file on this machine where pyinfra 3.10 looks for it (the path with
    ~ expanded, then under ``cwd``: pyinfra/connectors/ssh_util.py `_resolve_key_paths`); else
    pyinfra fails at connecting, with a traceback for every box. (Without ssh_key, pyinfra lets
    paramiko try the agent and ~/.ssh's keys: pyinfra/connectors/ssh.py `make_paramiko_kwargs`.)"""
    key = data.get("ssh_key")
    if not key:
        return []
    if isinstance(key, str):
        candidates = [Path(key).expanduser()]
        candidates += [Path(cwd) / Path(key).expanduser()] if cwd else []
        if any(path.is_file() for path in candidates):
            return []
    # A private key pasted in place of its path is never shown.
    shown = "(not shown: not a path)" if not isinstance(key, str) or "\n" in key else repr(key)
    return [
        f"{name}: ssh_key: no file {shown} on this machine"
        + (f" (nor under {cwd})" if cwd and isinstance(key, str) else "")
        + "; give the path of the private key that logs in to the box, e.g. ~/.ssh/id_ed25519"
        " (`ls ~/.ssh`), or leave ssh_key out: pyinfra then tries your SSH agent and ~/.ssh's keys"
    ]


def _mentions(problem: str, keys: Iterable[str]) -> bool:
    return any(re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", problem) for key in keys)


def _host_settings(
    name: str,
    data: dict[str, Any],
    pyinfra_keys: list[str],
    defaults: dict[str, Any],
) -> tuple[HostSettings | None, list[str], set[str]]:
    """A box's own settings and every problem of its own, and the keys set aside: where a key is
    refused, the box is validated again with it at its default (``defaults``, group_data's, else
    the model's), so that the checks of one key against another still run, and the box has a
    stand-in for the checks across boxes. What a later round says naming a key set aside is a
    consequence of that key, not news: left out. None: no stand-in validates."""
    own = {
        key: value
        for key, value in data.items()
        if not key.startswith(PYINFRA_KEY_PREFIXES) and key not in TEARDOWN_KEYS
    }
    context = {"ssh_port": _ssh_port(data.get("ssh_port"))}
    problems: list[str] = []
    aside: set[str] = set()
    values = own
    while True:
        try:
            return HostSettings.model_validate(values, context=context), problems, aside
        except ValidationError as error:
            found = _problems(name, error, data, pyinfra_keys)
            problems += [problem for problem in found if not _mentions(problem, aside)]
            refused_keys = {str(item["loc"][0]) for item in error.errors()}
            if refused_keys <= aside:  # the defaults themselves are refused
                return None, problems, aside
            aside |= refused_keys
            values = {key: value for key, value in own.items() if key not in aside} | {
                key: defaults[key]
                for key in aside
                if key in defaults and key in HostSettings.model_fields
            }


def _consequence(problem: str, aside: dict[str, set[str]]) -> bool:
    """A problem across boxes that names a box and one of its keys set aside (_host_settings)."""
    return any(
        _mentions(problem, [name]) and _mentions(problem, keys) for name, keys in aside.items()
    )


def load_from_dicts(
    hosts: dict[str, dict[str, Any]],
    pyinfra_keys: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
    cwd: str | None = None,
) -> SparkConfig:
    """Validate every host's data (as host.data.dict() gives it); raise ConfigError listing
    every problem; what is allowed but risky is in the result's warnings. ``pyinfra_keys``: the
    keys pyinfra itself reads, offered where a key is misspelt; given, a host's `ssh_` and `_`
    keys must be among them and its `ssh_key` a file (under ``cwd``, pyinfra's, when relative);
    without them, as for data no pyinfra reads, those pass. ``defaults``: group_data's values,
    which stand in for a box's refused keys, so that every independent problem is listed at
    once (_host_settings); the checks across boxes run over the stand-ins too."""
    pyinfra_keys = list(pyinfra_keys)
    problems: list[str] = []
    configs = []
    aside: dict[str, set[str]] = {}
    for name, data in hosts.items():
        if pyinfra_keys:
            problems += unknown_pyinfra_keys(name, data, pyinfra_keys)
            problems += ssh_key_problems(name, data, cwd)
        settings, found, aside[name] = _host_settings(name, data, pyinfra_keys, defaults or {})
        problems += found
        if settings is None:
            continue
        if len(hosts) > 1 and not settings.fabric_addresses:
            # None given: the topology's scheme, by the box's place in the inventory.
            addresses = topology.derived(
                settings.fabric_topology,
                list(hosts).index(name),
                len(hosts),
                tuple(settings.fabric_switch_ports),
            )
            settings = settings.model_copy(update={"fabric_addresses": addresses})
            # The derived twins need their RDMA devices as given ones do (_across_fields).
            missing = _device_problems(addresses, settings.fabric_hcas)
            if missing:
                problems += [f"{name}: fabric_hcas: {problem}" for problem in missing]
                continue
        # A lone box is the head, and so is each independent box.
        alone = len(hosts) == 1 or topology.SHAPES[settings.fabric_topology].independent
        role = settings.spark_role or ("head" if alone else None)
        if role is None:
            if "spark_role" not in aside[name]:  # else its own problem says it
                problems.append(
                    f"{name}: spark_role: missing in a cluster of {len(hosts)} hosts;"
                    " set 'head' on one host and 'worker' on the others"
                )
            aside[name].add("spark_role")
            role = "worker"  # a stand-in for the checks across boxes
        # Where pyinfra reaches the box (its ssh_hostname, else its name): clients reach the
        # lanes there, and its SSH port stays open through the cluster's firewall.
        reached = (str(data.get("ssh_hostname") or name), _ssh_port(data.get("ssh_port")))
        configs.append(HostConfig.from_settings(name, role, settings, reached))
    if not hosts:
        problems.append("inventory: hosts: empty; list at least one Spark")
    # A cluster lane takes its share of every box: the workers' totals count it too, and the
    # router's box its share.
    cluster = next(
        (lane for host in configs if host.role == "head" for lane in host.lanes if lane.is_cluster),
        None,
    )
    if problems:
        if configs and len(configs) == len(hosts):
            across = _cluster_problems(tuple(configs)) + fleet.problems(tuple(configs), cluster)
            problems += [problem for problem in across if not _consequence(problem, aside)]
        raise ConfigError(problems)
    router = fleet.router(tuple(configs))
    warnings = tuple(
        f"{host.name}: lanes: {warning}"
        for host in configs
        for warning in box_budget(host, cluster, router.memory_gib_on(host.name)).warnings()
        + context_warnings(host.lanes)
    ) + tuple(nccl_warnings(configs, cluster))
    # The fleet endpoint's problems beside the cluster's: each stands on its own.
    problems = fleet.problems(tuple(configs), cluster)
    try:
        spark = SparkConfig(hosts=tuple(configs), warnings=warnings)
    except ConfigError as error:
        raise ConfigError(error.problems + problems) from None
    if problems:
        raise ConfigError(problems)
    return spark


def nccl_warnings(hosts: list[HostConfig], cluster: Lane | None) -> list[str]:
    """A cluster whose ranks run NCCL in an image known to carry one that deadlocks on a
    Spark's aarch64: the cluster lane's image (on the head, which names it), else the NCCL
    test's (Ray's image, on every box that runs the test). An image whose NCCL is not known is
    left to the test's verdict, which reads NCCL's own log."""
    if len(hosts) < 2 or hosts[0].shape.independent:
        return []
    if cluster is not None:
        head = next(host for host in hosts if host.role == "head")
        warning = nccl_deadlock_warning(cluster.image)
        return [f"{head.name}: lanes: {cluster.name}: {warning}"] if warning else []
    return [
        f"{host.name}: ray_image: {warning}"
        for host in hosts
        if host.nccl_test is not None and (warning := nccl_deadlock_warning(host.ray.image))
    ]

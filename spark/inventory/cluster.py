"""The cluster's keys: each box's role, the environment file, the NCCL test, Ray; the whole
inventory validated (SparkConfig), and the checks across its boxes: of a cluster (one head, one
NCCL test, the fabric's and the cluster lane's checks), or of boxes that are each their own."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, field_validator, model_validator

from spark.inventory import fabric, lanes
from spark.inventory.hosts import ConfigError, Frozen, HostConfig, NcclTest, names
from spark.lane import image_with_ray
from spark.options import option
from spark.vllm_release import nccl_deadlock_warning

if TYPE_CHECKING:
    from spark.lane import Lane

ABSOLUTE_PATH = re.compile(r"(/[A-Za-z0-9_.-]+)+")
# Its message sizes: 1 MiB (files/nccl_check.py's first) to 16 GiB (NVIDIA's -b 16G -e 16G);
# a mark above two twins' line rate (2 x 200 Gb/s = 50 GB/s) cannot be reached.
NCCL_TEST_MIN_BYTES, NCCL_TEST_MAX_BYTES = 1 << 20, 16 << 30
NCCL_TEST_MAX_GBS = 50


class Role(BaseModel):
    """A box's place in the cluster: first of its keys, as in every listing."""

    spark_role: Literal["head", "worker"] | None = option(
        "'head' on exactly one host, 'worker' on the others"
        " (a lone host may leave it out: it is the head)",
        why="A cluster's head serves its cluster lanes, runs Ray's GCS and rank 0 of the NCCL"
        " test; the workers join it (docs/reference.md, A cluster, step by step).",
        scope="host",
        default=None,
    )


class ClusterKeys(BaseModel):
    """A box's keys for the cluster the boxes form: the environment file, NCCL and Ray."""

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


class SparkConfig(Frozen):
    """The whole inventory, validated: each host on its own, then across hosts."""

    hosts: tuple[HostConfig, ...]
    # What is allowed but risky, one "<host>: <key>: <what>" line each: shown before the run.
    warnings: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _across_hosts(self) -> SparkConfig:
        # ConfigError is no ValueError: pydantic lets it through unwrapped.
        found = problems(self.hosts)
        if found:
            raise ConfigError(found)
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


def problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    """The checks across the boxes: of a cluster, or of boxes that are each their own."""
    if any(host.shape.independent for host in hosts):
        return fabric.mixed_topologies(hosts) or _independent_problems(hosts)
    return _joined_problems(hosts)


def _joined_problems(hosts: tuple[HostConfig, ...]) -> list[str]:
    problems = []
    heads = [host for host in hosts if host.role == "head"]
    if not heads:
        # A box holding a cluster lane is the one meant to serve it: the head.
        serving = [(host, lane) for host in hosts for lane in host.lanes if lane.is_cluster]
        problems.append(
            f"{names(hosts)}: spark_role: no host is the head; "
            + (
                f"set spark_role = 'head' on {serving[0][0].name}, whose lanes hold the cluster"
                f" lane {serving[0][1].name} (served from the head), and 'worker' on the others"
                if len(serving) == 1
                else "set spark_role = 'head' on exactly one host"
            )
        )
    elif len(heads) > 1:
        problems.append(
            f"{names(heads)}: spark_role: {len(heads)} hosts are the head;"
            " keep 'head' on one and set 'worker' on the others"
        )

    reference = heads[0] if heads else hosts[0]
    problems += fabric.mtu_problems(hosts, reference)

    # The NCCL test's ranks run one program together: the same sizes and the same mark
    problems += [
        f"{host.name}: nccl_test: {_shown_test(host.nccl_test)} differs from {reference.name}'s"
        f" {_shown_test(reference.nccl_test)}; set nccl_test, nccl_test_min_busbw_gbs and"
        " nccl_test_max_bytes in group_data for every host"
        for host in hosts
        # (a topology that differs, and with it the default mark, is fabric.cabled_problems')
        if host.nccl_test != reference.nccl_test and host.topology == reference.topology
    ]
    if len(hosts) > 1:
        problems += fabric.cabled_problems(hosts)
    return problems + lanes.cluster_lane_problems(hosts)


def _shown_test(test: NcclTest | None) -> str:
    if test is None:
        return "off"
    return f"{test.min_busbw_gbs:g} GB/s up to {test.max_bytes} bytes"


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

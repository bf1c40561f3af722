"""Print each box's plan from the inventory, contacting no box: what a deploy will do.

    .venv/bin/python -m stages.show_plan [--inventory inventories/lab.py] [--box NAME] [--json]

`make plan` runs it. The JSON is spark/plan.py's Plan, which reads back as the same plan.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from spark.plan import (
    BoxPlan,
    Cluster,
    FleetEndpoint,
    GpuClockLock,
    Memory,
    Plan,
    Route,
    ServedLane,
)
from spark.router import LITELLM
from spark.router import UNIT as ROUTER_UNIT
from stages.settings import plan_or_say_why


def rows(title: str, lines: list[str]) -> list[str]:
    """``lines`` under a title in the left column."""
    return [f"  {title if n == 0 else '':<12}{line}" for n, line in enumerate(lines or ["-"])]


def served_line(served: ServedLane) -> str:
    where = f"port {served.port} (loopback {served.backend_port})"
    if served.headless and served.rank is not None:
        where = f"headless rank {served.rank.node_rank}, master {served.rank.master_addr}"
    after = f", after {served.after}" if served.after else ""
    demand = ""
    if (wanted := served.on_demand) is not None:
        conflicts = f", stops {' and '.join(wanted.conflicts)} first" if wanted.conflicts else ""
        demand = (
            f"; on demand: a socket on loopback {wanted.socket_port}, the server on"
            f" {wanted.server_port}, stopped after {wanted.idle_s} s idle{conflicts}"
        )
    key = "yes" if served.key_variable else "no"
    return (
        f"{served.name}: {served.engine} {served.model} as {served.served_name}, {where},"
        f" {served.image}, memory {served.memory_fraction:g}, key {key}{after}{demand}"
    )


def served_lines(served: ServedLane) -> list[str]:
    """The lane, then the command line its container runs (shell-quoted as a person would
    type it; the key is read into its variable, never in the line), then what else its unit
    holds."""
    model = served.model_at_start
    lines = [served_line(served), f"  runs  {shlex.join(served.argv)}"]
    if model is not None:
        lines.append(f"        {model.variable}: {model.file} of the snapshot under {model.repo}")
    if served.key_variable:
        lines.append(f"        key in {served.key_variable}, read from its file at the start")
    timeouts = served.timeouts
    lines.append(
        f"        start within {timeouts.start_s} s, {served.health_path} within"
        f" {timeouts.health_s} s"
        + (f", Ray nodes within {timeouts.nodes_wait_s} s" if served.on_ray else "")
        + ("; canary on" if served.canary_causes is not None else "; canary off")
    )
    return lines


def clock_line(lock: GpuClockLock | None) -> str:
    if lock is None:
        return "GPU clock not locked (gpu_clock_lock_mhz None): no unit, clocks reset"
    return (
        f"GPU clock locked to {lock.min_mhz}-{lock.max_mhz} MHz at every boot: {lock.unit}"
        f" runs `{lock.command}` after nvidia-persistenced"
    )


def cluster_lines(cluster: Cluster) -> list[str]:
    lines = [f"members {', '.join(cluster.members)}"]
    if cluster.firewall is not None:
        subnets = ", ".join(f"{ifname} {net}" for ifname, net in cluster.firewall.fabric.items())
        lines.append(
            f"firewall: cluster ports from {subnets} only; open {list(cluster.firewall.open_ports)}"
        )
    if cluster.ray is not None:
        ray = cluster.ray
        lines.append(
            f"Ray {ray.role} at {ray.node_ip}, head {ray.head_ip}:{ray.port},"
            f" token auth {'on' if ray.auth else 'off'}, image {ray.image}"
        )
    if cluster.ray_removed:
        lines.append("no Ray node (the cluster lane runs on vLLM's own multi-node mode)")
    if cluster.firewall is None and cluster.ray is None:
        lines.append("no Ray and no firewall: no address reaches every box")
    if cluster.nccl_test is not None:
        run = cluster.nccl_test
        lines.append(
            f"NCCL test: rank {run.rank} of {run.world} in {run.image}, on {', '.join(run.hcas)};"
            f" passes at {run.min_busbw_gbs:g} GB/s of all_gather at {run.max_bytes} B"
        )
    if cluster.lane is not None:
        lane = cluster.lane
        if lane.served is not None:
            first, *rest = served_lines(lane.served)
            lines += [f"cluster lane {first}", *rest]
        else:
            lines.append(f"cluster lane {lane.name}: its rank in this box's Ray node")
        if lane.weights.source is not None:
            lines.append(f"  its model copied over the fabric from {lane.weights.source}")
    return lines


# What an independent box's plan leaves out (spark/topology.py, the "independent" shape).
INDEPENDENT = "none: an independent server (fabric_topology independent)"


def memory_lines(memory: Memory, floor_gib: float) -> list[str]:
    lines = [
        f"{memory.unified_gib:g} GiB; the lanes leave {memory.free_gib:g} GiB free; the"
        f" guard stops a lane below {floor_gib:g} GiB available"
    ]
    for share in memory.shares:
        idle = share.on_demand_idle_s
        lines.append(
            f"{'rank of ' if share.rank else ''}{share.lane}: {share.fraction:g} ="
            f" {share.share_gib:g} GiB, needs ~{share.needs_gib:g} GiB"
            + (f"; on demand, stopped after {idle} s idle" if idle is not None else "")
        )
    if memory.router_gib:
        lines.append(f"the fleet's router: {memory.router_gib:g} GiB")
    if any(share.on_demand_idle_s is not None for share in memory.shares):
        conflicts = ", ".join(f"{a} and {b}" for a, b in memory.conflicts) or "none"
        lines.append(f"on demand: never up together: {conflicts}")
        most = ", ".join(memory.largest_on_demand) or "none"
        lines.append(f"on demand: the most up at once (counted above): {most}")
    return lines


def route_line(route: Route) -> str:
    backends = ", ".join(
        f"{backend.box}:{backend.port} ({backend.lane}{', on demand' if backend.on_demand else ''},"
        f" timeout {backend.timeout_s} s)"
        for backend in route.backends
    )
    replicas = f"; {len(route.backends)} replicas" if len(route.backends) > 1 else ""
    return f"{route.served_name} -> {backends}{replicas}"


def fleet_text(endpoint: FleetEndpoint) -> str:
    if not endpoint.boxes:
        return "\n".join(["the fleet endpoint", *rows("router", ["none (fleet_router = False)"])])
    first, *failover = endpoint.boxes
    where = f"{first.name} ({first.address})" + "".join(
        f", failover {box.name} ({box.address})" for box in failover
    )
    out = ["the fleet endpoint"]
    out += rows(
        "router",
        [
            f"on {where}, port {endpoint.port} (the router on 127.0.0.1:{endpoint.loopback_port})",
            f"fleet key {endpoint.key_path}; each lane checked every"
            f" {endpoint.health_interval_s} s; {endpoint.memory_gib:g} GiB of its box",
            f"{' '.join(LITELLM)}: {len(endpoint.requirements)} pinned packages from"
            f" {endpoint.pip_index or 'the default index of pip'}",
            f"unit {ROUTER_UNIT}: {' '.join(endpoint.unit_command)}",
        ]
        + (
            [f"TLS fronts verified with {endpoint.ca_bundle}: {', '.join(endpoint.ca_files)}"]
            if endpoint.ca_bundle
            else []
        ),
    )
    out += rows("routes", [route_line(route) for route in endpoint.routes])
    return "\n".join(out)


def box_text(box: BoxPlan) -> str:
    role = "independent" if box.independent else box.role
    out = [f"{box.name} ({role}), reached at {box.address}"]
    out += rows(
        "host layer",
        [
            f"driver {box.driver.package}"
            f" {box.driver.version or 'at the build apt installs first'}"
            f" (branch {box.driver.branch}) held, apt pinned",
            clock_line(box.gpu_clock_lock),
            f"kernel {'held at the running ABI, apt pinned' if box.kernel.hold else 'not held'}",
            f"NVIDIA container toolkit {box.toolkit.version}, docker's nvidia runtime",
        ],
    )
    fabric = []
    if box.kernel.kho_fix is not None:
        how = "through GRUB" if box.kernel.kho_fix == "grub" else "or the box refused"
        fabric.append(f"kernel: kexec handover off ({box.kernel.boot_option} {how})")
    if box.fabric is not None:
        plan = box.fabric
        fabric.append(
            f"{plan.shape}, MTU {plan.mtu}, {plan.link_speed_mbps} Mb/s ({plan.link_speed_low}"
            f" below), RoCE v2 IPv4 entry expected at {plan.gid_index}"
        )
        for link in plan.links:
            peers = ", ".join(
                f"{peer.box} {peer.address}" for peer in plan.peers if peer.ifname == link.ifname
            )
            fabric.append(
                f"{link.ifname} {link.address} ({link.hca}, port {link.port}) -> {peers or '-'}"
            )
        if plan.management is not None:
            fabric.append(f"management {plan.management[1]} on {plan.management[0]}")
    out += rows("fabric", fabric or ([INDEPENDENT] if box.independent else []))
    out += rows(
        "environment",
        [box.environment.path]
        + [f"{key}={value}" for key, value in sorted(box.environment.variables.items())],
    )
    out += rows("memory", memory_lines(box.memory, box.memory_guard.floor_gib))
    out += rows("lanes", [line for lane in box.lanes for line in served_lines(lane.served)])
    front = box.front
    out += rows(
        "front",
        [
            "nginx: "
            + (
                ", ".join(
                    f"{lane.name} {lane.port} (timeout {lane.timeout_s} s)" for lane in front.lanes
                )
                or "no lane"
            )
            + (
                f"; the router {front.router.port} (timeout {front.router.timeout_s} s)"
                if front.router
                else ""
            )
            + f"; TLS {'on' if front.tls else 'off'}"
            + (f"; from {', '.join(front.allow_networks)} only" if front.allow_networks else "")
        ],
    )
    cluster = cluster_lines(box.cluster) if box.cluster else []
    out += rows("cluster", cluster or ([INDEPENDENT] if box.independent else []))
    watch = box.metrics
    out += rows(
        "metrics",
        [
            f"node exporter on 127.0.0.1:{watch.exporter_port}, nginx on {watch.port} asking"
            f" the metrics key; collected every {watch.interval_s} s"
            + (f"; from {', '.join(watch.allow_networks)} only" if watch.allow_networks else "")
        ]
        if watch
        else [],
    )
    return "\n".join(out)


def text(plan: Plan) -> str:
    parts = [box_text(box) for box in plan.boxes] + [fleet_text(plan.fleet)]
    if plan.warnings:
        parts.append("warnings:\n" + "\n".join(f"  {warning}" for warning in plan.warnings))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default="inventories/lab.py")
    parser.add_argument("--box", action="append", help="only this box (again for more)")
    parser.add_argument("--json", action="store_true", help="the plan as JSON")
    args = parser.parse_args(argv)
    if (plan := plan_or_say_why(args.inventory)) is None:
        return 2
    if args.box:
        unknown = sorted(set(args.box) - {box.name for box in plan.boxes})
        if unknown:
            names = ", ".join(box.name for box in plan.boxes)
            print(f"--box {', '.join(unknown)}: no such box ({names})", file=sys.stderr)
            return 2
        plan = plan.model_copy(update={"boxes": tuple(plan.box(name) for name in args.box)})
    print(plan.model_dump_json(indent=2) if args.json else text(plan), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

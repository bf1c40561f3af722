"""The fabric: a kernel whose RDMA registers memory, every twin the shape uses cabled, its
NetworkManager profile, its link rate and RoCE v2 entry, the peers reached with jumbo frames;
then the cluster environment file."""

from pyinfra.api import deploy

from operations import environment, kernel, nmcli, preflight, roce
from operations.asked import Question
from spark.plan import BoxPlan, Fabric


def profile_name(ifname: str) -> str:
    """The NetworkManager profile the deploy keeps for a twin."""
    return f"fabric-{ifname}"


def peers_of(plan: Fabric) -> list[tuple[str, str, str]]:
    """The other boxes' twins a twin pings: (its ifname, the box, the address)."""
    return [(peer.ifname, peer.box, peer.address) for peer in plan.peers]


def questions(box: BoxPlan) -> list[Question]:
    """Everything the stage reads of the box, which deploy.py says ahead (operations/asked.py)."""
    plan = box.fabric
    said = environment.questions(box.environment.path)
    if box.kernel.kho_fix is not None:
        said += kernel.handover_questions(box.kernel.grub_dropin)
    if plan is not None:
        said += [
            *preflight.fabric_questions(
                twins=[ifname for ifname, _port in plan.ports],
                ifnames=plan.ifnames,
                peers=peers_of(plan),
                mtu=plan.mtu,
                management=plan.management and plan.management[0],
            ),
            *nmcli.questions(plan.ifnames),
            *roce.questions(),
        ]
    return said


@deploy("Fabric")
def fabric(box: BoxPlan) -> None:
    plan = box.fabric
    if box.kernel.kho_fix is not None:
        kernel.handover_off(
            name=f"Kernel: kexec handover off ({box.kernel.boot_option}), RDMA registers memory",
            fix=box.kernel.kho_fix,
            default_from=box.kernel.kho_default_from,
            boot_option=box.kernel.boot_option,
            grub_dropin=box.kernel.grub_dropin,
        )
    if plan is not None:
        preflight.fabric_ports_cabled(
            name=f"Fabric ports of {plan.shape} cabled: every twin there",
            twins=list(plan.ports),
        )
        # Before the profiles: a netplan file naming a twin would give it a profile of its own.
        nmcli.netplan_left_out(
            name="Fabric twins left to NetworkManager: netplan files naming them "
            + ("moved aside (fabric_take_over_netplan)" if plan.take_over_netplan else "refused"),
            ifnames=plan.ifnames,
            take_over=plan.take_over_netplan,
        )
        for link in plan.links:
            nmcli.ethernet(
                name=f"Fabric {link.ifname}: static IPv4, MTU {plan.mtu}",
                con_name=profile_name(link.ifname),
                ifname=link.ifname,
                address=str(link.address),
                mtu=plan.mtu,
            )
        # After the profiles: a twin NetworkManager just brought up may report its rate only now.
        preflight.link_speeds(
            name=f"Fabric twins link at {plan.link_speed_mbps} Mb/s",
            ifnames=plan.ifnames,
            expected_mbps=plan.link_speed_mbps,
            low=plan.link_speed_low,
        )
        for link in plan.links:
            roce.roce_v2_entry(
                name=f"RoCE v2 IPv4 GID of {link.hca} (NCCL selects it; expected at"
                f" {plan.gid_index})",
                ifname=link.ifname,
                address=str(link.address),
                expected_index=plan.gid_index,
            )
        preflight.fabric_peers(
            name=f"Fabric twins reach the other boxes' twins ({plan.mtu}-byte frames)",
            peers=peers_of(plan),
            mtu=plan.mtu,
        )
        if plan.management is not None:  # a ring's rendezvous and sockets go over it
            ifname, address = plan.management
            preflight.management_address(
                name=f"Management address {address} on {ifname}",
                ifname=ifname,
                address=str(address),
            )
    environment.cluster_env(
        name=f"Cluster environment in {box.environment.path}",
        variables=box.environment.variables,
        notes=box.environment.notes,
        path=box.environment.path,
    )

"""The fabric promise, per twin: its NetworkManager profile, address, MTU 9000 on the link, its
link rate, no netplan file but NetworkManager's own naming it, and the one RoCE v2 IPv4 GID entry
NCCL selects; per box, a running kernel whose RDMA registers memory (kexec handover off). A
twin's rate, MTU and GID entry are read and judged as the deploy and the collector do
(spark/twin.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from operations import kernel, nmcli, roce
from spark import twin

if TYPE_CHECKING:
    from spark.inventory import FabricLink
    from tests.compliance.conftest import Box

FIELDS = (
    "connection.type",
    "connection.interface-name",
    "connection.autoconnect",
    "ipv4.addresses",
    "802-3-ethernet.mtu",
    "GENERAL.STATE",
    "GENERAL.DEVICES",
)


def profile_name(link: FabricLink) -> str:
    return f"fabric-{link.ifname}"  # as deploy.py names it


def _profile(box: Box, link: FabricLink) -> dict[str, str]:
    """The profile's fields in nmcli's terse text; {} when there is no such profile."""
    result = box.run(f"nmcli -t -f {','.join(FIELDS)} connection show id {profile_name(link)}")
    if result.rc != 0:
        return {}
    return dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)


def _sys(box: Box, link: FabricLink, attribute: str) -> str:
    result = box.run(f"cat /sys/class/net/{link.ifname}/{attribute}")
    return result.stdout.strip() if result.rc == 0 else "no such interface"


def _read(box: Box, path: str) -> str | None:
    result = box.run(f"cat {path}")
    return result.stdout if result.rc == 0 else None


def test_profile_active(box: Box, link: FabricLink, found: Callable[[object], None]) -> None:
    """fabric profile {ifname} active"""
    profile = _profile(box, link)
    if not profile:
        state = f"no profile {profile_name(link)}"
    else:
        state = (
            f"{profile['connection.type']} on {profile['connection.interface-name'] or '(any)'},"
            f" {profile.get('GENERAL.STATE') or 'inactive'} on"
            f" {profile.get('GENERAL.DEVICES') or '(none)'}"
        )
    want = f"802-3-ethernet on {link.ifname}, activated on {link.ifname}"
    found(state)
    assert state == want, f"expected profile {profile_name(link)}: {want}, found {state}"


def test_address(box: Box, link: FabricLink, found: Callable[[object], None]) -> None:
    """fabric address {ifname}"""
    profile = _profile(box, link).get("ipv4.addresses", "no profile")
    live = box.run(f"ip -4 -o address show dev {link.ifname}").stdout.split()
    on_link = [live[i + 1] for i, word in enumerate(live[:-1]) if word == "inet"]
    want = str(link.address)
    state = f"profile {profile}, link {' '.join(on_link) or 'none'}"
    found(state)
    assert profile == want and on_link == [want], (
        f"expected {want} in the profile and alone on {link.ifname}, found {state}"
    )


def test_autoconnect(box: Box, link: FabricLink, found: Callable[[object], None]) -> None:
    """fabric autoconnect {ifname}"""
    autoconnect = _profile(box, link).get("connection.autoconnect", "no profile")
    found(autoconnect)
    assert autoconnect == "yes", f"expected autoconnect yes, found {autoconnect}"


def test_mtu(box: Box, link: FabricLink, found: Callable[[object], None]) -> None:
    """fabric MTU {ifname}"""
    assert box.plan.fabric is not None  # the twins' checks are made for a box with a fabric
    mtu = str(box.plan.fabric.mtu)
    live = twin.mtu(_read(box, twin.mtu_file(link.ifname)))
    shown = "no such interface" if live == twin.NO_MTU else str(live)
    profile = _profile(box, link).get("802-3-ethernet.mtu", "no profile")
    state = f"link {shown}, profile {profile}"
    found(state)
    assert (shown, profile) == (mtu, mtu), f"expected MTU {mtu} on link and profile, found {state}"


def test_link_rate(
    box: Box, link: FabricLink, found: Callable[[object], None], note: Callable[[str], None]
) -> None:
    """fabric link rate {ifname}"""
    assert box.plan.fabric is not None
    expected, low = box.plan.fabric.link_speed_mbps, box.plan.fabric.link_speed_low
    rate = twin.rate(_read(box, twin.rate_file(link.ifname)))
    found("no link" if rate == twin.NO_RATE else f"{rate} Mb/s")
    assert rate != twin.NO_RATE, f"expected {link.ifname} to link at {expected} Mb/s, found no link"
    if twin.rate_below(rate, expected) and twin.rate_severity(low) == "warning":
        note(f"{rate} Mb/s, below {expected}: accepted (fabric_link_speed_low = 'warn')")
        return
    assert not twin.rate_below(rate, expected), (
        f"expected {link.ifname} to link at {expected} Mb/s or more, found {rate}"
        " (fabric_link_speed_low = 'warn' accepts a slower twin)"
    )


def test_link_up(box: Box, link: FabricLink, found: Callable[[object], None]) -> None:
    """fabric link up {ifname}"""
    state = _sys(box, link, "operstate")
    found(state)
    assert state == "up", f"expected {link.ifname} up (carrier), found {state}"


def test_netplan_leaves_it(box: Box, link: FabricLink, found: Callable[[object], None]) -> None:
    """netplan leaves {ifname} to NetworkManager"""
    # The deploy's own fact: netplan files naming the twin, but NetworkManager's 90-NM-* mirrors.
    fact = nmcli.ForeignNetplanFiles()
    files = fact.process(box.run(fact.command(link.ifname)).stdout.splitlines())
    found(", ".join(files) or "none")
    assert not files, (
        f"expected no netplan file but NetworkManager's naming {link.ifname} (netplan would make"
        f" it a profile of its own at boot), found {', '.join(files)}"
    )


def test_roce_v2_entry(
    box: Box, link: FabricLink, found: Callable[[object], None], note: Callable[[str], None]
) -> None:
    """RoCE v2 IPv4 GID {hca}"""
    # The deploy's own fact: every entry of every RDMA device (roce.GidTables).
    tables = roce.GidTables()
    entries = tables.process(box.run(tables.command()).stdout.splitlines()).get(link.hca, [])
    ipv4 = twin.roce_v2_ipv4(entries, link.ifname)
    state = "; ".join(f"{index}: RoCE v2 {ip} on {link.ifname}" for index, ip in ipv4.items())
    found(state or f"no RoCE v2 IPv4 entry on {link.ifname}")
    assert box.plan.fabric is not None
    expected = box.plan.fabric.gid_index
    if list(ipv4) != [expected]:
        note(f"at {', '.join(map(str, ipv4))}, not {expected}: NCCL selects it")
    # NCCL takes the one IPv4 RoCE v2 entry of each device (spark/twin.py): it must be this twin's.
    assert list(ipv4.values()) == [str(link.address.ip)], (
        f"expected one RoCE v2 IPv4 entry on {link.ifname} ({link.hca}), of {link.address.ip};"
        f" found {state or 'none'}"
    )


def test_kernel_handover_off(box: Box, found: Callable[[object], None]) -> None:
    """kernel: kexec handover off (RDMA)"""
    plan = box.plan.kernel
    if plan.kho_fix is None:
        pytest.skip("no fabric on this box")
    fact = kernel.RunningKernel()
    running = fact.process(box.run(fact.command()).stdout.splitlines())
    on = kernel.handover_on(running, plan.kho_default_from)
    found(f"{running['release']} without {plan.boot_option}" if on else running["release"])
    assert not on, (
        f"expected a kernel with kexec handover off (RDMA memory registration fails with it:"
        f" NVIDIA/NV-Kernels PRs 590, 591), found {running['release']} booted without"
        f" {plan.boot_option}: {'reboot' if plan.kho_fix == 'grub' else 'add it and reboot'}"
    )

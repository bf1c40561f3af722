"""NmConnections, ForeignNetplanFiles, nmcli.ethernet and nmcli.netplan_left_out.

The lab-nmcli-*.txt captures are real: NmConnections().command() run with sudo on the lab host
spark-2 (Debian 12, NetworkManager 1.42.4), with a profile "fabric-enP2p1s0f1np1" on
enP2p1s0f1np1 put into each state by hand with nmcli. After each capture the commands
ethernet() yields for it were run there, and the fact read afterwards made it yield nothing.
  lab-nmcli-fresh.txt
      bare host: NM's automatic "Wired connection 1/2" (DHCP, activating),
      lo, docker0 (bridge), management
  lab-nmcli-auto-profile-left.txt
      ours added and active; "Wired connection 1" still bound, inactive
  lab-nmcli-exact.txt
      ours right and active, nothing else on the interface
  lab-nmcli-mtu-1500.txt
      ... with 802-3-ethernet.mtu 1500
  lab-nmcli-address-changed.txt
      ... with ipv4.addresses 192.168.101.99/24
  lab-nmcli-autoconnect-off.txt
      ... with connection.autoconnect no
  lab-nmcli-inactive.txt
      ... after `nmcli connection down`
  lab-nmcli-stray-second.txt
      ... plus "fabric-old" on the same interface (it also holds an
      empty block: a profile that went away between list and show)
  lab-nmcli-colon-name.txt
      ours renamed to 'fabric:2 \\ back'

lab-live-link-*.txt are real: LiveLink().command("enP2p1s0f1np1") run with sudo on the lab host
spark-2 with the profile above right and active at 192.168.101.12/24 (exact), then after `ip link
set dev enP2p1s0f1np1 mtu 1500` (mtu-1500), after `ip address del 192.168.101.12/24` (address-
removed), after `ip address add 192.168.101.99/24` (address-added), after `ip link set dev
enP2p1s0f1np1 down` (down: NetworkManager 1.42 still showed the profile "activated" on it), each
put back with `nmcli connection up` (the link read up, 9000 and 192.168.101.12/24 alone after
each), and for enp9s9, which the host lacks (absent).

lab-netplan-files-enP2p1s0f1np1.txt is real: ForeignNetplanFiles().command("enP2p1s0f1np1") run
with sudo on the lab host spark-2 (netplan.io 0.106, python3-yaml) with three files in
/etc/netplan: NVIDIA's 40-cx7.yaml (node 2's), a 50-cloud-init.yaml configuring enP7s7 and a
definition "fabric0" matching enP2p1s0f1np1 by name, and a 60-broken.yaml that is no YAML.

public-netplan-40-cx7-node1.yaml is real: the /etc/netplan/40-cx7.yaml NVIDIA's two-Spark guide
has owners write on node 1 (NVIDIA/dgx-spark-playbooks nvidia/connect-two-sparks/README.md,
Step 3, Option 1, commit a6da172), the heredoc's text as it is.
"""

from __future__ import annotations

import inspect
import re
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.arguments import all_global_arguments

from operations import nmcli
from spark.inventory import load_from_dicts
from spark.plan import plan
from tests.unit.harness import FakeHost, captured, needs, process, refusal, run_op
from tests.unit.test_config import TWO_SPARKS, merged, refusals

NAME = "fabric-enP2p1s0f1np1"
IFNAME = "enP2p1s0f1np1"
ADDRESS = "192.168.101.12/24"
OURS = "c6c173cc-28ba-4f4b-ab93-5ff0ee686b7a"
WIRED_1 = "638a5dca-d571-3647-a0b3-dfe34633fe05"


def delete(uuid: str) -> str:
    """A stray's removal; one NetworkManager already dropped itself is not an error."""
    return (
        f"nmcli connection delete uuid {uuid}"
        f" || ! nmcli -g connection.uuid connection show uuid {uuid}"
    )


def host_for(capture: str, live: str = "lab-live-link-exact.txt") -> FakeHost:
    return FakeHost({nmcli.NmConnections: captured(capture), nmcli.LiveLink: captured(live)})


def ethernet(
    capture: str, live: str = "lab-live-link-exact.txt", **kwargs
) -> tuple[list[str], list[str]]:
    host = host_for(capture, live)
    arguments = {"con_name": NAME, "ifname": IFNAME, "address": ADDRESS, "mtu": 9000, **kwargs}
    return run_op(nmcli.ethernet, host=host, **arguments), host.noops


# --- NmConnections ----------------------------------------------------------------------------


def test_fact_reads_every_profile_with_its_fields() -> None:
    profiles = process(nmcli.NmConnections, captured("lab-nmcli-fresh.txt"))
    assert sorted(p["connection.id"] for p in profiles.values()) == [
        "Wired connection 1",
        "Wired connection 2",
        "docker0",
        "lo",
        "management",
    ]
    assert profiles[WIRED_1] == {
        "connection.id": "Wired connection 1",
        "connection.uuid": WIRED_1,
        "connection.type": "802-3-ethernet",
        "connection.interface-name": IFNAME,
        "connection.autoconnect": "yes",
        "ipv4.method": "auto",
        "ipv4.addresses": "",
        "ipv4.gateway": "",
        "ipv6.method": "auto",
        "802-3-ethernet.mtu": "auto",
        "GENERAL.DEVICES": IFNAME,
        "GENERAL.STATE": "activating",
    }


def test_fact_inactive_profile_has_no_general_fields() -> None:
    profiles = process(nmcli.NmConnections, captured("lab-nmcli-auto-profile-left.txt"))
    assert "GENERAL.STATE" not in profiles[WIRED_1]
    assert profiles[OURS]["GENERAL.STATE"] == "activated"


def test_fact_keeps_colons_and_backslashes_in_values() -> None:
    # `connection show <uuid>` does not escape them (only -g, the tabular mode, does: nmcli -g
    # connection.id printed 'fabric\:2 \\ back' for the same profile).
    profiles = process(nmcli.NmConnections, captured("lab-nmcli-colon-name.txt"))
    assert profiles[OURS]["connection.id"] == "fabric:2 \\ back"
    assert profiles[OURS]["ipv4.addresses"] == ADDRESS


def test_fact_skips_a_profile_that_vanished_between_list_and_show() -> None:
    profiles = process(nmcli.NmConnections, captured("lab-nmcli-stray-second.txt"))
    assert all(uuid for uuid in profiles)
    assert len(profiles) == captured("lab-nmcli-stray-second.txt").count("connection.uuid:")


def test_fact_without_networkmanager_is_empty() -> None:
    assert process(nmcli.NmConnections, "") == {}
    assert nmcli.NmConnections().default() == {}


# --- ForeignNetplanFiles -----------------------------------------------------------------------

TWINS = ["enp1s0f1np1", "enP2p1s0f1np1"]
CX7 = "/etc/netplan/40-cx7.yaml"
# The fact reads netplan's YAML with the box's python3 and python3-yaml (netplan's own); where
# this machine's python3 has no yaml, the commands' runs here are skipped, and fail where every
# test must run (`make test` installs python3-yaml first: tests/simlab/rootfs.py HOST_MODULES).
YAML_HERE = subprocess.run(["python3", "-c", "import yaml"], capture_output=True).returncode == 0


@pytest.fixture
def python3_yaml() -> None:
    needs([] if YAML_HERE else ["python3's yaml (python3-yaml)"])


needs_yaml = pytest.mark.usefixtures("python3_yaml")


def foreign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ifname: str) -> dict:
    """The fact's command run by sh on tmp_path's etc/ and run/ in place of netplan's dirs."""
    monkeypatch.setattr(nmcli, "NETPLAN_DIRS", (str(tmp_path / "etc"), str(tmp_path / "run")))
    command = nmcli.ForeignNetplanFiles().command(ifname)
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert result.stderr == ""
    return process(nmcli.ForeignNetplanFiles, result.stdout)


def nvidias_cx7(tmp_path: Path) -> Path:
    """NVIDIA's node 1 file at tmp_path/etc/40-cx7.yaml, as the guide has owners write it."""
    (tmp_path / "etc").mkdir()
    cx7 = tmp_path / "etc/40-cx7.yaml"
    cx7.write_text(captured("public-netplan-40-cx7-node1.yaml"))
    return cx7


@needs_yaml
def test_netplan_fact_command_finds_only_foreign_files_naming_the_interface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "50-cloud-init.yaml").write_text(f"network:\n  ethernets:\n    {IFNAME}:\n")
    (etc / f"90-NM-{OURS}.yaml").write_text(f"network:\n  ethernets:\n    {IFNAME}:\n")
    (etc / "60-other.yaml").write_text(f"network:\n  ethernets:\n    {IFNAME}0:\n")
    (etc / "70-not-yaml.yml").write_text(f"{IFNAME}\n")
    assert foreign(tmp_path, monkeypatch, IFNAME) == {  # run/ does not exist
        f"{etc}/50-cloud-init.yaml": [("ethernets", IFNAME, "-")]
    }


@needs_yaml
def test_netplan_fact_reads_nvidias_40_cx7_for_each_twin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cx7 = nvidias_cx7(tmp_path)
    definitions = [("ethernets", "enp1s0f1np1", "-"), ("ethernets", "enP2p1s0f1np1", "-")]
    for twin in TWINS:
        assert foreign(tmp_path, monkeypatch, twin) == {str(cx7): definitions}
    assert foreign(tmp_path, monkeypatch, "enp1s0f0np0") == {}  # port 0's twins are not in it


@needs_yaml
def test_netplan_fact_reads_every_definition_matches_and_what_is_no_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # As cloud-init writes one (its management NIC), a twin added; a twin matched by name.
    (run / "50-cloud-init.yaml").write_text(
        "network:\n  version: 2\n  renderer: NetworkManager\n  ethernets:\n"
        "    enP7s7:\n      dhcp4: true\n"
        f"    fabric0:\n      match:\n        name: {IFNAME}\n      mtu: 9000\n"
        f"  vlans:\n    vlan10:\n      id: 10\n      link: {IFNAME}\n"
    )
    (run / "60-broken.yaml").write_text(f"network: [{IFNAME}\n")
    assert foreign(tmp_path, monkeypatch, IFNAME) == {
        f"{run}/50-cloud-init.yaml": [
            ("ethernets", "enP7s7", "-"),
            ("ethernets", "fabric0", IFNAME),
            ("vlans", "vlan10", "-"),
        ],
        f"{run}/60-broken.yaml": [("unreadable", "ParserError", "-")],
    }


def test_netplan_fact_without_netplan_or_python3_yaml() -> None:
    assert process(nmcli.ForeignNetplanFiles, "") == {}
    # What the command prints for a file where python3 has no yaml module, or no python3 is.
    assert process(
        nmcli.ForeignNetplanFiles,
        f"{CX7}\tunreadable\tno python3-yaml\t-\n/run/netplan/a.yaml\tunreadable\tno python3\t-\n",
    ) == {
        CX7: [("unreadable", "no python3-yaml", "-")],
        "/run/netplan/a.yaml": [("unreadable", "no python3", "-")],
    }


def test_netplan_fact_parses_the_lab_capture() -> None:
    assert process(nmcli.ForeignNetplanFiles, captured("lab-netplan-files-enP2p1s0f1np1.txt")) == {
        CX7: [("ethernets", "enp1s0f1np1", "-"), ("ethernets", "enP2p1s0f1np1", "-")],
        "/etc/netplan/50-cloud-init.yaml": [
            ("ethernets", "enP7s7", "-"),
            ("ethernets", "fabric0", "enP2p1s0f1np1"),
        ],
        "/etc/netplan/60-broken.yaml": [("unreadable", "ParserError", "-")],
    }


# --- netplan_left_out -------------------------------------------------------------------------

BOTH = f"{CX7}\tethernets\tenp1s0f1np1\t-\n{CX7}\tethernets\tenP2p1s0f1np1\t-\n"


def left_out(take_over: bool, files: dict[str, str]) -> tuple[list[str], list[str]]:
    """What netplan_left_out yields for the twins, the fact answering `files[twin]` for each."""
    host = FakeHost(
        {(nmcli.ForeignNetplanFiles, (("ifname", twin),)): files.get(twin, "") for twin in TWINS}
    )
    return run_op(nmcli.netplan_left_out, host=host, ifnames=TWINS, take_over=take_over), host.noops


def test_no_foreign_netplan_file_yields_nothing() -> None:
    assert left_out(take_over=True, files={}) == (
        [],
        ["no netplan file but NetworkManager's configures enp1s0f1np1, enP2p1s0f1np1"],
    )


def test_foreign_netplan_file_is_refused_naming_the_option() -> None:
    commands, _ = left_out(take_over=False, files={"enP2p1s0f1np1": BOTH})
    assert re.search(
        f"spark-test: {CX7} configure.s. enp1s0f1np1, enP2p1s0f1np1 outside NetworkManager"
        ".* set fabric_take_over_netplan = True .*remove the twins from them",
        refusal(commands),
    )


def test_take_over_moves_each_file_aside_once_and_regenerates() -> None:
    # 40-cx7.yaml names both twins: asked for each, moved once; a definition matching a twin
    # by name is the twin's.
    matched = "/run/netplan/50-fabric.yaml\tethernets\tfabric0\tenp1s0f1np1\n"
    commands, noops = left_out(take_over=True, files={TWINS[0]: BOTH + matched, TWINS[1]: BOTH})
    assert commands == [
        f"mv -- {CX7} {CX7}.moved-aside-by-spark-$(date -u +%Y%m%dT%H%M%SZ)",
        "mv -- /run/netplan/50-fabric.yaml"
        " /run/netplan/50-fabric.yaml.moved-aside-by-spark-$(date -u +%Y%m%dT%H%M%SZ)",
        "! command -v netplan >/dev/null || netplan generate",
        "nmcli connection reload",
    ]
    assert noops == []


def test_a_file_that_configures_more_than_twins_or_is_unread_is_not_moved() -> None:
    cloud = "/etc/netplan/50-cloud-init.yaml"
    mixed = f"{cloud}\tethernets\tenP7s7\t-\n{cloud}\tethernets\tenp1s0f1np1\t-\n"
    unread = f"{CX7}\tunreadable\tno python3-yaml\t-\n"
    commands, _ = left_out(take_over=True, files={TWINS[0]: mixed, TWINS[1]: unread})
    assert refusal(commands) == (
        "spark-test: fabric_take_over_netplan moves aside only netplan files that configure"
        " fabric twins alone, and these configure more or could not be read"
        f" ({CX7}: unreadable (no python3-yaml); {cloud}: enP7s7): take enp1s0f1np1,"
        " enP2p1s0f1np1 out of them by hand, then run again."
    )


@needs_yaml
def test_the_file_moved_aside_is_dated_and_no_longer_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cx7 = nvidias_cx7(tmp_path)
    found = {twin: foreign(tmp_path, monkeypatch, twin) for twin in TWINS}
    files = {
        twin: "".join(
            "\t".join((path, *row)) + "\n" for path, rows in by_path.items() for row in rows
        )
        for twin, by_path in found.items()
    }
    commands, _ = left_out(take_over=True, files=files)
    subprocess.run(["sh", "-c", commands[0]], check=True)
    assert not cx7.exists()
    (moved,) = cx7.parent.iterdir()
    assert re.fullmatch(r"40-cx7\.yaml\.moved-aside-by-spark-\d{8}T\d{6}Z", moved.name)
    assert moved.read_text() == captured("public-netplan-40-cx7-node1.yaml")
    # netplan reads only *.yaml: the fact, which reads what netplan reads, finds none left.
    assert [foreign(tmp_path, monkeypatch, twin) for twin in TWINS] == [{}, {}]


# --- ethernet ----------------------------------------------------------------------------------


def test_arguments_are_not_taken_by_pyinfra() -> None:
    # pyinfra pops its global arguments (`name`, `_sudo`, ...) before calling the operation.
    taken = {argument for argument, _ in all_global_arguments()}
    assert not taken & set(inspect.signature(nmcli.ethernet._inner).parameters)


def test_fresh_host_adds_activates_and_removes_the_automatic_profile() -> None:
    commands, noops = ethernet("lab-nmcli-fresh.txt")
    assert commands == [
        f"nmcli connection add type ethernet con-name {NAME} connection.interface-name {IFNAME} "
        "connection.autoconnect yes ipv4.method manual ipv4.addresses 192.168.101.12/24 "
        "ipv4.gateway '' ipv6.method disabled 802-3-ethernet.mtu 9000",
        f"nmcli connection up id {NAME}",
        delete(WIRED_1),  # not Wired connection 2: other interface
    ]
    assert noops == []


def test_right_profile_yields_nothing() -> None:
    commands, noops = ethernet("lab-nmcli-exact.txt")
    assert commands == []
    assert noops == [f"profile {NAME} is up to date and active on {IFNAME}, as is the link"]


def test_the_live_link_reads_its_mtu_and_addresses() -> None:
    # flags 0x1003: IFF_UP (0x1) among them (linux/if.h); 0x1002 after `ip link set down`.
    assert process(nmcli.LiveLink, captured("lab-live-link-exact.txt")) == {
        "up": True,
        "mtu": 9000,
        "addresses": ["192.168.101.12/24"],
    }
    assert process(nmcli.LiveLink, captured("lab-live-link-mtu-1500.txt")) == {
        "up": True,
        "mtu": 1500,
        "addresses": ["192.168.101.12/24"],
    }
    assert process(nmcli.LiveLink, captured("lab-live-link-address-removed.txt")) == {
        "up": True,
        "mtu": 9000,
        "addresses": [],
    }
    assert process(nmcli.LiveLink, captured("lab-live-link-address-added.txt")) == {
        "up": True,
        "mtu": 9000,
        "addresses": ["192.168.101.12/24", "192.168.101.99/24"],
    }
    assert process(nmcli.LiveLink, captured("lab-live-link-down.txt")) == {
        "up": False,
        "mtu": 9000,
        "addresses": ["192.168.101.12/24"],
    }
    assert process(nmcli.LiveLink, captured("lab-live-link-absent.txt")) is None


@pytest.mark.parametrize(
    "live",
    [
        "lab-live-link-mtu-1500.txt",  # `ip link set dev enP2p1s0f1np1 mtu 1500` (issue 37)
        "lab-live-link-address-removed.txt",
        "lab-live-link-address-added.txt",
        "lab-live-link-down.txt",  # its profile still "activated": only the link tells
    ],
)
def test_a_live_link_changed_by_hand_gets_its_profile_applied_again(live: str) -> None:
    """The profile says what it should; the link does not: activating it again applies it (on
    the lab each of these read right after `nmcli connection up`)."""
    commands, noops = ethernet("lab-nmcli-exact.txt", live)
    assert commands == [f"nmcli connection up uuid {OURS}"]
    assert noops == []


def test_the_live_link_is_read_only_where_the_profile_is_right_and_up() -> None:
    """Where the profile changes or comes up anyway, the link is not asked (the host here
    answers no LiveLink: asking it would fail the test)."""
    for capture, commands in (
        ("lab-nmcli-mtu-1500.txt", [
            f"nmcli connection modify uuid {OURS} 802-3-ethernet.mtu 9000",
            f"nmcli connection up uuid {OURS}",
        ]),
        ("lab-nmcli-inactive.txt", [f"nmcli connection up uuid {OURS}"]),
    ):  # fmt: skip
        host = FakeHost({nmcli.NmConnections: captured(capture)})
        arguments = {"con_name": NAME, "ifname": IFNAME, "address": ADDRESS, "mtu": 9000}
        assert run_op(nmcli.ethernet, host=host, **arguments) == commands


def test_name_with_colon_and_backslash_matches() -> None:
    commands, _ = ethernet("lab-nmcli-colon-name.txt", con_name="fabric:2 \\ back")
    assert commands == []


@pytest.mark.parametrize(
    ("capture", "change"),
    [
        ("lab-nmcli-mtu-1500.txt", "802-3-ethernet.mtu 9000"),
        ("lab-nmcli-address-changed.txt", "ipv4.addresses 192.168.101.12/24"),
        ("lab-nmcli-autoconnect-off.txt", "connection.autoconnect yes"),
    ],
)
def test_drift_modifies_only_the_differing_field_and_reactivates(capture: str, change: str) -> None:
    commands, noops = ethernet(capture)
    assert commands == [
        f"nmcli connection modify uuid {OURS} {change}",
        f"nmcli connection up uuid {OURS}",
    ]
    assert noops == []


@pytest.mark.parametrize(
    ("arguments", "change"),
    [
        ({"mtu": 1500}, "802-3-ethernet.mtu 1500"),
        ({"autoconnect": False}, "connection.autoconnect no"),
        ({"ipv6_method": "link-local"}, "ipv6.method link-local"),
        ({"address": "192.168.101.13/25"}, "ipv4.addresses 192.168.101.13/25"),
        ({"ifname": "enp1s0f1np1"}, "connection.interface-name enp1s0f1np1"),
    ],
)
def test_arguments_drive_the_modification(arguments: dict, change: str) -> None:
    commands, _ = ethernet("lab-nmcli-exact.txt", **arguments)
    assert commands[0] == f"nmcli connection modify uuid {OURS} {change}"


def test_several_changes_go_into_one_modify() -> None:
    commands, _ = ethernet("lab-nmcli-mtu-1500.txt", autoconnect=False)
    assert commands[0] == (
        f"nmcli connection modify uuid {OURS} connection.autoconnect no 802-3-ethernet.mtu 9000"
    )


def test_inactive_profile_is_only_activated() -> None:
    commands, _ = ethernet("lab-nmcli-inactive.txt")
    assert commands == [f"nmcli connection up uuid {OURS}"]


def test_leftover_automatic_profile_is_deleted() -> None:
    commands, _ = ethernet("lab-nmcli-auto-profile-left.txt")
    assert commands == [delete(WIRED_1)]


def test_second_profile_on_the_interface_is_deleted() -> None:
    commands, _ = ethernet("lab-nmcli-stray-second.txt")
    assert commands == [delete("92a92b4d-1c2d-4116-b392-09ba39fe6780")]


def test_profile_active_on_the_interface_without_naming_it_is_a_stray() -> None:
    profile = {"connection.interface-name": "", "GENERAL.DEVICES": f"eth9,{IFNAME}"}
    assert nmcli._bound_to(profile, IFNAME)
    assert not nmcli._bound_to(profile, "enp1s0f1np1")


def test_profile_name_of_another_type_is_refused() -> None:
    assert re.search(
        "'docker0' is of type bridge, not ethernet",
        refusal(ethernet("lab-nmcli-fresh.txt", con_name="docker0")[0]),
    )


def test_two_profiles_with_the_name_are_refused() -> None:
    # Built from a capture: the exact state plus a copy of our block under another UUID.
    text = captured("lab-nmcli-exact.txt")
    block = text[text.index(f"connection.id:{NAME}") :].split("\n--\n")[0]
    duplicate = block.replace(OURS, "00000000-0000-4000-8000-000000000001")
    host = FakeHost({nmcli.NmConnections: f"{text}--\n{duplicate}\n"})
    assert re.search(
        f"several NetworkManager profiles are named '{NAME}'",
        refusal(
            run_op(
                nmcli.ethernet, host=host, con_name=NAME, ifname=IFNAME, address=ADDRESS, mtu=9000
            )
        ),
    )


# --- fabric_take_over_netplan: validated, off by default, carried by the fabric's plan ------------


def test_take_over_is_off_by_default_and_the_plan_carries_it() -> None:
    boxes = plan(load_from_dicts(merged(TWO_SPARKS))).boxes
    assert {box.fabric.take_over_netplan for box in boxes if box.fabric} == {False}
    hosts = {name: data | {"fabric_take_over_netplan": True} for name, data in TWO_SPARKS.items()}
    boxes = plan(load_from_dicts(merged(hosts))).boxes
    assert [box.fabric.take_over_netplan for box in boxes if box.fabric] == [True, True]


def test_take_over_is_a_bool() -> None:
    (problem,) = refusals(fabric_take_over_netplan="yes")
    assert problem.startswith("spark-1: fabric_take_over_netplan: Input should be a valid boolean")

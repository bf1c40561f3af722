"""The lab itself: what it promises the end-to-end tests, checked on booted hosts."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import reimage_all, run_on
from tests.simlab import lab as simlab
from tests.simlab.waits import until

pytestmark = pytest.mark.lab


def configure_twin(host: simlab.Host, twin: str, address: str, mtu: int = 9000) -> None:
    run_on(host, f"sudo nmcli connection add type ethernet ifname {twin} con-name lab-{twin} "
                 f"ipv4.method manual ipv4.addresses {address} 802-3-ethernet.mtu {mtu} "
                 f"ipv6.method disabled && sudo nmcli connection up lab-{twin}")  # fmt: skip


def remove_twin(host: simlab.Host, twin: str) -> None:
    run_on(host, f"sudo nmcli connection delete lab-{twin}", check=False)


def gid(host: simlab.Host, hca: str, index: int) -> tuple[str, str]:
    port = f"/sys/class/infiniband/{hca}/ports/1"
    out = run_on(host, f"cat {port}/gids/{index} {port}/gid_attrs/types/{index} 2>/dev/null",
                 check=False)  # fmt: skip
    lines = [*out.splitlines(), ""]
    return lines[0], lines[1]


@pytest.fixture(scope="module", autouse=True)
def bare(lab: simlab.Lab) -> simlab.Lab:
    """Other modules deploy to the session's lab: these tests start from the bare image."""
    return reimage_all(lab)


def test_hosts_are_bare_sparks(lab: simlab.Lab) -> None:
    for host in lab.hosts:
        assert run_on(host, "hostname").strip() == host.name
        assert (
            run_on(host, "systemctl is-active NetworkManager docker ssh").split() == ["active"] * 3
        )
        assert run_on(host, "dpkg-query -W 'nvidia*' 2>/dev/null || true").strip() == ""
        assert run_on(host, "apt-mark showhold").strip() == ""
        # Root cannot log in over SSH; the admin can, with the lab's key only.
        root = subprocess.run(
            ["ssh", "-F", str(simlab.STATE / "ssh_config"), "-o", "BatchMode=yes",
             "-l", "root", host.name, "true"], capture_output=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert root.returncode != 0


def test_each_host_boots_in_a_cgroup_of_its_own_with_no_unit_failed() -> None:
    """Hosts sharing one cgroup tree raced over their units' cgroups (lab.JOIN_CGROUPS)."""
    for host in simlab.Lab.load().hosts:  # as reimaged: new containers
        init = simlab._children(host.pid)[0]
        tree = Path(f"/proc/{init}/cgroup").read_text()
        assert f"0::/{simlab.PREFIX}-{host.name}/payload/" in tree, (host.name, tree)
        assert run_on(host, "systemctl --failed --plain --no-legend") == "", host.name


def test_jumbo_frames_cross_a_fabric_link_at_mtu_9000(lab: simlab.Lab) -> None:
    a, b = lab.hosts
    twin = simlab.FABRIC_TWINS[0][0]
    try:
        configure_twin(a, twin, "192.168.100.10/24")
        configure_twin(b, twin, "192.168.100.11/24")
        assert run_on(a, f"cat /sys/class/net/{twin}/mtu").strip() == "9000"
        ping = run_on(a, "ping -c 1 -W 3 -M do -s 8972 192.168.100.11", check=False)
        assert "1 received" in ping, ping
        # A frame larger than the MTU is refused, so the test above measured the real path.
        too_big = run_on(a, "ping -c 1 -W 1 -M do -s 8973 192.168.100.11 2>&1", check=False)
        assert "1 received" not in too_big
    finally:
        remove_twin(a, twin)
        remove_twin(b, twin)


def test_a_twins_link_rate_reads_as_set_while_it_has_carrier(lab: simlab.Lab) -> None:
    host = lab.hosts[0]
    twin = simlab.FABRIC_TWINS[0][0]
    speed = f"cat /sys/class/net/{twin}/speed 2>&1"
    assert run_on(host, speed).strip() == "200000"  # a Spark's, the lab's default
    try:
        simlab.set_hardware(host, link_speeds={twin: 100000})
        until(lambda: run_on(host, speed).strip() == "100000", 10, f"{host.name}: rate 100000")
        run_on(host, f"sudo ip link set {twin} down")  # no carrier: no rate, as on an mlx5 twin
        until(lambda: run_on(host, speed).strip() == "-1", 10, f"{host.name}: rate -1")
    finally:
        run_on(host, f"sudo ip link set {twin} up")
        simlab.set_hardware(host, link_speeds={})
    assert run_on(host, speed).strip() == "200000"


def test_a_device_can_lack_the_roce_v2_entry_of_its_address(lab: simlab.Lab) -> None:
    host = lab.hosts[0]
    twin, hca = simlab.FABRIC_TWINS[1]
    mapped = "0000:0000:0000:0000:0000:ffff:c0a8:650a"  # ::ffff:192.168.101.10
    try:
        simlab.set_hardware(host, no_ipv4_roce_v2=[hca])
        configure_twin(host, twin, "192.168.101.10/24")
        until(lambda: gid(host, hca, 2) == (mapped, "IB/RoCE v1"), 10, f"{hca}: GID 2")
        assert gid(host, hca, 3) == ("0000:0000:0000:0000:0000:0000:0000:0000", "")
    finally:
        remove_twin(host, twin)
        simlab.set_hardware(host, no_ipv4_roce_v2=[])


def test_gid_table_follows_the_interface_address(lab: simlab.Lab) -> None:
    host = lab.hosts[0]
    twin, hca = simlab.FABRIC_TWINS[1]
    try:
        configure_twin(host, twin, "192.168.101.10/24")
        mapped = "0000:0000:0000:0000:0000:ffff:c0a8:650a"  # ::ffff:192.168.101.10
        until(lambda: gid(host, hca, 3) == (mapped, "RoCE v2"), 10, f"{hca}: GID 3")
        assert gid(host, hca, 2) == (mapped, "IB/RoCE v1")
        assert gid(host, hca, 1)[1] == "RoCE v2" and gid(host, hca, 1)[0].startswith("fe80:")
        run_on(host, f"sudo nmcli connection modify lab-{twin} ipv4.addresses 192.168.101.20/24 "
                     f"&& sudo nmcli connection up lab-{twin}")  # fmt: skip
        moved = "0000:0000:0000:0000:0000:ffff:c0a8:6514"  # ::ffff:192.168.101.20
        until(lambda: gid(host, hca, 3) == (moved, "RoCE v2"), 10, f"{hca}: GID 3 moved")
    finally:
        remove_twin(host, twin)
    until(lambda: gid(host, hca, 3)[0] == "0000:0000:0000:0000:0000:0000:0000:0000", 10,
          f"{hca}: GID 3 cleared")  # fmt: skip


def test_stand_in_driver_installs_and_the_metapackage_would_move_the_branch(lab) -> None:
    host = lab.hosts[1]
    run_on(host, "sudo apt-get update -qq")
    plan = run_on(host, "apt-get install -s nvidia-driver-open")
    assert "Inst nvidia-driver-590-open" in plan
    apt = "sudo DEBIAN_FRONTEND=noninteractive apt-get -y -qq"
    run_on(host, f"{apt} install nvidia-driver-580-open")
    smi = run_on(
        host, "nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader"
    )
    assert smi.strip() == "NVIDIA GB10, 580.142, 12.1"
    run_on(host, f"{apt} purge nvidia-driver-580-open")


def install_toolkit(host: simlab.Host) -> None:
    """What the deploy does for the toolkit, by hand: the lab promises it works."""
    repo = f"{simlab.REPOS_MOUNT}/nvidia-container-toolkit"
    keyring = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
    run_on(host, f"sudo gpg --batch --yes --dearmor -o {keyring} {repo}/gpgkey && "
                 f"echo 'deb [signed-by={keyring}] file:{repo} /' | "
                 "sudo tee /etc/apt/sources.list.d/nvidia-container-toolkit.list && "
                 "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive "
                 "apt-get install -y -qq nvidia-container-toolkit && "
                 "sudo nvidia-ctk runtime configure --runtime=docker && "
                 "sudo systemctl restart docker")  # fmt: skip


def test_docker_starts_gpu_containers_through_the_toolkit(lab: simlab.Lab) -> None:
    host = lab.hosts[0]
    image = simlab.pull_image(host)
    install_toolkit(host)
    out = run_on(host, f"sudo docker run --rm --gpus all --runtime nvidia {image} "
                       "vllm --version")  # fmt: skip
    assert out.strip() == "0.19.0"


def test_two_hosts_form_a_ray_cluster_over_the_fabric(lab: simlab.Lab) -> None:
    head, worker = lab.hosts
    twin = simlab.FABRIC_TWINS[0][0]
    configure_twin(head, twin, "192.168.100.10/24")
    configure_twin(worker, twin, "192.168.100.11/24")
    run = "sudo docker run -d --rm --name ray --network host --shm-size 1g"
    try:
        for host in lab.hosts:
            simlab.pull_image(host)
        image = simlab.pull_image(head)
        run_on(head, f"{run} {image} ray start --block --head --port=6379 --num-gpus=1 "
                     "--node-ip-address=192.168.100.10 --include-dashboard=false")  # fmt: skip
        run_on(worker, f"{run} {image} ray start --block --address=192.168.100.10:6379 "
                       "--num-gpus=1 --node-ip-address=192.168.100.11")  # fmt: skip

        def nodes() -> int:
            status = run_on(head, "sudo docker exec ray ray status 2>/dev/null", check=False)
            active = status.split("Active:")[-1].split("Pending:")[0]
            return active.count("node_")

        until(lambda: nodes() == 2, 120, "both Ray nodes")
        status = run_on(head, "sudo docker exec ray ray status")
        assert "2.0 GPU" in status, status
    finally:
        for host in lab.hosts:
            run_on(host, "sudo docker rm -f ray", check=False)
            remove_twin(host, twin)


def test_reimage_gives_a_bare_disk_and_new_host_keys(lab: simlab.Lab) -> None:
    host = lab.hosts[1]
    run_on(host, "sudo touch /etc/left-by-a-deploy")
    twin = simlab.FABRIC_TWINS[0][0]
    configure_twin(host, twin, "192.168.100.11/24")
    before = (host.dir / "upper/etc/ssh/ssh_host_ed25519_key.pub").read_text()
    simlab.reimage(host.name)
    after = (host.dir / "upper/etc/ssh/ssh_host_ed25519_key.pub").read_text()
    assert before != after
    # The admin's known_hosts still holds the old key, so SSH refuses: as after a real reimage.
    stale = subprocess.run(
        ["ssh", "-F", str(simlab.STATE / "ssh_config"), "-o", "BatchMode=yes", host.name, "true"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert stale.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in stale.stderr
    simlab.write_ssh_files(lab)  # trust the new key, as the README's re-provisioning says
    simlab.wait_ready(host, time.monotonic() + simlab.BOOT_TIMEOUT)
    assert run_on(host, "test -e /etc/left-by-a-deploy && echo left || echo gone").strip() == "gone"
    # As after a reboot, the NIC carries nothing of the old system.
    assert run_on(host, f"cat /sys/class/net/{twin}/mtu").strip() == "1500"
    assert "192.168.100.11" not in run_on(host, f"ip -4 addr show {twin}")


def test_down_leaves_nothing_behind(lab: simlab.Lab) -> None:
    simlab.down()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{simlab.PREFIX}-" not in netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f" {simlab.PREFIX}m" not in links and f" {simlab.MGMT_BRIDGE}:" not in links
    with open("/proc/mounts") as mounts:  # .simlab100/ and .simlab200/ are other workers' labs
        assert f"{simlab.STATE}/" not in mounts.read()
    ours = f"systemd-nspawn -D {simlab.STATE / 'hosts'}/"  # other labs may run beside this one
    nspawn = subprocess.run(["pgrep", "-f", ours], capture_output=True, text=True)
    assert nspawn.stdout.strip() == ""
    # Later tests share the session's lab: boot it again, bare.
    lab.hosts[:] = simlab.up(2).hosts

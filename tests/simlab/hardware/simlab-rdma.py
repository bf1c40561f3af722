#!/usr/bin/python3
"""Simulated ConnectX-7 RoCE devices: a GID table per HCA that follows its netdev's addresses,
and the twins' link rates.

The kernel (ib_core) keeps /sys/class/infiniband/<hca>/ports/1/gids/N in step with the IP
addresses of the HCA's netdev: link-local at 0/1 (RoCE v1/v2), the IPv4-mapped address at 2/3.
This lab kernel has no RDMA, so this service overlays /sys/class and rewrites the table whenever
an address or a link changes (heard from `ip monitor`, as ib_core hears the kernel's netdevice
events). The layout comes from the lab's hardware file (bound in read-only), where
`ipv4_roce_v2_index: 4` reproduces a field failure: the IPv4 RoCE v2 entry away from index 3;
`no_ipv4_roce_v2` lists devices that hold no RoCE v2 entry of their IPv4 address (its RoCE v1
one only). `link_speeds` gives twins a rate in Mb/s (the lab gives each a Spark's 200000 unless
a test sets another: lab.py SPARK_LINK_SPEED): their /sys/class/net/IF/speed, which on the lab's
veths reads the kernel's 10000, is bound over by a file that reads the rate while the twin has
carrier and -1 without (an mlx5 link with no partner reports SPEED_UNKNOWN).
`kernel` gives a release that /proc/sys/kernel/osrelease reads instead of the lab machine's
(`uname -r` keeps the real one: no namespace changes it).
"""

import ipaddress
import json
import os
import select
import socket
import stat
import subprocess
from pathlib import Path

HARDWARE = Path("/usr/local/lib/simlab/hardware.json")
STATE = Path("/run/simlab-rdma")
IB = Path("/sys/class/infiniband")
TABLE_SIZE = 16  # real mlx5 tables have 255; the unused tail is all zeros
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
# Read everything again this often with no change heard (a monitor that died is started again);
# polling every 0.3 s instead ran `ip` seven times a second on every host of every lab.
RESYNC_S = 10


def gid_text(address: ipaddress.IPv6Address) -> str:
    packed = address.packed.hex()
    return ":".join(packed[i : i + 4] for i in range(0, 32, 4))


def link_local(mac: str) -> ipaddress.IPv6Address:
    octets = [int(part, 16) for part in mac.split(":")]
    octets[0] ^= 0x02
    eui = [*octets[:3], 255, 254, *octets[3:]]
    return ipaddress.IPv6Address(bytes([0xFE, 0x80] + [0] * 6 + eui))


def mount_overlay() -> None:
    if IB.exists():
        return
    for sub in ("upper", "work"):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    options = f"lowerdir=/sys/class,upperdir={STATE}/upper,workdir={STATE}/work"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, "/sys/class"], check=True)
    IB.mkdir(exist_ok=True)


def entries(netdev: str, v2_index: int | None) -> list[tuple[str, str]]:
    """The (gid, type) rows the kernel would hold for this netdev, index by index."""
    link = json.loads(
        subprocess.run(
            ["ip", "-j", "addr", "show", "dev", netdev], capture_output=True, text=True
        ).stdout
        or "[]"
    )
    if not link:
        return []
    rows = [(gid_text(link_local(link[0]["address"])), "IB/RoCE v1")]
    rows.append((rows[0][0], "RoCE v2"))
    for info in link[0].get("addr_info", []):
        if info["family"] != "inet":
            continue
        mapped = gid_text(ipaddress.IPv6Address(f"::ffff:{info['local']}"))
        rows.append((mapped, "IB/RoCE v1"))
        if v2_index is None:
            continue
        # A stray RoCE v2 entry (a second, unrelated GID) pushes the IPv4 one off index 3.
        while len(rows) < v2_index:
            rows.append((gid_text(ipaddress.IPv6Address("fd00:5a17::1")), "RoCE v2"))
        rows.append((mapped, "RoCE v2"))
    return rows


def write_table(hca: str, netdev: str, rows: list[tuple[str, str]]) -> None:
    port = IB / hca / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    for index in range(TABLE_SIZE):
        gid, kind = rows[index] if index < len(rows) else (ZERO, None)
        (port / "gids" / str(index)).write_text(gid + "\n")
        for sub, value in (("types", kind), ("ndevs", netdev)):
            path = port / "gid_attrs" / sub / str(index)
            if kind is None:
                path.unlink(missing_ok=True)  # unused entries cannot be read on real kernels
            else:
                path.write_text(value + "\n")


def make_device_nodes(hcas: list[str]) -> None:
    """/dev/infiniband as containers are handed it; the nodes are /dev/null's (1:3) here."""
    devices = Path("/dev/infiniband")
    devices.mkdir(exist_ok=True)
    for name in ["rdma_cm"] + [f"uverbs{i}" for i in range(len(hcas))]:
        if not (devices / name).exists():
            os.mknod(devices / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def bind_speeds(netdevs: list[str], speeds: dict[str, int]) -> dict[str, Path]:
    """Each twin of `speeds` with a file of its own bound over its speed attribute (the twins'
    binds of an earlier start of this service undone first); those files."""
    files = {}
    for netdev in netdevs:
        attribute = f"/sys/class/net/{netdev}/speed"
        subprocess.run(["umount", attribute], stderr=subprocess.DEVNULL, check=False)
        if netdev in speeds and Path(attribute).exists():
            files[netdev] = STATE / "speed" / netdev
            files[netdev].parent.mkdir(parents=True, exist_ok=True)
            files[netdev].write_text("-1\n")
            subprocess.run(["mount", "--bind", str(files[netdev]), attribute], check=True)
    return files


def bind_kernel(release: str | None) -> None:
    """/proc/sys/kernel/osrelease reading ``release`` (an earlier start's bind undone first)."""
    attribute = "/proc/sys/kernel/osrelease"
    subprocess.run(["umount", attribute], stderr=subprocess.DEVNULL, check=False)
    if release:
        shown = STATE / "osrelease"
        shown.parent.mkdir(parents=True, exist_ok=True)
        shown.write_text(f"{release}\n")
        subprocess.run(["mount", "--bind", str(shown), attribute], check=True)


def speed_text(netdev: str, mbps: int) -> str:
    """The rate while the twin has carrier; -1 without, as an mlx5 twin reads with no link."""
    try:
        carrier = Path(f"/sys/class/net/{netdev}/carrier").read_text().strip()
    except OSError:  # the interface is down: the kernel refuses the read (EINVAL)
        carrier = "0"
    return f"{mbps if carrier == '1' else -1}\n"


def notify_ready() -> None:
    """Tell systemd the tables and rates are written (Type=notify, sd_notify(3)'s protocol), so
    that `systemctl restart` returns with them shown, as a kernel shows a change at once, and
    NetworkManager, ordered after this service, starts with the devices in place."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"READY=1", address)


def main() -> None:
    hardware = json.loads(HARDWARE.read_text()) if HARDWARE.exists() else {}
    hcas = hardware.get("hcas", {"rocep1s0f1": "enp1s0f1np1", "roceP2p1s0f1": "enP2p1s0f1np1"})
    v2_index = int(hardware.get("ipv4_roce_v2_index", 3))
    no_v2 = set(hardware.get("no_ipv4_roce_v2", []))
    speeds = {netdev: int(mbps) for netdev, mbps in hardware.get("link_speeds", {}).items()}
    mount_overlay()
    make_device_nodes(list(hcas))
    speed_files = bind_speeds(list(hcas.values()), speeds)
    bind_kernel(hardware.get("kernel"))
    last: dict[str, list] = {}
    changes = monitor()  # before the first read: a change made in between is heard
    ready = False
    while True:
        for hca, netdev in hcas.items():
            rows = entries(netdev, None if hca in no_v2 else v2_index)
            if rows != last.get(hca):
                write_table(hca, netdev, rows)
                last[hca] = rows
        for netdev, path in speed_files.items():
            text = speed_text(netdev, speeds[netdev])
            if path.read_text() != text:
                path.write_text(text)
        if not ready:
            notify_ready()
            ready = True
        heard = select.select([changes.stdout], [], [], RESYNC_S)[0]
        if heard and not os.read(changes.stdout.fileno(), 65536):  # the monitor ended
            changes.wait()
            changes = monitor()


def monitor() -> subprocess.Popen:
    """`ip monitor`: a line for each address or link change in the host's namespace (a twin's
    carrier lost or back included)."""
    return subprocess.Popen(["ip", "monitor", "address", "link"], stdout=subprocess.PIPE)


if __name__ == "__main__":
    main()

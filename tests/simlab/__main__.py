"""python -m tests.simlab up|down|status|reimage HOST|reboot HOST|unplug HOST PORT|ssh HOST [CMD]|
host-tools|caches"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shlex
import subprocess
import sys

from spark import box_paths
from tests.simlab import caches, lab
from tests.simlab.paths import REPO, STATE, log
from tests.simlab.rootfs import ensure_host_tools


def demo() -> int:
    """What a newcomer runs first: the real deploy against the lab, then what it did."""
    current = lab.Lab.load()
    if not current.hosts:
        current = lab.up(2)
    log("deploying: pyinfra inventories/sim.py deploy.py")
    pyinfra = str(REPO / ".venv/bin/pyinfra")
    deploy = subprocess.run([pyinfra, "-y", "inventories/sim.py", "deploy.py"], cwd=REPO,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    if deploy.returncode != 0:
        return deploy.returncode
    log("compliance: pytest tests/compliance --inventory inventories/sim.py")
    compliance = subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/compliance", "--inventory", "inventories/sim.py", "-n", "2", "--dist", "loadgroup"],
        cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if compliance.returncode != 0:
        return compliance.returncode
    log("what the hosts look like now")
    for host in current.hosts:
        print(f"--- {host.name} ({host.mgmt_ip})")
        print(lab.ssh(host, DEMO_SHOW, check=False), end="")
    print(sample_request(current.hosts[0]))
    print("\nLab left running: `python -m tests.simlab ssh spark-1` to look around,")
    print("`make lab-down` (or `python -m tests.simlab down`) to remove it.")
    return 0


def sample_request(host: lab.Host) -> str:
    """A chat request to the first lane, as a user would send it (the key read from its
    root-only file, never printed), and what came back."""
    first = runpy.run_path(str(REPO / "group_data/all.py"))["lanes"][0]
    body = json.dumps(
        {
            "model": first["served_name"],
            "messages": [{"role": "user", "content": "Hello from the demo"}],
        }
    )
    command = (
        f"curl -s http://{host.mgmt_ip}:{first['port']}/v1/chat/completions "
        f'-H "Authorization: Bearer $(sudo cat {box_paths.key_path(first["name"])})" '
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)}"
    )
    answer = lab.ssh(host, command, check=False)
    return f"\nA sample request (run on {host.name}):\n  {command}\n{answer}"


DEMO_SHOW = (
    "nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader; "
    "echo held: $(apt-mark showhold); "
    "for i in enp1s0f1np1 enP2p1s0f1np1; do echo $i mtu $(cat /sys/class/net/$i/mtu) "
    "$(ip -4 -br addr show $i | awk '{print $3}'); done; "
    "grep -E '^(VLLM_HOST_IP|MASTER_ADDR|NCCL_IB_HCA|NCCL_IB_ADDR_FAMILY|RAY_memory)' "
    "/etc/spark/cluster.env; "
    "sudo docker info --format 'docker runtimes: {{range $k, $v := .Runtimes}}{{$k}} {{end}}'"
)


def switch_ports(option: str | None) -> tuple[int, ...] | None:
    """--switch-ports as lab.up takes it: "1,0" -> (1, 0); not given, None."""
    return None if option is None else tuple(int(port) for port in option.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simlab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="boot a fresh lab of bare Sparks")
    up.add_argument("--hosts", type=int, default=2, help="how many (default 2)")
    up.add_argument(
        "--gid-index",
        action="append",
        default=[],
        metavar="HOST=N",
        help="put HOST's IPv4 RoCE v2 GID at index N (a field failure), e.g. spark-2=4",
    )
    up.add_argument(
        "--cabling",
        choices=list(lab.CABLINGS),
        help="pair: one cable on port 1 (the default for 2 hosts); pair-dual: both ports; ring3:"
        " port 0 of each of 3 hosts to port 1 of the next; switch: the --switch-ports of 2-8"
        " hosts to a switch (the default for more than 2)",
    )
    up.add_argument(
        "--switch-ports",
        choices=[",".join(map(str, ports)) for ports in lab.SWITCH_PORTS],
        metavar="1|0|1,0",
        help="the ports of each host in the switch (switch only; default 1), as the inventory's"
        " fabric_switch_ports",
    )
    commands.add_parser("down", help="stop every host and remove all the lab made")
    commands.add_parser(
        "host-tools", help="install the Debian packages the lab and the tests need (make test)"
    )
    commands.add_parser(
        "caches", help="build what the lab and the tests take from the caches (make test), first"
    )
    commands.add_parser("demo", help="boot a lab (unless one is up), deploy to it, show the result")
    commands.add_parser("status", help="the hosts and how to reach them")
    reimage = commands.add_parser("reimage", help="return a host to the bare image (new host keys)")
    reimage.add_argument("host")
    reboot = commands.add_parser("reboot", help="the host's own reboot; the lab powers it back")
    reboot.add_argument("host")
    unplug = commands.add_parser(
        "unplug", help="pull the cable out of a host's QSFP port (0 or 1); reboot its ends"
    )
    unplug.add_argument("host")
    unplug.add_argument("port", type=int, choices=(0, 1))
    ssh = commands.add_parser("ssh", help="an SSH session (or one command) on a host")
    ssh.add_argument("host")
    ssh.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if os.geteuid() != 0:
        parser.error("the lab needs root (network namespaces, mounts, systemd-nspawn)")
    if args.command == "up":
        overrides = dict(item.split("=", 1) for item in args.gid_index)
        booted = lab.up(
            args.hosts,
            {name: int(n) for name, n in overrides.items()},
            cabling=args.cabling,
            switch_ports=switch_ports(args.switch_ports),
        )
        print(
            f"{len(booted.hosts)} hosts up. Deploy: .venv/bin/pyinfra inventories/sim.py deploy.py"
        )
        print("Tear down: python -m tests.simlab down")
    elif args.command == "down":
        lab.down()
    elif args.command == "host-tools":
        ensure_host_tools()
    elif args.command == "caches":
        caches.build_all()
    elif args.command == "demo":
        return demo()
    elif args.command == "status":
        current = lab.Lab.load()
        if not current.hosts:
            print("no lab is up")
            return 1
        for host in current.hosts:
            alive = host.pid is not None and os.path.exists(f"/proc/{host.pid}")
            print(f"{host.name:10} {host.mgmt_ip:12} {'up' if alive else 'DOWN'}")
        print(f"ssh -F {STATE / 'ssh_config'} spark-1")
    elif args.command == "reimage":
        host = lab.reimage(args.host)
        print(f"{host.name} reimaged; its new host key:")
        print((host.dir / "upper/etc/ssh/ssh_host_ed25519_key.pub").read_text().strip())
    elif args.command == "reboot":
        print(f"{lab.reboot(args.host).name} rebooted and up")
    elif args.command == "unplug":
        ends = lab.unplug(args.host, args.port)
        rebooted = ", ".join(host.name for host in ends)
        print(f"no cable in port {args.port} of {args.host}; rebooted {rebooted}")
    elif args.command == "ssh":
        target = lab.Lab.load().host(args.host)
        os.execvp("ssh", ["ssh", "-F", str(STATE / "ssh_config"), target.name, *args.cmd])
    return 0


if __name__ == "__main__":
    sys.exit(main())

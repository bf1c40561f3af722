"""Your Sparks. Edit the names, the SSH user and the fabric addresses, then:

    .venv/bin/pyinfra inventories/lab.py deploy.py --dry     # the plan, nothing changed
    .venv/bin/pyinfra inventories/lab.py deploy.py           # apply

Defaults for every box (driver branch, MTU, GID index, toolkit version...) are in
group_data/all.py; anything set here for one box overrides them for that box. Every key, its
type, default and why: docs/variables.md.

Three boxes in a ring (fabric_topology = "ring3" in group_data/all.py, port 0 of each box cabled
to port 1 of the next): leave fabric_addresses out (the deploy derives them) and give each box
its address on the management port, where a ring's rendezvous goes (docs/reference.md, Fabric
shapes):

    ("spark-3.local", {**_ssh, "spark_role": "worker", "management_address": "10.0.0.23"}),

`ip -4 -br address show enP7s7` on the box shows it.
"""

from pathlib import Path

# pyinfra reads group_data/ (every box's defaults, and the check of every box's data before
# any box is contacted: stages/preconnect.py) only from the directory it starts in.
_collection = Path(__file__).resolve().parents[1]
if Path.cwd().resolve() != _collection:
    raise SystemExit(
        f"start pyinfra in {_collection} (cd there, or add --chdir {_collection}): no box was"
        " contacted"
    )

_ssh = {
    "ssh_user": "nvidia",  # the admin user created at first boot
    # "ssh_key": "~/.ssh/id_ed25519",
    # When sudo asks for a password, pyinfra asks for it on the terminal (--same-sudo-password:
    # once, before connecting); make clients and make compliance need sudo without one (README).
    "_sudo": True,
}

spark = [
    (
        "spark-1.local",  # a name or address your machine reaches over the management LAN
        {
            **_ssh,
            "spark_role": "head",
            # Same physical QSFP-DD port on both boxes; one subnet per twin.
            "fabric_addresses": {
                "enp1s0f1np1": "192.168.100.10/24",
                "enP2p1s0f1np1": "192.168.101.10/24",
            },
        },
    ),
    (
        "spark-2.local",
        {
            **_ssh,
            "spark_role": "worker",
            "fabric_addresses": {
                "enp1s0f1np1": "192.168.100.11/24",
                "enP2p1s0f1np1": "192.168.101.11/24",
            },
        },
    ),
]

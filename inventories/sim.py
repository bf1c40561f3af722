"""The simulated lab as an inventory: `pyinfra inventories/sim.py deploy.py`.

It mirrors inventories/lab.py; only the addresses, the SSH files and the package repository
(the lab's local stand-in of NVIDIA's) differ. `python -m tests.simlab up` must have run.
"""

import json
import os
from pathlib import Path

_lab_id = int(os.environ.get("SIMLAB_ID", "0"))
_state = Path(__file__).resolve().parent.parent / (
    ".simlab" if _lab_id == 0 else f".simlab{_lab_id}"
)
_state = Path(os.environ.get("SIMLAB_STATE", _state))
if not (_state / "lab.json").exists():
    raise SystemExit("no simulated lab is up: run `python -m tests.simlab up` first (as root)")

_lab = json.loads((_state / "lab.json").read_text())
_lab_hosts = _lab["hosts"]
# How the lab cabled its hosts (tests/simlab/lab.py CABLINGS), named as the fabric_topology.
_topology = _lab["cabling"]
# A Hugging Face token for the lab's lanes, when one is put there (the end-to-end tests put a
# sentinel, to show it never shows up where it must not); the stand-in reaches no hub.
_hf_token = _state / "hf-token"

spark = [
    (
        host["name"],
        {
            "ssh_hostname": host["mgmt_ip"],
            "ssh_user": "spark",
            "ssh_key": str(_state / "id_ed25519"),
            "ssh_known_hosts_file": str(_state / "known_hosts"),
            "ssh_strict_host_key_checking": "yes",
            "_sudo": True,
            "spark_role": "head" if host["index"] == 1 else "worker",
            # NVIDIA's two-Spark plan: one subnet per twin, .10 for the first box, .11 next...
            # given here for a pair; for the other shapes left out, so the deploy derives every
            # twin's (the same scheme: operations/topology.py).
            "fabric_addresses": {}
            if _topology != "pair"
            else {
                "enp1s0f1np1": f"192.168.100.{9 + host['index']}/24",
                "enP2p1s0f1np1": f"192.168.101.{9 + host['index']}/24",
            },
            "fabric_topology": _topology,
            # The ports the lab cabled to its switch (a switch only; tests/simlab/lab.py).
            "fabric_switch_ports": _lab.get("switch_ports", [1]),
            # The address this machine reaches the box at is its enP7s7's: a ring's rendezvous
            # and sockets go there (README, Fabric shapes).
            "management_address": host["mgmt_ip"],
            # The lab's hosts reach no registry: NVIDIA's repository is a local stand-in.
            "toolkit_repo_url": "file:/srv/simlab-repos/nvidia-container-toolkit",
            "toolkit_repo_key_url": "file:///srv/simlab-repos/nvidia-container-toolkit/gpgkey",
            # The lanes are group_data's appliance as it is: the stand-in checks their command
            # lines against vLLM 0.19.0's options and reserves no memory for them. The lab's
            # machine is small and shared by other labs, whose load must not make the memory
            # guard stop lanes here; the tests raise the threshold to see it act.
            "memory_guard_min_available_gib": 1,
            "hf_token_file": str(_hf_token) if _hf_token.exists() else None,
            # The lab's hub stand-in (tests/simlab/hub.py, which lab.py runs while the lab is
            # up) sends a model in moments: each box fetches what its lanes need, which start
            # once it lands, within the deploy; on real boxes it takes hours (group_data says why).
            "fetch_weights": True,
            "hf_endpoint": _lab["hub"],
            # The router's pinned wheels from the lab's package index (tests/simlab/pypi.py):
            # the lab's hosts reach no public index.
            "router_pip_index": _lab["pypi"],
            # The NCCL test on the lab: its veths carry the stand-in's TCP at a few GB/s at
            # best, on a small machine other labs share, so the mark is the lab's (0.05 GB/s:
            # the bytes moved, not a Spark's 21.875), and 4 MiB keeps the run to seconds; the
            # verdict's other conditions (NET/IB on every twin) are the deploy's own.
            "nccl_test_min_busbw_gbs": 0.05,
            "nccl_test_max_bytes": 4 << 20,
        },
    )
    for host in _lab_hosts
]

"""The fabric peer check: each twin reaches the same twin of the other boxes with jumbo frames.

Captures:
- lab-fabric-peers-answer.txt: FabricPeers' command on lab host spark-1 after a deploy (both
  twins answer 8972-byte unfragmented pings).
- lab-fabric-peers-cut.txt: the same on spark-1 with spark-2's enP2p1s0f1np1 cut (every frame
  arriving on it dropped).
The check command that runs when a peer is silent is run below in a real shell, against
stand-ins for ping, cat (the carrier file) and sleep.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_state

from operations import preflight
from tests.unit.harness import FakeHost, captured, process, refusal, run_of, run_op, run_state

A, B = "enp1s0f1np1", "enP2p1s0f1np1"
PEERS = [(A, "spark-2", "192.168.100.11"), (B, "spark-2", "192.168.101.11")]
PAIRS = ((A, "192.168.100.11"), (B, "192.168.101.11"))


def check(outputs: str | None, failed: tuple[str, ...] = ()) -> tuple[list[str], FakeHost]:
    """The commands fabric_peers yields for spark-1 with this FabricPeers output, while pyinfra
    counts `failed` boxes as failed in the run."""
    facts = {} if outputs is None else {preflight.FabricPeers: outputs}
    host = FakeHost(facts)
    host.name = "spark-1"
    run_state = SimpleNamespace(failed_hosts=[SimpleNamespace(name=name) for name in failed])
    with ctx_state.use(run_state):
        return run_op(preflight.fabric_peers, PEERS, mtu=9000, host=host), host


def test_fact_reads_each_twin_and_address() -> None:
    assert process(preflight.FabricPeers, captured("lab-fabric-peers-answer.txt")) == {
        (A, "192.168.100.11"): True,
        (B, "192.168.101.11"): True,
    }
    assert process(preflight.FabricPeers, captured("lab-fabric-peers-cut.txt")) == {
        (A, "192.168.100.11"): True,
        (B, "192.168.101.11"): False,
    }
    command = preflight.FabricPeers().command(pairs=PAIRS, size=8972)
    assert "-M do -s 8972 -I enP2p1s0f1np1 192.168.101.11" in command
    assert command.endswith("2>/dev/null || true")


PEER_STUBS = {
    # `ip -4 -o address show dev IF`: a line for each twin in $ADDRESSED (iproute2's -o form).
    "ip": 'case " $ADDRESSED " in *" $6 "*) echo "3: $6    inet 192.168.100.10/24 scope global";;'
    " esac\n",
    # Each ping marks its twin, then waits for every twin in $ADDRESSED to be marked: pings
    # asked one after the other would never meet (the first gives up, unanswered).
    "ping": 'for a; do [ "$p" = -I ] && i=$a; p=$a; done; touch "$MARKS/$i"; n=0;'
    ' for t in $ADDRESSED; do until [ -e "$MARKS/$t" ]; do n=$((n + 1));'
    " [ $n -ge 300 ] && exit 1; sleep 0.1; done; done; exit 0\n",
}


@pytest.mark.parametrize(
    ("addressed", "answers", "pinged"),
    [
        ("", "no enp1s0f1np1 192.168.100.11\nno enP2p1s0f1np1 192.168.101.11\n", []),
        (B, "no enp1s0f1np1 192.168.100.11\nyes enP2p1s0f1np1 192.168.101.11\n", [B]),
        (f"{A} {B}", "yes enp1s0f1np1 192.168.100.11\nyes enP2p1s0f1np1 192.168.101.11\n", [A, B]),
    ],
)
def test_fact_pings_only_from_a_twin_with_an_address_and_pings_side_by_side(
    tmp_path: Path, addressed: str, answers: str, pinged: list[str]
) -> None:
    stubs, marks = tmp_path / "bin", tmp_path / "marks"
    stubs.mkdir()
    marks.mkdir()
    for name, body in PEER_STUBS.items():
        (stubs / name).write_text("#!/bin/sh\n" + body)
        (stubs / name).chmod(0o755)
    env = dict(
        os.environ, PATH=f"{stubs}:{os.environ['PATH']}", ADDRESSED=addressed, MARKS=str(marks)
    )
    command = preflight.FabricPeers().command(pairs=PAIRS, size=8972)
    result = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)
    assert sorted(result.stdout.splitlines()) == sorted(answers.splitlines())  # in any order
    assert sorted(mark.name for mark in marks.iterdir()) == sorted(pinged)


def test_every_peer_answering_yields_nothing() -> None:
    commands, host = check(captured("lab-fabric-peers-answer.txt"))
    assert commands == []
    assert host.noops == ["every twin reaches its peers with 9000-byte frames"]


def test_a_silent_twin_gets_the_check_that_names_box_twin_and_peer() -> None:
    commands, _host = check(captured("lab-fabric-peers-cut.txt"))
    assert len(commands) == 1
    assert "spark-1: fabric twin enP2p1s0f1np1 gets no answer from spark-2" in commands[0]
    assert "-I enp1s0f1np1" not in commands[0]  # the twin that answers is not asked again


def test_a_box_failed_in_this_run_is_left_out() -> None:
    commands, host = check(None, failed=("spark-2",))  # no fact read at all
    assert commands == []
    assert host.noops == [
        "every twin reaches its peers with 9000-byte frames (spark-2 failed in this run:"
        " not checked)"
    ]


def test_a_single_box_has_no_peer_to_reach() -> None:
    host = FakeHost({})
    assert run_op(preflight.fabric_peers, [], mtu=9000, host=host) == []
    assert host.noops == ["no other box in the inventory: no fabric peer to reach"]


STUBS = {
    # Answers a ping when its size is allowed: $PING_SIZES holds the sizes that get through.
    "ping": 'for a; do [ "$p" = -s ] && s=$a; p=$a; done\n'
    'case " $PING_SIZES " in *" $s "*) exit 0;; esac; exit 1\n',
    # The twin's carrier and its live MTU, as sysfs-class-net gives them.
    "cat": 'case "$1" in */carrier) echo "$CARRIER";; */mtu) echo "$MTU";; esac\n',
    "sleep": "exit 0\n",
}


@pytest.mark.parametrize(
    ("carrier", "sizes", "mtu", "hint"),
    [
        ("0", "", "9000", "enP2p1s0f1np1 has no link: check the QSFP-DD cable at both ends"),
        ("1", "56", "9000", "smaller pings do get through: a hop below MTU 9000; check `cat"
         " /sys/class/net/enP2p1s0f1np1/mtu` on spark-2"),
        # This box's own twin lowered by hand (`ip link set dev enP2p1s0f1np1 mtu 1500`): its
        # own fault, named before any peer is blamed.
        ("1", "56", "1500", "this box's own enP2p1s0f1np1 is at MTU 1500, not 9000"),
        ("1", "", "9000", "enP2p1s0f1np1 has link but nothing answers: check on spark-2 that"),
    ],
)  # fmt: skip
def test_check_command_says_what_to_look_at(
    tmp_path: Path, carrier: str, sizes: str, mtu: str, hint: str
) -> None:
    for name, body in STUBS.items():
        (tmp_path / name).write_text("#!/bin/sh\n" + body)
        (tmp_path / name).chmod(0o755)
    commands, _host = check(captured("lab-fabric-peers-cut.txt"))
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", CARRIER=carrier, MTU=mtu)
    failing = subprocess.run(
        ["sh", "-c", commands[0]], env=env | {"PING_SIZES": sizes}, capture_output=True, text=True
    )
    assert failing.returncode == 1
    assert failing.stderr.startswith(
        "spark-1: fabric twin enP2p1s0f1np1 gets no answer from spark-2 (192.168.101.11 on its"
        " enP2p1s0f1np1) to 9000-byte unfragmented pings; "
    )
    assert hint in failing.stderr
    assert ("check `cat" in failing.stderr) == (mtu == "9000" and sizes == "56")  # one culprit
    # The peer answering in time (a profile just brought up) passes.
    answering = subprocess.run(["sh", "-c", commands[0]], env=env | {"PING_SIZES": "8972"})
    assert answering.returncode == 0


# A box stopped in the run: the operation it failed at and what its command printed on stderr
# (lanes.serving's refusal of a taken port, as tests/unit/test_lanes.py shows it).
STOPPED = {
    "spark-3": (
        "Lanes and front | Lane coder: qwen3-coder-next on port 10101",
        "spark-3: port 10101 of lane coder is taken by python3; stop that service or give the"
        " lane another port in group_data `lanes`",
    )
}
# What the boxes waiting for it say, "spark-3: " left out (the line names the box).
WAITS = (
    "waits for spark-3, stopped at Lanes and front | Lane coder: qwen3-coder-next on port 10101:"
    " port 10101 of lane coder is taken by python3; stop that service or give the lane another"
    " port in group_data `lanes`"
)


def whole(stopped: dict[str, tuple[str, str] | None]) -> tuple[list[str], FakeHost]:
    """The commands cluster_whole yields for spark-1 of spark-1..3 while `stopped` are failed."""
    host = FakeHost({})
    host.name = "spark-1"
    with ctx_state.use(run_state(stopped)):
        return run_op(preflight.cluster_whole, ["spark-1", "spark-2", "spark-3"], host=host), host


def test_a_whole_cluster_yields_nothing() -> None:
    commands, host = whole({})
    assert commands == []
    assert host.noops == ["every box of the cluster is in this run (spark-1, spark-2, spark-3)"]


def test_a_box_failed_in_this_run_is_named_and_the_cluster_stage_goes_on() -> None:
    # "elsewhere" failed too, but is no box of this cluster; "spark-4" was never reached.
    commands, host = whole(STOPPED | {"elsewhere": None})
    assert commands == []
    assert host.noops == [f"the cluster goes on without spark-3: {WAITS}"]
    _commands, host = whole({"spark-2": None})
    assert host.noops == [
        "the cluster goes on without spark-2: waits for spark-2, stopped at connecting: not"
        " reached (pyinfra's error above)"
    ]


# --- a cluster lane: model and image on every box ------------------------------------------------

MODEL = "Qwen/Qwen3-235B-A22B-GPTQ-Int4"
MODEL_ARGS = {
    "model": MODEL,
    "image": "nvcr.io/nvidia/vllm:26.04-py3",
    "models_dir": "/var/lib/spark/models",
    "token_path": "/etc/spark/secrets/hf-token",
}
# What the box runs to fetch MODEL, the token only as a mounted file.
FETCH_COMMAND = (
    "sudo docker run --rm -v /var/lib/spark/models:/root/.cache/huggingface"
    " -v /etc/spark/secrets/hf-token:/run/secrets/hf-token:ro"
    " -e HF_TOKEN_PATH=/run/secrets/hf-token nvcr.io/nvidia/vllm:26.04-py3"
    f" hf download {MODEL}"
)


def test_model_weights_fact_looks_in_the_lanes_cache() -> None:
    command = preflight.ModelWeights().command(MODEL, "/var/lib/spark/models")
    assert "/var/lib/spark/models/hub/models--Qwen--Qwen3-235B-A22B-GPTQ-Int4/snapshots/*" in (
        command
    )
    assert process(preflight.ModelWeights, "present\n") is True
    assert process(preflight.ModelWeights, "") is False


def test_a_model_on_the_box_yields_nothing() -> None:
    host = FakeHost({preflight.ModelWeights: "present\n"})
    assert run_op(preflight.model_present, host=host, **MODEL_ARGS) == []
    assert host.noops == [f"{MODEL} is on this box"]


def test_a_model_missing_is_refused_with_the_command_that_fetches_it() -> None:
    host = FakeHost({preflight.ModelWeights: ""})
    host.name = "spark-2"
    message = refusal(run_op(preflight.model_present, host=host, **MODEL_ARGS))
    assert message.startswith(f"spark-2: {MODEL} is not on this box")
    assert "a lane loads it from the box's disk and downloads nothing" in message
    assert "(or set fetch_weights = True)" in message
    assert message.endswith(FETCH_COMMAND)


def test_without_a_token_file_the_command_shown_mounts_nothing_for_it() -> None:
    host = FakeHost({preflight.ModelWeights: ""})
    args = MODEL_ARGS | {"token_path": None}
    message = refusal(run_op(preflight.model_present, host=host, **args))
    command = message.rpartition(": ")[2]
    assert "hf-token" not in command and "HF_TOKEN" not in command
    assert command.endswith(f"nvcr.io/nvidia/vllm:26.04-py3 hf download {MODEL}")


def test_a_model_path_missing_is_refused_with_the_way_to_copy_it() -> None:
    host = FakeHost({preflight.ModelWeights: ""})
    host.name = "spark-2"
    args = MODEL_ARGS | {"model": "/models/big"}
    assert re.search(
        r"^spark-2: /models/big has no config.json; copy",
        refusal(run_op(preflight.model_present, host=host, **args)),
    )


def test_a_gguf_is_present_when_every_part_is_in_the_snapshot_refs_main_names(
    tmp_path: Path,
) -> None:
    # The fact's command run by a shell on a cache laid out as huggingface_hub leaves it.
    repo = tmp_path / "hub/models--unsloth--Big-GGUF"
    parts = ("Q4/big-00001-of-00002.gguf", "Q4/big-00002-of-00002.gguf")
    command = preflight.ModelWeights().command("unsloth/Big-GGUF", str(tmp_path), parts)

    def answer() -> bool:
        shell = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        return process(preflight.ModelWeights, shell.stdout)

    assert answer() is False  # no repository
    (repo / "refs").mkdir(parents=True)
    (repo / "refs/main").write_text("rev2")
    (repo / "snapshots/rev1/Q4").mkdir(parents=True)
    for part in parts:  # an older revision holds it: not the one the lane loads
        (repo / "snapshots/rev1" / part).write_bytes(b"GGUF")
    assert answer() is False
    (repo / "snapshots/rev2/Q4").mkdir(parents=True)
    (repo / "snapshots/rev2" / parts[0]).write_bytes(b"GGUF")
    assert answer() is False  # a part missing
    (repo / "snapshots/rev2" / parts[1]).write_bytes(b"GGUF")
    assert answer() is True


def test_a_missing_ggufs_command_fetches_its_files_only() -> None:
    host = FakeHost({preflight.ModelWeights: ""})
    args = MODEL_ARGS | {"model": "unsloth/Big-GGUF", "files": ("a.gguf",), "token_path": None}
    command = refusal(run_op(preflight.model_present, host=host, **args))
    assert command.endswith("nvcr.io/nvidia/vllm:26.04-py3 hf download unsloth/Big-GGUF a.gguf")


def test_image_layers_fact_hashes_the_layer_list_or_says_absent() -> None:
    assert process(preflight.ImageLayers, "ab12\n") == "ab12"
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert process(preflight.ImageLayers, empty + "\n") is None


def agree(
    layers: dict[str, str],
    me: str,
    stopped: dict[str, tuple[str, str] | None] | None = None,
    left_out: tuple[str, ...] = (),
) -> tuple[list[str], list[str]]:
    """image_agrees on ``me``, every box holding its layers' digest (``stopped``: boxes failed
    before, as harness.run_state takes them; ``left_out``: boxes the run leaves out, which answer
    nothing): its commands and noops."""
    hosts = {
        name: FakeHost({preflight.ImageLayers: digest}, name=name)
        for name, digest in layers.items()
    }
    in_run = [host for name, host in hosts.items() if name not in (*(stopped or {}), *left_out)]
    for name in left_out:
        hosts[name].outputs = {}  # asked anything, it fails the test
    with ctx_state.use(run_of(*in_run, stopped=stopped)):
        commands = run_op(preflight.image_agrees, "img:1", list(layers), host=hosts[me])
    return commands, hosts[me].noops


def test_the_same_image_on_every_box_yields_nothing() -> None:
    assert agree({"spark-1": "ab", "spark-2": "ab"}, "spark-1") == (
        [],
        ["img:1 is the same as on the other boxes"],
    )


def test_an_image_that_differs_is_refused_naming_the_boxes() -> None:
    commands, _ = agree({"spark-1": "ab", "spark-2": "ab", "spark-3": "cd"}, "spark-1")
    assert re.search(r"spark-1: img:1 differs from spark-3's", refusal(commands))


def test_an_image_missing_here_is_refused_and_one_missing_elsewhere_left_to_that_box() -> None:
    commands, _ = agree({"spark-1": "ab", "spark-2": ""}, "spark-2")
    assert refusal(commands) == "spark-2: img:1 is not on this box; pull it first"
    assert agree({"spark-1": "ab", "spark-2": ""}, "spark-1")[0] == []


def test_a_box_left_out_of_the_run_is_not_asked_and_said() -> None:
    # `--limit spark-2`: spark-1 is neither connected nor read (its FakeHost answers nothing).
    assert agree({"spark-1": "cd", "spark-2": "ab"}, "spark-2", left_out=("spark-1",)) == (
        [],
        ["img:1 is the same as on the other boxes in this run (spark-1 left out)"],
    )


def test_a_box_failed_in_this_run_stops_the_others_before_the_cluster_lane() -> None:
    layers = {"spark-1": "ab", "spark-2": "ab", "spark-3": "ab"}
    commands, _ = agree(layers, "spark-1", STOPPED)
    assert refusal(commands) == (
        f"spark-1: the cluster lane needs every box: it {WAITS}; nothing of the cluster lane"
        " starts until it passes"
    )


# `ip -4 -o address show dev enP7s7` on a box with a DHCP lease (iproute2's one-line form).
IP_4_O = (
    "2: enP7s7    inet 10.0.0.21/24 metric 100 brd 10.0.0.255 scope global dynamic enP7s7\\"
    "       valid_lft 86048sec preferred_lft 86048sec\n"
)


def test_the_ipv4_addresses_of_an_interface_without_prefixes() -> None:
    assert process(preflight.Ipv4Addresses, IP_4_O) == ["10.0.0.21"]
    assert process(preflight.Ipv4Addresses, "") == []  # no such interface, or no IPv4 address


def test_a_management_address_where_the_inventory_says_changes_nothing() -> None:
    host = FakeHost({preflight.Ipv4Addresses: IP_4_O})

    commands = run_op(preflight.management_address, "enP7s7", "10.0.0.21", host=host)

    assert commands == [] and host.noops == ["10.0.0.21 is on enP7s7"]


@pytest.mark.parametrize(("output", "has"), [(IP_4_O, "10.0.0.21"), ("", "no IPv4 address")])
def test_a_management_address_elsewhere_fails_the_box_saying_what_it_has(
    output: str, has: str
) -> None:
    host = FakeHost({preflight.Ipv4Addresses: output})

    error = refusal(run_op(preflight.management_address, "enP7s7", "10.0.0.99", host=host))

    assert error == (
        f"spark-test: management_address: 10.0.0.99 is not on enP7s7, which has {has};"
        " give the box's address there (a ring's rendezvous and sockets use it)"
    )

"""Ray over the fabric: the node fact, the unit a head or a worker gets, the token, refusals.

Captures (RayNode's command, run with sudo on the simulated lab, image = the stand-in of
nvcr.io/nvidia/vllm:26.04-py3 with Ray 2.60.0; the lab withholds CAP_SYS_RESOURCE):
- lab-head-deployed-raynode.txt, lab-worker-deployed-raynode.txt: spark-1 / spark-2 deployed
  before RAY_CHECKED existed (the image's Ray asked of the image itself).
- lab-head-checked-raynode.txt, lab-worker-checked-raynode.txt: spark-1 / spark-2 after a deploy
  (the image's Ray read from RAY_CHECKED).
- lab-bare-raynode.txt: spark-2 freshly reimaged (no image, no unit, no token).
- lab-stat-spark-ray-nodes-0755.txt: pyinfra's stat of the deployed spark-ray-nodes on spark-1.
- lab-ray-status-2-nodes.txt, lab-ray-status-1-node.txt: `docker exec spark-ray ray status` on
  spark-1 with both nodes joined, and after spark-2 was reimaged.
- raynode-image-without-ray.sample.txt, raynode-ray-2.51.sample.txt: written by hand in the
  fact's line format (an image without Ray: dgx-spark-playbooks#109; a Ray without token auth)
  with a root shell's full capability set.
Written out (the files a deploy of this file's IMAGE, ENVIRONMENT and token leaves):
- deployed-spark-ray-head.service.sample.txt, deployed-spark-ray-worker.service.sample.txt: the
  unit of spark-1 (the head) and spark-2 (its worker).
- deployed-spark-ray-nodes.sample.txt: spark-ray-nodes, the same on both.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
from jinja2 import Template
from pyinfra.context import ctx_state
from pyinfra.facts.files import File

from operations import ray, util
from spark.ports import listen_ports
from tests.unit.harness import FakeHost, captured, file_facts, process, refusal, run_op, run_state

IMAGE = "nvcr.io/nvidia/vllm:26.04-py3"
TOKEN = ray.Secret("f" * 64)
ENVIRONMENT = {"NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "RAY_memory_monitor_refresh_ms": "0"}
ENV_FILE = "/etc/spark/cluster.env"  # group_data's env_file
HEAD = {"role": "head", "node_ip": "192.168.100.10", "head_ip": "192.168.100.10"}
WORKER = {"role": "worker", "node_ip": "192.168.100.11", "head_ip": "192.168.100.10"}
FILES = (ray.UNIT_PATH, ray.NODES_COMMAND)
# The image's Ray version and id recorded on the box, written out as the box runs it.
RECORD = (
    "version=$(docker run --rm --network none --entrypoint ray nvcr.io/nvidia/vllm:26.04-py3"
    ' --version | head -n 1) && [ -n "$version" ]'
    " && id=$(docker image inspect --format '{{.Id}}' nvcr.io/nvidia/vllm:26.04-py3)"
    " && install -d -m 755 /var/lib/spark"
    ' && echo "$id $version" > /var/lib/spark/ray-image-checked'
)


def with_token(text: str, token: str = TOKEN) -> str:
    """A captured fact output whose token line is the hash of our test token (the lab's token
    stays on the lab)."""
    digest = hashlib.sha256(token.encode()).hexdigest()
    return "\n".join(
        f"token {digest}" if line.startswith("token ") else line for line in text.splitlines()
    )


def node_host(fact: str, files: dict[str, str | None] | None = None) -> FakeHost:
    outputs = file_facts(files or dict.fromkeys(FILES)) | {ray.RayNode: fact}
    if files and files.get(ray.NODES_COMMAND) is not None:  # the script is root 0755
        outputs[(File, (("path", ray.NODES_COMMAND),))] = captured(
            "lab-stat-spark-ray-nodes-0755.txt"
        )
    return FakeHost(outputs)


def node_op(role: dict, host: FakeHost, **kwargs) -> list[str]:
    """ray.node on ``host`` with this file's image and env file (``kwargs``: the rest)."""
    arguments = {"env_file": ENV_FILE, "image": IMAGE, "environment": ENVIRONMENT, "port": 6379}
    arguments |= kwargs
    return run_op(ray.node, **role, **arguments, host=host)


def rendered(role: dict, environment: dict[str, str] = ENVIRONMENT, **kwargs) -> dict:
    """The unit and script a first deploy writes on a bare box."""
    host = node_host(captured("lab-bare-raynode.txt"))
    node_op(role, host, environment=environment, token=TOKEN, **kwargs)
    return {path: host.uploads[path] for path in FILES}


def deployed_files(role: dict) -> dict[str, str]:
    """The unit and script a deploy left on the head or the worker, as written out."""
    return {
        ray.UNIT_PATH: captured(f"deployed-spark-ray-{role['role']}.service.sample.txt"),
        ray.NODES_COMMAND: captured("deployed-spark-ray-nodes.sample.txt"),
    }


@pytest.mark.parametrize("role", [HEAD, WORKER], ids=["head", "worker"])
def test_a_bare_box_gets_the_files_a_deployed_one_has(role: dict) -> None:
    assert rendered(role) == deployed_files(role)


def test_fact_reads_a_deployed_node() -> None:
    assert process(ray.RayNode, captured("lab-head-deployed-raynode.txt")) == {
        "image": "sha256:2f742bedc35e89dbabba622d5b28408c03e3684eaac1be9163d12b7b53ed819d",
        "ray": (2, 60),
        "checked": False,  # deployed before RAY_CHECKED
        "enabled": "enabled",
        "active": "active",
        "token": "a19f71aa06d65dfd19d089aed0af60a22d12b1d0803b0a650e07a2b449463b79",
        "rdma": True,
        "unlimited_memlock": False,  # the lab's sandbox
    }


def test_fact_reads_the_recorded_check_of_the_image() -> None:
    fact = process(ray.RayNode, captured("lab-head-checked-raynode.txt"))
    assert fact["ray"] == (2, 60) and fact["checked"] is True
    assert process(ray.RayNode, captured("lab-head-deployed-raynode.txt"))["checked"] is False


def test_a_node_deployed_before_the_record_gets_it_without_a_restart() -> None:
    host = node_host(with_token(captured("lab-head-deployed-raynode.txt")), deployed_files(HEAD))
    commands = node_op(
        HEAD,
        token=TOKEN,
        host=host,
    )
    assert commands == [RECORD]


def test_the_record_holds_the_image_id_and_its_ray_version(tmp_path: Path) -> None:
    # The command as a box runs it, with docker stood in by a script answering as the lab's.
    docker = tmp_path / "docker"
    docker.write_text(
        '#!/bin/sh\ncase "$1" in run) echo "ray, version 2.60.0";; image) echo sha256:cb04;; esac\n'
    )
    docker.chmod(0o755)
    record = tmp_path / "checked"
    command = ray.record_ray_version(IMAGE).replace(ray.RAY_CHECKED, str(record))
    command = command.replace(os.path.dirname(ray.RAY_CHECKED), str(tmp_path))
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    subprocess.run(["sh", "-c", command], env=env, check=True)
    assert record.read_text() == "sha256:cb04 ray, version 2.60.0\n"
    # An image without Ray: the command fails and records nothing.
    record.unlink()
    docker.write_text('#!/bin/sh\n[ "$1" = image ] && echo sha256:cb04 || exit 127\n')
    assert subprocess.run(["sh", "-c", command], env=env).returncode != 0
    assert not record.exists()


def test_fact_reads_a_bare_box() -> None:
    assert process(ray.RayNode, captured("lab-bare-raynode.txt")) == {
        "image": None,
        "ray": None,
        "checked": False,
        "enabled": None,
        "active": "inactive",
        "token": None,
        "rdma": True,
        "unlimited_memlock": False,
    }
    without = process(ray.RayNode, captured("raynode-image-without-ray.sample.txt"))
    assert without["image"] and without["ray"] is None and without["unlimited_memlock"]


def test_bare_box_pulls_checks_ray_writes_token_unit_and_starts() -> None:
    host = node_host(captured("lab-bare-raynode.txt"))
    commands = node_op(
        HEAD,
        token=TOKEN,
        host=host,
    )
    # The pull that names its registry when it fails (tests/unit/test_images.py), then the check.
    assert commands[0].startswith("out=$(docker pull --quiet nvcr.io/nvidia/vllm:26.04-py3 2>&1)")
    assert commands[1] == RECORD
    assert commands[-3:] == [
        "systemctl daemon-reload",
        "systemctl enable spark-ray.service",
        "systemctl start spark-ray.service",
    ]
    assert host.uploads[ray.TOKEN_PATH] == TOKEN
    # The token file is root 0600 before the upload writes into it, and so is the temporary copy.
    secure = next(c for c in commands if c.startswith("install -d -m 700"))
    assert f"install -m 600 /dev/null {ray.TOKEN_PATH}" in secure
    assert 'install -m 600 -o "${SUDO_USER:-root}" /dev/null /tmp/pyinfra-test' in secure
    assert not any(TOKEN in command for command in commands)


def test_head_unit_binds_to_the_fabric_with_dashboard_on_loopback_and_token_by_file() -> None:
    unit = deployed_files(HEAD)[ray.UNIT_PATH]
    words = unit.replace("\\\n", " ").split()
    assert "--head" in words and "--port=6379" in words
    assert "--node-ip-address=192.168.100.10" in words
    assert "--dashboard-host=127.0.0.1" in words
    assert "--min-worker-port=20000" in words and "--max-worker-port=20999" in words
    assert words[words.index("NCCL_IB_HCA") - 1 : words.index("NCCL_IB_HCA") + 1] == [
        "-e",
        "NCCL_IB_HCA",
    ]
    assert "RAY_AUTH_MODE=token" in words
    assert f"{ray.TOKEN_PATH}:{ray.TOKEN_IN_CONTAINER}:ro" in words
    assert words[words.index("/dev/infiniband") - 1 :][:2] == ["--device", "/dev/infiniband"]
    assert "memlock=-1" not in words  # the lab's sandbox cannot raise it
    # Ray's session on the box: a cluster lane's driver finds the raylet's sockets there.
    assert words[words.index(f"{ray.SESSION_DIR}:/tmp/ray") - 1] == "-v"
    assert "EnvironmentFile=/etc/spark/cluster.env" in unit
    assert "Restart=always" in unit and "StartLimitIntervalSec=0" in unit
    assert "Requires=docker.service spark-firewall.service" in unit
    # Values stay in the environment file (the unit names them): never the token either.
    assert "rocep1s0f1" not in unit and TOKEN not in unit


def test_the_workers_read_the_weights_on_their_own_box_never_downloading() -> None:
    models = (("/var/lib/spark/models", "/root/.cache/huggingface"), ("/srv/m", "/srv/m"))
    unit = rendered(WORKER, models=models)[ray.UNIT_PATH]
    words = unit.replace("\\\n", " ").split()
    for volume in ("/var/lib/spark/models:/root/.cache/huggingface", "/srv/m:/srv/m"):
        assert words[words.index(volume) - 1] == "-v"
    assert words[words.index("HF_HUB_OFFLINE=1") - 1] == "-e"
    bare = deployed_files(WORKER)[ray.UNIT_PATH]
    assert "huggingface" not in bare and "HF_HUB_OFFLINE" not in bare


def test_worker_joins_the_head_and_has_no_head_options() -> None:
    unit = rendered(WORKER, port=7000)[ray.UNIT_PATH]
    words = unit.replace("\\\n", " ").split()
    assert "--address=192.168.100.10:7000" in words
    assert "--node-ip-address=192.168.100.11" in words
    assert "--head" not in words and not any(w.startswith("--dashboard-host") for w in words)
    assert "--node-manager-port=7001" in words and "--metrics-export-port=7006" in words


def test_full_capabilities_raise_memlock() -> None:
    fact = captured("raynode-ray-2.51.sample.txt").replace("2.51.1", "2.60.0")
    host = node_host(fact)
    node_op(HEAD, host=host)
    assert "--ulimit memlock=-1" in host.uploads[ray.UNIT_PATH].replace("\\\n    ", "")


def test_node_in_place_yields_nothing() -> None:
    host = node_host(with_token(captured("lab-head-checked-raynode.txt")), deployed_files(HEAD))
    commands = node_op(
        HEAD,
        token=TOKEN,
        host=host,
    )
    assert commands == []
    assert host.noops[-1] == "Ray head runs on 192.168.100.10 (spark-ray.service)"


def test_a_worker_between_two_tries_is_left_to_systemd() -> None:
    fact = with_token(captured("lab-worker-checked-raynode.txt")).replace(
        "active active", "active activating"
    )
    host = node_host(fact, deployed_files(WORKER))
    assert (
        node_op(
            WORKER,
            token=TOKEN,
            host=host,
        )
        == []
    )


def test_a_changed_environment_value_rewrites_the_unit_and_restarts() -> None:
    host = node_host(with_token(captured("lab-head-checked-raynode.txt")), deployed_files(HEAD))
    environment = ENVIRONMENT | {"NCCL_IB_HCA": "rocep1s0f1"}
    commands = node_op(
        HEAD,
        environment=environment,
        token=TOKEN,
        host=host,
    )
    assert commands[-2:] == ["systemctl daemon-reload", "systemctl restart spark-ray.service"]


def test_a_new_token_is_written_and_restarts_the_node() -> None:
    host = node_host(with_token(captured("lab-head-checked-raynode.txt")), deployed_files(HEAD))
    other = ray.Secret("0" * 64)
    commands = node_op(
        HEAD,
        token=other,
        host=host,
    )
    assert host.uploads[ray.TOKEN_PATH] == other
    assert commands[-1] == "systemctl restart spark-ray.service"


def test_an_image_without_ray_is_refused() -> None:
    host = node_host(captured("raynode-image-without-ray.sample.txt"))
    assert re.search(
        r"spark-test: .* has no Ray .*#109.*ray_image",
        refusal(
            node_op(
                HEAD,
                token=TOKEN,
                host=host,
            )
        ),
    )


def test_a_ray_without_token_auth_is_refused_unless_auth_is_off() -> None:
    host = node_host(captured("raynode-ray-2.51.sample.txt"))
    assert re.search(
        r"Ray 2\.51, without token .* ray_auth = False",
        refusal(
            node_op(
                HEAD,
                token=TOKEN,
                host=host,
            )
        ),
    )
    commands = node_op(HEAD, host=host)
    assert commands[-1] == "systemctl start spark-ray.service"
    assert "RAY_AUTH_MODE" not in host.uploads[ray.UNIT_PATH]


def test_listen_ports_cover_every_port_ray_start_names() -> None:
    ranges = listen_ports(6379)
    for role in (HEAD, WORKER):
        for arg in ray.ray_start(**role, port=6379):
            if arg.endswith("-port=20000") or not arg.split("=")[0].endswith("port"):
                continue
            port = int(arg.rpartition("=")[2])
            assert any(low <= port <= high for low, high in ranges), arg
    # GCS 6379 and the six ports after it, Ray's dashboard 8265 and client server 10001
    # (Ray's defaults), the workers' 20000-20999 (out of the lanes' 10101/10102, seed 003).
    assert ranges == [(6379, 6385), (8265, 8265), (10001, 10001), (20000, 20999)]


def test_controller_token_is_made_once_private_and_never_shown(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "ray-auth-token"
    token = ray.controller_token(path)
    assert len(token) == 64 and int(token, 16) >= 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ray.controller_token(path) == token
    assert repr(token) == "<secret>" and token not in repr({"token": token})


@pytest.mark.parametrize(
    ("status", "want", "code", "said"),
    [
        ("lab-ray-status-2-nodes.txt", 2, 0, "2 of 2 Ray nodes are alive"),
        (
            "lab-ray-status-1-node.txt",
            2,
            1,
            "1 of 2 Ray nodes are alive (see: journalctl -u spark-ray on each box)",
        ),
        ("lab-ray-status-1-node.txt", 1, 0, "1 of 1 Ray nodes are alive"),
    ],
)
def test_nodes_command_counts_the_alive_nodes(
    tmp_path: Path, status: str, want: int, code: int, said: str
) -> None:
    script = tmp_path / "spark-ray-nodes"
    source = (util.TEMPLATES / "spark-ray-nodes.sh.j2").read_text()
    script.write_text(Template(source).render(container=ray.CONTAINER))
    docker = tmp_path / "docker"  # answers `docker exec spark-ray ray status` as the lab did
    docker.write_text(f"#!/bin/sh\ncat {tmp_path / 'status.txt'}\n")
    (tmp_path / "status.txt").write_text(captured(status))
    docker.chmod(0o755)
    result = subprocess.run(
        ["sh", str(script), str(want)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
        timeout=30,
    )
    assert (result.returncode, (result.stdout + result.stderr).splitlines()[0]) == (code, said)


def test_nodes_command_says_while_it_waits_how_many_are_in(tmp_path: Path) -> None:
    """One node of two alive, waiting 6 s: the wait is said once (the count does not change),
    then the count and the failure (in the journal of the cluster lane that runs it)."""
    script = tmp_path / "spark-ray-nodes"
    source = (util.TEMPLATES / "spark-ray-nodes.sh.j2").read_text()
    script.write_text(Template(source).render(container=ray.CONTAINER))
    docker = tmp_path / "docker"
    docker.write_text("#!/bin/sh\necho 'Active:'; echo ' 1 node_0a'\n")
    docker.chmod(0o755)
    result = subprocess.run(
        ["sh", str(script), "2", "6"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "waiting for 2 Ray nodes: 1 alive (a box's spark-ray not joined yet)",
        "1 of 2 Ray nodes are alive (see: journalctl -u spark-ray on each box)",
    ]


def test_a_ray_node_left_behind_is_stopped_and_removed_once() -> None:
    # Where a cluster lane moved to executor mp: the unit the Ray lane left (a file's stat
    # line from the lab), then none.
    left = FakeHost(file_facts({}) | {(File, (("path", ray.UNIT_PATH),)): captured(
        "lab-stat-memguard-script-0755.txt")})  # fmt: skip
    assert run_op(ray.node_removed, host=left) == [
        "systemctl disable --now spark-ray.service",
        "rm -f /etc/systemd/system/spark-ray.service",
        "systemctl daemon-reload",
        "systemctl reset-failed spark-ray.service || true",
    ]
    assert run_op(ray.node_removed, host=FakeHost(file_facts({ray.UNIT_PATH: None}))) == []


# A box stopped in the run, as harness.run_state takes it: where, and what it printed.
HEAD_STOPPED = {
    "spark-1": (
        "Lanes and front | Lane coder: qwen3-coder-next on port 10101",
        "spark-1: port 10101 of lane coder is taken by python3; stop that service or give the"
        " lane another port in group_data `lanes`",
    )
}


def test_a_worker_whose_head_stopped_waits_for_it_and_touches_nothing() -> None:
    host = node_host(captured("lab-bare-raynode.txt"))
    with ctx_state.use(run_state(HEAD_STOPPED)):
        commands = node_op(WORKER, head="spark-1", host=host)  # fmt: skip
    assert refusal(commands) == (
        "spark-test: this Ray worker waits for spark-1, stopped at Lanes and front | Lane coder:"
        " qwen3-coder-next on port 10101: port 10101 of lane coder is taken by python3; stop that"
        " service or give the lane another port in group_data `lanes`"
    )
    assert host.uploads == {}


def test_a_head_goes_on_without_a_stopped_worker_and_a_worker_without_another() -> None:
    worker_stopped = {"spark-2": ("Host layer | Driver", "spark-2: driver 590 loaded")}
    for role, stopped in ((HEAD, worker_stopped), (WORKER, {"spark-3": None})):
        host = node_host(captured("lab-bare-raynode.txt"))
        with ctx_state.use(run_state(stopped)):
            commands = node_op(role, head="spark-1", host=host)  # fmt: skip
        assert commands[-1] == "systemctl start spark-ray.service", role


@pytest.mark.parametrize(
    ("changed", "said"),
    [
        ({"image": "nvcr.io/nvidia/vllm:$TAG"}, "'nvcr.io/nvidia/vllm:$TAG'"),
        ({"environment": {"NCCL%h": "1"}}, "'NCCL%h'"),
        ({"models": (("/srv/my models", "/models"),)}, "'/srv/my models'"),
    ],
)
def test_a_word_systemd_would_expand_stops_this_box_alone(changed: dict, said: str) -> None:
    # The inventory admits none of these (an image reference, the plan's names, an absolute
    # path of plain characters); given anyway, the box fails before anything is asked or
    # pulled, and the run goes on for the others.
    commands = node_op(HEAD, FakeHost({}), **changed)
    assert refusal(commands) == (
        f"spark-test: {said} cannot stand unquoted in spark-ray.service (letters, digits and"
        " ._/:=,@+- only)"
    )

"""The NCCL test's deploy side (operations/nccl.py): the kept verdict read back, the script a box
gets and what it does (with a stand-in docker that leaves a real one-rank NCCL log), and when
the ranks run again.

Captures (the fact's command, NcclTestState):
- nccl-test-state-bare.sample.txt: written by hand in the fact's line format, a box before the
  deploy wrote the test (no key, no verdict), with a root shell's full capability set.
- nccl-test-state-passed.sample.txt: written by hand, a pair's head after a passing run; its
  numbers are the field's (23.7 GB/s at MTU 9000: dgx-spark-playbooks#25), not a run's.
Written out: deployed-spark-nccl-test.sample.txt, the script a deploy of ARGS leaves on spark-2.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.context import ctx_state
from pyinfra.facts.files import File

from operations import nccl, preflight
from tests.unit.harness import (
    CAPTURED,
    FakeHost,
    captured,
    file_facts,
    process,
    refusal,
    run_of,
    run_op,
)

IMAGE = "nvcr.io/nvidia/vllm:26.04-py3"
TWINS = ["rocep1s0f1", "roceP2p1s0f1"]
ARGS = {
    "rank": 1,
    "world": 2,
    "image": IMAGE,
    "env_names": ["MASTER_ADDR", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"],
    "env_file": "/etc/spark/cluster.env",
    "hcas": TWINS,
    "min_busbw_gbs": 21.875,
    "max_bytes": 1 << 30,
}
FILES = (nccl.CHECK_PATH, nccl.COMMAND)
PASSED = captured("nccl-test-state-passed.sample.txt")
KEY = PASSED.split()[1]


def box(fact: str, files: dict[str, str | None] | None = None, name: str = "spark-2") -> FakeHost:
    outputs = file_facts(files or dict.fromkeys(FILES)) | {nccl.NcclTestState: fact}
    if files and files.get(nccl.COMMAND) is not None:  # the script is root 0755
        outputs[(File, (("path", nccl.COMMAND),))] = captured("lab-stat-spark-ray-nodes-0755.txt")
    host = FakeHost(outputs)
    host.name = name
    return host


def deployed() -> dict[str, str]:
    """The check (files/nccl_check.py, put as it is) and the script as a deploy of ARGS leaves
    them on spark-2."""
    return {
        nccl.CHECK_PATH: nccl.CHECK_SOURCE.read_text(),
        nccl.COMMAND: captured("deployed-spark-nccl-test.sample.txt"),
    }


def test_fact_reads_a_bare_box() -> None:
    assert process(nccl.NcclTestState, captured("nccl-test-state-bare.sample.txt")) == {
        "key": None,
        "kept": None,
        "rdma": True,
        "unlimited_memlock": True,
    }


def test_fact_reads_the_kept_verdict_and_its_key() -> None:
    found = process(nccl.NcclTestState, PASSED)
    assert found["key"] == KEY == found["kept"]["key"]
    assert found["kept"]["passed"] is True
    assert nccl.summary(found["kept"]) == (
        "all_gather 1073741824 B at 23.76 GB/s over NET/IB (roceP2p1s0f1, rocep1s0f1)"
    )


def test_a_verdict_that_is_not_json_is_a_failed_one() -> None:
    found = process(nccl.NcclTestState, "key ab\nkept {truncated")
    assert found["kept"] == {"passed": False, "problems": [f"{nccl.VERDICT} is not JSON"]}


def test_a_bare_box_gets_the_check_and_the_script() -> None:
    host = box(captured("nccl-test-state-bare.sample.txt"))
    commands = run_op(nccl.prepared, **ARGS, host=host)
    assert host.uploads == deployed()  # as written out for the tests of a deployed box
    assert any("chmod 755 /usr/local/sbin/spark-nccl-test" in c for c in commands), commands
    assert host.noops == []


def test_the_script_runs_one_rank_with_the_fabric_the_gpu_and_the_rdma_devices() -> None:
    script = deployed()[nccl.COMMAND]
    assert (
        "/usr/bin/docker run --rm --name spark-nccl-test --gpus all --network host --ipc host"
        " --ulimit memlock=-1 --device /dev/infiniband" in script
    )
    assert "-e RANK=1 -e WORLD_SIZE=2 -e LOCAL_RANK=0 -e MASTER_PORT=29500" in script
    assert "-e MASTER_ADDR -e NCCL_IB_HCA -e NCCL_SOCKET_IFNAME" in script
    assert f"\nimage={IMAGE}\n" in script
    assert '"$image" python3 /opt/spark/nccl_check.py rank --out /nccl' in script
    assert "--max-bytes 1073741824" in script
    assert "--expect-hca rocep1s0f1,roceP2p1s0f1 --min-busbw 21.875" in script
    assert "\nenv_file=/etc/spark/cluster.env\n" in script and '\n. "$env_file"\n' in script


def test_a_box_without_rdma_devices_or_the_memlock_right_gets_neither() -> None:
    host = box("capeff 00000000a80425fb")  # the lab's: no CAP_SYS_RESOURCE
    run_op(nccl.prepared, **ARGS, host=host)
    script = host.uploads[nccl.COMMAND]
    assert "--device /dev/infiniband" not in script and "memlock" not in script


@pytest.mark.parametrize(
    ("fact", "reason"),
    [
        (captured("nccl-test-state-bare.sample.txt"), "it never ran"),
        (
            PASSED.replace(f"key {KEY}", "key 99"),
            "what it depends on changed (the test, cluster environment, image)",
        ),
        (
            PASSED.replace('"passed": true, "problems": []', '"passed": false, "problems": ["x"]'),
            "it failed last time (x)",
        ),
        (PASSED, None),
    ],
    ids=["never-ran", "changed", "failed", "passed"],
)
def test_when_a_box_in_place_is_due(fact: str, reason: str | None) -> None:
    host = box(fact, deployed())
    assert run_op(nccl.prepared, **ARGS, host=host) == []
    assert host.noops[-1] == f"{nccl.COMMAND} is as written; {reason or 'its last run passed'}"


def both(
    head: str,
    worker: str | None,
    stopped: dict[str, tuple[str, str] | None] | None = None,
    noops: list | None = None,
    models: dict[str, bool] | None = None,
    logs: list | None = None,
) -> list[str]:
    """``passed`` on the head, each box with its fact (after ``prepared``; None: the worker is
    left out of the run, and answers nothing), its noops into ``noops``, its logs into
    ``logs``; with ``models`` (which box holds the cluster lane's model), it waits for MODEL."""
    files = deployed()
    on_head, on_worker = box(head, files, "spark-1"), box(worker or "", files, "spark-2")
    for host in (on_head, on_worker):
        if models is not None:
            on_disk = "present" if models[host.name] else ""
            host.outputs[preflight.ModelWeights] = on_disk  # its fact's own output: "present"
    if worker is None:
        on_worker.outputs = {}  # asked anything, it fails the test
    in_run = [on_head] + [on_worker] * (worker is not None and "spark-2" not in (stopped or {}))
    waits = {"waits_for": MODEL, "models_dir": MODELS} if models is not None else {}
    with ctx_state.use(run_of(*in_run, stopped=stopped)):
        commands = run_op(nccl.passed, ["spark-1", "spark-2"], host=on_head, **waits)
        (noops if noops is not None else []).extend(on_head.noops)
        (logs if logs is not None else []).extend(on_head.logs)
        return commands


MODEL = "Qwen/Qwen3-235B-A22B-GPTQ-Int4"  # the lab's cluster lane's (tests/e2e/cluster_lane.py)
MODELS = "/var/lib/spark/models"


def test_a_box_still_fetching_the_cluster_lanes_model_makes_the_test_wait_saying_so() -> None:
    never = captured("nccl-test-state-bare.sample.txt")
    logs: list[str] = []
    assert both(never, never, models={"spark-1": True, "spark-2": False}, logs=logs) == []
    assert logs == [
        f"the NCCL test waits for {MODEL}, not yet on spark-2: the cluster lane comes up once"
        " it lands on every box; a later deploy runs the test"
    ]


def test_once_every_box_holds_the_model_the_test_runs() -> None:
    never = captured("nccl-test-state-bare.sample.txt")
    assert both(never, never, models={"spark-1": True, "spark-2": True}) == [nccl.COMMAND]


def test_the_test_asks_each_box_for_the_model_it_waits_for() -> None:
    asked = nccl.questions(MODEL, MODELS)
    assert (preflight.ModelWeights, (("model", MODEL), ("models_dir", MODELS))) in asked
    assert all(fact is not preflight.ModelWeights for fact, _ in nccl.questions())


def test_passed_on_every_box_runs_nothing() -> None:
    noops: list[str] = []
    assert both(PASSED, PASSED, noops=noops) == []
    assert noops == [
        "the NCCL test passed: all_gather 1073741824 B at 23.76 GB/s over NET/IB"
        " (roceP2p1s0f1, rocep1s0f1)"
    ]


def test_a_box_left_out_of_the_run_runs_no_rank() -> None:
    noops: list[str] = []
    never = captured("nccl-test-state-bare.sample.txt")
    assert both(never, None, noops=noops) == []  # `--limit spark-1`
    assert noops == ["the NCCL test needs every box in the run; spark-2 not in it"]


def test_one_box_due_runs_the_test_on_every_box() -> None:
    never = captured("nccl-test-state-bare.sample.txt")
    assert both(PASSED, never) == [nccl.COMMAND]
    assert both(never, PASSED) == [nccl.COMMAND]
    # The worker's test just rewritten by ``prepared``: its script's digest is not the kept one.
    assert both(PASSED, PASSED.replace(f"key {KEY}", "key 99")) == [nccl.COMMAND]


def test_a_box_failed_in_this_run_stops_the_test_naming_it_and_where_it_stopped() -> None:
    # spark-2 stopped at the driver check (driver.branch_held's refusal, its first line).
    stopped = {
        "spark-2": (
            "Host layer | Driver branch 580: installed, held, apt pinned",
            "spark-2: driver packages not on branch 580 are installed: nvidia-driver-590-open"
            " 590.48.01-0ubuntu1.\nBranch 580 is required",
        )
    }
    assert refusal(both(PASSED, PASSED, stopped)) == (
        "spark-1: the NCCL test runs a rank on every box: it waits for spark-2, stopped at Host"
        " layer | Driver branch 580: installed, held, apt pinned: driver packages not on branch"
        " 580 are installed: nvidia-driver-590-open 590.48.01-0ubuntu1.; it runs once every box"
        " is back"
    )


FAKE_DOCKER = """#!/bin/sh
# docker as the script uses it: `image inspect` prints an id, `rm` nothing, `run` leaves one
# rank's real NCCL log and timings (an H100's one-rank run) in the folder mounted at /nccl, and
# with RANK_MACHINE its rank file.
case $1 in
    image) echo sha256:0f3c ;;
    run)
        while [ $# -gt 0 ]; do
            case $2 in *:/nccl) run=${2%:/nccl} ;; esac
            shift
        done
        cp "$CAPTURED/real-h100-nccl-check-1rank-default.log" "$run/nccl.vm.432.log"
        cp "$CAPTURED/real-h100-nccl-check-1rank-default-timings.json" "$run/timings.json"
        # The rank file a rank writes beside its log, on the architecture RANK_MACHINE names.
        [ -z "${RANK_MACHINE-}" ] ||
            printf '{"machine": "%s"}' "$RANK_MACHINE" >"$run/rank.vm.432.json"
        exit "${RANK_EXIT:-0}" ;;
esac
"""


def installed(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """The deployed script under tmp_path, with FAKE_DOCKER first on its PATH: the script, the
    result folder and the environment to run it with."""
    script = deployed()[nccl.COMMAND]
    bin_dir, out, env = tmp_path / "bin", tmp_path / "out", tmp_path / "cluster.env"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    env.write_text('NCCL_IB_HCA="rocep1s0f1,roceP2p1s0f1"\n')
    command = tmp_path / "spark-nccl-test"
    for real, here in [
        (nccl.CHECK_PATH, nccl.CHECK_SOURCE),
        (nccl.RESULT_DIR, out),
        ("/etc/spark/cluster.env", env),
        (nccl.COMMAND, command),
        ("/usr/bin/docker", bin_dir / "docker"),
    ]:
        script = script.replace(real, str(here))
    command.write_text(script)
    command.chmod(0o755)
    environ = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CAPTURED=str(CAPTURED))
    return command, out, environ


def test_the_script_runs_the_rank_judges_its_log_and_keeps_the_verdict(tmp_path) -> None:
    command, out, environ = installed(tmp_path)
    ran = subprocess.run([command], env=environ, capture_output=True, text=True, check=False)
    # One rank on a machine without RDMA: the verdict names the socket fallback and both twins.
    assert ran.returncode == 1, ran.stderr
    assert "FAIL: rank 0 (vm): NCCL fell back to sockets (NET/Socket on eth0)" in ran.stderr
    assert "FAIL: rank 0 (vm): NCCL does not use rocep1s0f1, roceP2p1s0f1" in ran.stderr
    assert "all_gather" in ran.stdout and ran.stdout.rstrip().endswith("FAIL (3 problems)")
    key = subprocess.run([command, "--key"], env=environ, capture_output=True, text=True)
    verdict = (out / "verdict.json").read_text().replace("\n", "")
    kept = process(nccl.NcclTestState, f"key {key.stdout.strip()}\nkept {verdict}")
    assert kept["kept"]["key"] == kept["key"] and len(kept["key"]) == 64
    assert nccl.why_due(kept["kept"], kept["key"]).startswith("it failed last time")
    # A rank that did not finish (a box that never started its rank: timeout's 124) says so.
    ran = subprocess.run(
        [command], env=environ | {"RANK_EXIT": "124"}, capture_output=True, text=True, check=False
    )
    assert "the rank exited 124 (124: not every box started it within 300 s)" in ran.stderr


def test_the_script_fails_an_aarch64_rank_on_nccl_2_28_9_naming_the_image(tmp_path) -> None:
    # The H100's real log says NCCL 2.28.9+cuda13.0; its rank file says aarch64, as a Spark's
    # rank writes it: the verdict fails it, naming the version, the image and the issue.
    command, _, environ = installed(tmp_path)
    ran = subprocess.run(
        [command], env=environ | {"RANK_MACHINE": "aarch64"}, capture_output=True, text=True
    )
    assert ran.returncode == 1
    assert (
        "FAIL: rank 0 (vm): NCCL 2.28.9+cuda13.0 on aarch64 in nvcr.io/nvidia/vllm:26.04-py3:"
        " NCCL before 2.29.3 deadlocks silently on aarch64: a weak compare-exchange in its"
        " proxy-op pool leaks slots until a rank spins forever, no error, no timeout"
        " (NVIDIA/nccl#2353, marin-community/marin#7344; fixed in NCCL 2.29.3); use an image"
        " with NCCL 2.29.3 or later\n"
    ) in ran.stderr
    ran = subprocess.run(
        [command], env=environ | {"RANK_MACHINE": "x86_64"}, capture_output=True, text=True
    )
    assert "deadlocks" not in ran.stderr  # the same NCCL elsewhere: no such problem

"""The NCCL test of a cluster: one rank per box in the serving image, judged by NCCL's own log."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import preflight, util
from operations.asked import Question, answer, question
from spark.box_paths import MODELS_DIR, NCCL_RESULT_DIR, NCCL_VERDICT
from spark.ports import TORCH_STORE_PORT

CHECK_SOURCE = Path(__file__).parents[1] / "files" / "nccl_check.py"
CHECK_PATH = "/usr/local/lib/spark/nccl_check.py"
# What the user runs on every box (the deploy runs it there too, on all boxes at once).
COMMAND = "/usr/local/sbin/spark-nccl-test"
RESULT_DIR = NCCL_RESULT_DIR
VERDICT = NCCL_VERDICT
CONTAINER = "spark-nccl-test"
# Seconds a rank waits for the others and runs (a Spark pair moves the 1 GiB sizes in well
# under a minute at 22 GB/s); then it is killed and the verdict says the run did not complete.
TIMEOUT_S = 300


class NcclTestState(FactBase):
    """The last verdict kept on the box (files/nccl_check.py's verdict.json, with the digest of
    what that run depended on), the digest of what a run would depend on now (`spark-nccl-test
    --key`; None before the deploy wrote it), and what a container may get (util).

    .. code:: python

        {"key": "5b1f...", "kept": {"key": "5b1f...", "passed": True, "problems": [],
         "rows": [...], "ranks": [...]}, "rdma": True, "unlimited_memlock": True}
    """

    def command(self) -> str:
        return (
            f'[ -x {COMMAND} ] && echo "key $({COMMAND} --key)";'
            f' [ -f {VERDICT} ] && echo "kept $(tr -d "\\n" < {VERDICT})";'
            f" {util.RIGHTS_COMMAND}; true"
        )

    def process(self, output: list[str]) -> dict:
        fields = dict(line.partition(" ")[::2] for line in output)
        kept = None
        if "kept" in fields:
            try:
                kept = json.loads(fields["kept"])
            except ValueError:
                kept = {"passed": False, "problems": [f"{VERDICT} is not JSON"]}
        return {"key": fields.get("key") or None, "kept": kept} | util.container_rights(fields)


def why_due(kept: dict | None, key: str | None) -> str | None:
    """Why a box's rank must run again; None when its last run passed on what is there now (the
    key covers the test's script and check too: a test that changed is due)."""
    if kept is None:
        return "it never ran"
    if kept.get("key") != key:
        return "what it depends on changed (the test, cluster environment, image)"
    if not kept.get("passed"):
        return f"it failed last time ({'; '.join(kept.get('problems') or ['no verdict'])})"
    return None


def summary(kept: dict) -> str:
    """The kept verdict in a line: the largest all_gather's bus bandwidth and the transport."""
    gathers = [row for row in kept.get("rows", []) if row["op"] == "all_gather"]
    largest = max(gathers, key=lambda row: row["bytes"]) if gathers else None
    devices = sorted({device for rank in kept.get("ranks", []) for device in rank["ib_devices"]})
    said = f"all_gather {largest['bytes']} B at {largest['busbw']:.2f} GB/s" if largest else "-"
    return f"{said} over NET/IB ({', '.join(devices) or '-'})"


@operation()
def prepared(
    rank: int,
    world: int,
    image: str,
    env_names: list[str],
    env_file: str,
    hcas: list[str],
    min_busbw_gbs: float,
    max_bytes: int,
):
    """
    Put the NCCL test on this box (``spark-nccl-test`` and the check it runs), and say whether
    its rank must run when nothing changes: ``passed`` reads every box after this ran on each.

    + rank: this box's rank (0: the head, whose address is MASTER_ADDR)
    + world: the number of boxes
    + image: the serving image the rank runs in (with PyTorch and NCCL)
    + env_names: the names in the cluster environment file, passed to the container
    + env_file: the cluster environment file
    + hcas: the RDMA device of every twin: NCCL must use each one
    + min_busbw_gbs: the pass mark, all_gather bus bandwidth at the largest size
    + max_bytes: the largest message size
    """
    found = answer(NcclTestState)
    docker_run = util.docker_run(CONTAINER, [], found["rdma"], found["unlimited_memlock"])
    files = util.on_box(CHECK_PATH, COMMAND)
    commands = util.put(str(CHECK_SOURCE), CHECK_PATH, found=files)
    commands += util.template(
        "spark-nccl-test.j2",
        COMMAND,
        "755",
        files,
        rank=rank,
        world=world,
        image=shlex.quote(image),
        check=CHECK_PATH,
        command=COMMAND,
        env_file=shlex.quote(env_file),
        result_dir=RESULT_DIR,
        container=CONTAINER,
        timeout=TIMEOUT_S,
        docker_run=shlex.join(docker_run),
        env_names=" ".join(f"-e {name}" for name in env_names),  # valid names: environment.py
        # The ranks' rendezvous (spark/ports.py), which the cluster's firewall admits from the
        # fabric (BACKEND_PORTS); a ring has no cluster firewall (no Ray): its rendezvous is on
        # the management network, open only while the test runs.
        port=TORCH_STORE_PORT,
        max_bytes=max_bytes,
        hcas=shlex.quote(",".join(hcas)),
        min_busbw=f"{min_busbw_gbs:g}",
    )
    yield from commands
    if not commands:
        reason = why_due(found["kept"], found["key"])
        host.noop(f"{COMMAND} is as written; {reason or 'its last run passed'}")


@operation()
def passed(boxes: list[str], waits_for: str | None = None, models_dir: str = MODELS_DIR):
    """
    Run the NCCL test on every box of the cluster at once (``spark-nccl-test``, after
    ``prepared`` ran on each) when one of them must: it never ran, it failed, or what it depends
    on (the test itself included) changed; else nothing. Each box reads every box's verdict.
    Fails this box when any rank fails, its own or a peer's (each rank hands its NCCL log to the
    others, and every box judges them all: the verdict is the cluster's): NCCL fell back to
    sockets, does not use a twin, or the bus bandwidth is under the mark (files/nccl_check.py's
    verdict, on stderr, names the rank, its box and what NCCL reported).

    + boxes: every box of the cluster, as the inventory names them
    + waits_for: the cluster lane's model, fetched in the background: while a box lacks it the
      test waits, saying so (the lane it proves cannot start yet, and the copy over the fabric
      shares the links the test measures); a later deploy runs it. None: nothing to wait for
    + models_dir: the Hugging Face cache the lanes mount

    A run that leaves a box out (``--limit``) runs no rank: the others would wait for it.
    """
    if stopped := util.missing(boxes):
        yield from util.refused(
            f"{host.name}: the NCCL test runs a rank on every box: it {util.waits_for(stopped)};"
            " it runs once every box is back"
        )
        return
    in_run = preflight.boxes_in_run(boxes)
    if absent := [box for box in boxes if box not in in_run]:
        host.noop(f"the NCCL test needs every box in the run; {', '.join(absent)} not in it")
        return
    if waits_for is not None:
        lacking = [
            box
            for box in boxes
            if not answer(
                preflight.ModelWeights, of=in_run[box], model=waits_for, models_dir=models_dir
            )
        ]
        if lacking:
            # Said without -v (a noop's words are not): the deploy's report of the wait.
            host.log(
                f"the NCCL test waits for {waits_for}, not yet on {', '.join(lacking)}:"
                " the cluster lane comes up once it lands on every box; a later deploy runs"
                " the test"
            )
            return
    # Each box reads every box's kept verdict itself: the same answer on each, so all run a
    # rank or none. A verdict changes only when its box's rank ends, which needs every rank.
    found = {box: answer(NcclTestState, of=in_run[box]) for box in boxes}
    due = {box: why_due(found[box]["kept"], found[box]["key"]) for box in boxes}
    if not any(due.values()):
        host.noop(f"the NCCL test passed: {summary(found[host.name]['kept'] or {})}")
        return
    host.log(", ".join(f"{box}: {reason}" for box, reason in due.items() if reason))
    yield COMMAND


def questions(waits_for: str | None = None, models_dir: str = MODELS_DIR) -> list[Question]:
    """What ``prepared`` and ``passed`` read of this box (operations/asked.py)."""
    return [
        question(NcclTestState),
        question(util.RootFiles, paths=(CHECK_PATH, COMMAND)),
        *(
            [question(preflight.ModelWeights, model=waits_for, models_dir=models_dir)]
            if waits_for
            else []
        ),
    ]

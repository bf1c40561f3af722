"""Each stage's questions (its ``questions``, which deploy.py says ahead: operations/asked.py)
against what its operations read through the ask-once layer (``answer``), each stage run on the
fake host as pyinfra would run it on a bare box (every fact's command printing nothing), for the
plans of a pair's head and worker, a cluster lane on vLLM's own ranks fetching its model, and a
ring; and deploy.py saying every stage's, once each, in stage order, before the first stage runs.

A question read but not said ahead is asked in a command of its own on every run (a no-change
run among them); one said ahead but never read is asked for nothing. Some are read only on a box
where something is already there (a profile, a running lane): those are written below, each with
the reason, so that a list that drifts from its operations fails here by name.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from pyinfra.api import Config, FactBase, Inventory, State
from pyinfra.context import ctx_host, ctx_inventory, ctx_state
from pyinfra_cli.util import exec_file

import operations
from operations import asked, firewall
from operations.asked import Question
from spark.plan import BoxPlan
from stages import cluster, deploy_file, fabric, host_layer, lanes_front, router
from tests.unit.harness import FAKE_STATE, FakeHost, captured, run_op
from tests.unit.test_config import REPO, TWO_SPARKS, merged
from tests.unit.test_plan import fetching_cluster_pair, planned
from tests.unit.test_topology import ring


class BareBox(FakeHost):
    """A box with nothing on it: every fact's command printed nothing (its ``process([])``, or
    its ``default()`` where a parser wants a line), but those whose command prints on any box
    (the captures of BARE)."""

    def get_fact(self, fact_cls: type[FactBase], *args: Any, **kwargs: Any) -> Any:
        if fact_cls in self.outputs:
            return super().get_fact(fact_cls, *args, **kwargs)
        fact = fact_cls()
        fact.command(*args, **kwargs)  # as pyinfra does: some keep their arguments there
        try:
            return fact.process([])
        except (ValueError, IndexError, KeyError):
            return fact.default()


# lab-bare-firewall.txt: FirewallState on a bare lab host (the kernel's ephemeral range is
# always there).
BARE = {firewall.FirewallState: captured("lab-bare-firewall.txt")}


class Recorded(asked.Asked):
    """The ask-once layer of the run (asked.following finds it): each question an operation
    reads through ``answer``, by the box it reads it of, then pyinfra's own read of it."""

    def __init__(self) -> None:
        super().__init__()
        self.read: dict[str, list[Question]] = {}

    def answer(self, run: Any, box: Any, fact: type[FactBase], arguments: dict[str, Any]) -> Any:
        self.read.setdefault(box.name, []).append(asked.question(fact, **arguments))
        return box.get_fact(fact, **arguments)


def every_operation() -> Iterator[tuple[Any, str, Callable]]:
    """Each operation of operations/ (pyinfra's @operation keeps its generator as ``_inner``)."""
    for info in pkgutil.iter_modules(operations.__path__):
        module = importlib.import_module(f"operations.{info.name}")
        for attribute, value in vars(module).items():
            if hasattr(value, "_inner") and getattr(value, "__module__", None) == module.__name__:
                yield module, attribute, value


@contextmanager
def operations_on(box: FakeHost) -> Iterator[None]:
    """While inside: each operation a stage calls runs its generator on ``box`` at once (its
    global arguments, ``name`` and ``_if``, dropped), as run_op runs one."""

    def on_box(operation: Callable) -> Callable:
        def called(*args: Any, **kwargs: Any) -> SimpleNamespace:
            given = {key: value for key, value in kwargs.items() if key != "name"}
            run_op(operation, *args, host=box, **{k: v for k, v in given.items() if k[0] != "_"})
            return SimpleNamespace(did_change=lambda: False, did_succeed=lambda: True)

        return called

    found = list(every_operation())
    with pytest.MonkeyPatch.context() as patch:
        for module, attribute, operation in found:
            patch.setattr(module, attribute, on_box(operation))
        yield


def stage_run(stage: Callable, plan: BoxPlan, boxes: list[str]) -> set[Question]:
    """The questions ``stage``'s operations read of ``plan``'s box, on a bare box in a run of
    ``boxes`` (all connected, none failed)."""
    box = BareBox(BARE, name=plan.name)
    others = [box, *(BareBox(BARE, name=name) for name in boxes if name != plan.name)]
    recorded = Recorded()
    run = SimpleNamespace(
        **vars(FAKE_STATE)
        | {
            "callback_handlers": [recorded],
            "inventory": SimpleNamespace(
                get_active_hosts=lambda: others, get_host=lambda name: others[boxes.index(name)]
            ),
            "failed_hosts": [],
        }
    )
    with ctx_state.use(run), ctx_host.use(box), operations_on(box):
        stage._inner(plan)
    return set(recorded.read.get(plan.name, []))


def names(questions: set[Question]) -> set[str]:
    """Each question as ``Fact(argument=value, ...)``, for a failure that reads."""
    return {
        f"{fact.__name__}({', '.join(f'{key}={value!r}' for key, value in arguments)})"
        for fact, arguments in questions
    }


PAIR = planned(merged(TWO_SPARKS))
CLUSTER_LANE_MP = planned(fetching_cluster_pair("mp"))
RING = planned(ring())
PLANS = {
    "pair head": (PAIR, "spark-1"),
    "pair worker": (PAIR, "spark-2"),
    "cluster lane on mp, fetched, head": (CLUSTER_LANE_MP, "spark-1"),
    "cluster lane on mp, fetched, worker": (CLUSTER_LANE_MP, "spark-2"),
    "ring box": (RING, "spark-2"),
}
# Each stage module and its deploy.
STAGES: dict[ModuleType, Callable] = {
    host_layer: host_layer.host_layer,
    fabric: fabric.fabric,
    lanes_front: lanes_front.lanes_and_front,
    cluster: cluster.cluster,
}

# Said ahead but read only where something is already there, as on a no-change run (each
# operation's own tests read them there): why the bare box leaves each unread.
READ_WHERE_THERE = {
    "DockerDaemon": "docker's running daemon, once daemon.json has the nvidia runtime"
    " (toolkit.docker_runtime)",
    "LogindRunningRemoveIpc": "logind's running RemoveIPC, once the drop-in is as written"
    " (hygiene.logind_keep_ipc)",
    "LiveLink": "a twin's live link, once its profile is active and as written (nmcli.ethernet)",
    "RootFiles": "the GRUB drop-in, on a kernel that turns kexec handover on (kernel 7.0 and"
    " later: kernel.handover_off)",
    "LaneAnswer": "the canary's answer, from a lane left running (lanes.serving)",
    "QueuedStart": "whether the lane's start waits behind its fetch, once the fetch unit is"
    " activating (lanes.serving)",
}
# Read, not said ahead: only where the operation is about to change the box (a pull, a fetch),
# which a no-change run never is.
READ_BEFORE_A_CHANGE = {
    "RegistryImage": "the registry's answer, for an image the box lacks (images.image_present)",
    "HubListing": "the hub's listing, for a model the box lacks (weights.fetched)",
}
IMAGE = "RegistryImage(image='nvcr.io/nvidia/vllm:26.04-py3')"
HUB = (
    "HubListing(endpoint='https://huggingface.co', model='Qwen/Qwen3-235B-A22B-GPTQ-Int4',"
    " token_path=None)"
)
CANARIES = {"LaneAnswer(lane='coder', port=11101)", "LaneAnswer(lane='fast', port=11102)"}
PORT_1 = {"LiveLink(ifname='enp1s0f1np1')", "LiveLink(ifname='enP2p1s0f1np1')"}
KHO = "RootFiles(paths=('/etc/default/grub.d/99-spark-kho-off.cfg',))"
QUEUED = "QueuedStart(unit='spark-lane-big.service')"


def check(stage: ModuleType, label: str, unread: set[str], unasked: set[str]) -> None:
    """The stage module's questions on ``label``'s box: those said ahead and not read on a bare
    box are ``unread``, those read and not said ahead ``unasked``, each of a fact explained
    above."""
    plan, name = PLANS[label]
    box = plan.box(name)
    declared = set(stage.questions(box))
    read = stage_run(STAGES[stage], box, [other.name for other in plan.boxes])
    assert (names(declared - read), names(read - declared)) == (unread, unasked)
    assert {said.partition("(")[0] for said in unread} <= set(READ_WHERE_THERE)
    assert {said.partition("(")[0] for said in unasked} <= set(READ_BEFORE_A_CHANGE)


@pytest.mark.parametrize("label", list(PLANS))
def test_the_host_layer_says_ahead_what_it_reads(label: str) -> None:
    check(
        host_layer,
        label,
        {"DockerDaemon(service='docker.service')", "LogindRunningRemoveIpc()"},
        set(),
    )


@pytest.mark.parametrize(
    ("label", "unread"),
    [
        ("pair head", {*PORT_1, KHO}),
        ("pair worker", {*PORT_1, KHO}),
        ("cluster lane on mp, fetched, head", {*PORT_1, KHO}),
        ("cluster lane on mp, fetched, worker", {*PORT_1, KHO}),
        # A ring's boxes cable both ports.
        (
            "ring box",
            {*PORT_1, "LiveLink(ifname='enp1s0f0np0')", "LiveLink(ifname='enP2p1s0f0np0')", KHO},
        ),
    ],
)
def test_the_fabric_stage_says_ahead_what_it_reads(label: str, unread: set[str]) -> None:
    check(fabric, label, unread, set())


@pytest.mark.parametrize(
    ("label", "unread", "unasked"),
    [
        ("pair head", CANARIES, {IMAGE}),
        ("pair worker", CANARIES, {IMAGE}),
        # The cluster lane's box has no lane of its own: its image comes in the cluster stage.
        ("cluster lane on mp, fetched, head", set(), {IMAGE}),
        ("cluster lane on mp, fetched, worker", set(), set()),
        ("ring box", CANARIES, {IMAGE}),
    ],
)
def test_the_lanes_and_front_stage_says_ahead_what_it_reads(
    label: str, unread: set[str], unasked: set[str]
) -> None:
    check(lanes_front, label, unread, unasked)


@pytest.mark.parametrize(
    ("label", "unread", "unasked"),
    [
        ("pair head", set(), set()),  # Ray pulls its own image (operations/ray.py)
        ("pair worker", set(), set()),
        (
            "cluster lane on mp, fetched, head",
            {"LaneAnswer(lane='big', port=11103)", QUEUED},
            {HUB, IMAGE},
        ),
        # The worker's rank is headless: no API, no canary.
        ("cluster lane on mp, fetched, worker", {QUEUED}, {HUB, IMAGE}),
        ("ring box", set(), {IMAGE}),  # no Ray on a ring: the NCCL test pulls its image
    ],
)
def test_the_cluster_stage_says_ahead_what_it_reads(
    label: str, unread: set[str], unasked: set[str]
) -> None:
    check(cluster, label, unread, unasked)


class Marker(FactBase):
    """A question standing for one stage's whole list, named after the stage."""

    def command(self, stage: str) -> str:
        return f"echo {stage}"


def test_deploy_says_every_stages_questions_once_in_stage_order_before_the_first_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # deploy.py as pyinfra's command line runs it (pyinfra_cli/util.py exec_file) for spark-1 of
    # a pair, each stage's questions a marker and each stage recording, when called, the groups
    # said ahead by then.
    said: list[tuple[str, list[tuple[Question, ...]]]] = []
    for module, stage, name in [
        (host_layer, "host_layer", "host layer"),
        (fabric, "fabric", "fabric"),
        (lanes_front, "lanes_and_front", "lanes and front"),
        (cluster, "cluster", "cluster"),
        (router, "fleet_router", "router"),
    ]:
        monkeypatch.setattr(
            module, "questions", lambda *plans, name=name: [asked.question(Marker, stage=name)]
        )
        monkeypatch.setattr(
            module,
            stage,
            lambda box, *rest, name=name, **arguments: said.append(
                (f"{name} of {box.name}", list(asked.following(run).ahead[box.name]))
            ),
        )
    monkeypatch.setattr(deploy_file, "known_to_inspect", lambda path: None)  # no module left
    monkeypatch.chdir(REPO)  # deploy.py refuses to run elsewhere
    pair = Inventory((list(merged(TWO_SPARKS).items()), {}))
    run = State()
    run.init(pair, Config())
    spark_1 = pair.get_host("spark-1")
    with ctx_state.use(run), ctx_inventory.use(pair), ctx_host.use(spark_1):
        exec_file(str(REPO / "deploy.py"))

    groups = [
        (asked.question(Marker, stage=name),)
        for name in ["host layer", "fabric", "lanes and front", "cluster", "router"]
    ]
    assert said == [
        ("host layer of spark-1", groups),
        ("fabric of spark-1", groups),
        ("lanes and front of spark-1", groups),
        ("cluster of spark-1", groups),
        ("router of spark-1", groups),
    ]

"""vLLM lanes: the facts, the lane unit, removal, image, HF token and the memory guard.

Captures (the command of the fact LaneHost, which asked what LaneUnits, LocalImages and
LaneServing ask now, in the same commands and line format, run under sudo on the simulated lab,
Debian 12, systemd 252, docker 20.10, the serving stand-in image; each fact is given the lines
its own command prints, picked by their first word):
- lab-lanehost-serving.txt: spark-1 after a deploy of the two default lanes.
- lab-lanehost-port-taken.txt: spark-2 with lane fast stopped and `python3 -m http.server 10102`
  (a transient unit) holding its port.
- lab-lanehost-bare.txt: spark-2 freshly reimaged (no docker image, no lane, no secrets).
- lanehost-full-caps.sample.txt: lab-lanehost-serving.txt with CapEff edited by hand to a full
  root set (CAP_SYS_RESOURCE included), as on a real box; the lab's sandbox withholds it.
- lab-systemctl-memguard-*.txt: pyinfra's SystemdStatus/SystemdEnabled commands for the guard on
  spark-1 (running, then stopped by hand).
- lab-stat-memguard-script-0755.txt: pyinfra's File stat line for the deployed guard script.
- lab-proc-meminfo.txt, lab-systemctl-lane-states.txt: what the guard reads on spark-1 (lane fast
  stopped by hand; spark-lane-gone has no unit file), read before the guard asked for SubState.
- systemctl-lane-substates.sample.txt: written by hand in `systemctl show -p Id -p ActiveState
  -p SubState` form: a lane waiting to restart, one serving, a cluster lane in its ExecStartPre.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import selectors
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jinja2
import pytest
from pyinfra.facts.files import File, Sha1File
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from operations import lanes, memguard, util, weights
from spark import box_paths
from spark.catalog import ModelSpec
from spark.inventory import ConfigError, load_from_dicts
from spark.lane import Lane, MpRank
from spark.plan import ServedLane, served_lane
from tests.simlab.waits import until
from tests.unit.harness import FakeHost, captured, file_facts, process, refusal, run_op
from tests.unit.test_config import TWO_SPARKS, merged

UNIT = "/etc/systemd/system/spark-lane-coder.service"
ENV = "/etc/spark/lanes/coder.env"
IMAGE = "nvcr.io/nvidia/vllm:26.04-py3"
ENVIRONMENT = {"RAY_memory_monitor_refresh_ms": "0", "VLLM_NVFP4_GEMM_BACKEND": "marlin"}
RESTART = (
    "systemctl reset-failed spark-lane-coder.service; systemctl restart spark-lane-coder.service"
    " || { journalctl -u spark-lane-coder.service -n 40 --no-pager >&2; exit 1; }"
)
LANE = {
    "name": "coder",
    "image": IMAGE,
    "model": "org/model",
    "served_name": "coder",
    "port": 10101,
    "memory_fraction": 0.3,
    "max_model_len": 8192,
    "model_spec": ModelSpec(
        weights_gib=1.5, attention_layers=28, kv_heads=8, head_dim=128, quantization="bf16"
    ),
}
# The scripts lanes.serving writes beside the units.
SCRIPTS = (lanes.TURN_COMMAND, lanes.CANARY_COMMAND, lanes.BENCH_COMMAND, lanes.RANKS_COMMAND)
# The lines of a LaneHost capture that each fact's own command prints.
KINDS = {
    lanes.LaneUnits: ("unit",),
    lanes.LocalImages: ("image",),
    lanes.LaneServing: ("secrets", "key", "listen", "cgroup", "container", "rdma", "capeff"),
}


def lines_of(fact: type, capture: str) -> str:
    return "".join(
        line for line in capture.splitlines(True) if (line.split() or [""])[0] in KINDS[fact]
    )


def lane_facts(capture: str) -> dict[Any, str | None]:
    """FakeHost outputs of the three lane facts, from the text of a LaneHost capture (None where
    a fact's command prints nothing: pyinfra then gives the fact's default)."""
    return {fact: lines_of(fact, capture) or None for fact in KINDS}


# The canary asked again of a serving lane (lanes.LaneAnswer's command), written by hand from
# what templates/spark-lane-canary.j2 prints and the exit status the fact's command echoes.
ANSWERED = 'lane coder: canary passed: "42 harbor"\nexit 0\n'
GIBBERISH = (
    "lane coder: canary failed: not the right number (17 + 25 = 42); asked 'What is 17 + 25?"
    " Reply with the number, then the word harbor, and nothing else.', answer \"Theorem quantum"
    ' banana"\nlane coder: not serving; usual causes for this lane:\nlane coder:  - a chat'
    " template that does not fit the model\nexit 1\n"
)


def lane_unit(lane: dict[str, Any] | None = None, **changes: Any) -> ServedLane:
    """The plan's unit of lane coder (with ``lane``'s keys changed) and these unit values."""
    unit = {"environment": ENVIRONMENT, "after": None, "start_timeout_s": 600} | changes
    return served_lane(Lane.model_validate(LANE | (lane or {})), **unit)


def lane_host(fact: str, files: dict[str, str | None], turn_script: bool = True) -> FakeHost:
    """A box as the capture shows it, with these files, and the lanes' turn script in place as
    the deploy writes it (absent with turn_script=False)."""
    scripts = scripts_text() if turn_script else {}
    known = dict.fromkeys(SCRIPTS) | scripts
    host = FakeHost(
        file_facts(files | known) | lane_facts(captured(fact)) | {lanes.LaneAnswer: ANSWERED}
    )
    for path in scripts:  # a root:root 0755 file's stat line
        stat = captured("lab-stat-memguard-script-0755.txt")
        host.outputs[(File, (("path", path),))] = stat
    return host


@cache
def scripts_text() -> dict[str, str]:
    """The turn, canary, bench and rendezvous watch scripts as the deploy renders them (it
    writes them where absent; the watch for a cluster lane on executor mp only)."""
    host = lane_host("lab-lanehost-bare.txt", dict.fromkeys(paths()), turn_script=False)
    run_op(lanes.serving, host=host, unit=lane_unit(MP, **MP_HEAD))
    return {path: host.uploads[path] for path in SCRIPTS}


def turn_script_text() -> str:
    return scripts_text()[lanes.TURN_COMMAND]


def paths(lane: str = "coder") -> tuple[str, str]:
    """A lane's unit and environment file."""
    return UNIT.replace("coder", lane), ENV.replace("coder", lane)


def rendered(fact: str = "lab-lanehost-bare.txt", **kwargs: Any) -> dict[str, str]:
    """The unit and environment file the operation writes on a box without them."""
    unit = lane_unit(**kwargs)
    host = lane_host(fact, dict.fromkeys(paths(unit.name)))
    run_op(lanes.serving, host=host, unit=unit)
    return {path: host.uploads[path] for path in paths(unit.name)}


def exec_start(unit: str) -> str:
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))


# --- the fact ------------------------------------------------------------------------------------


def test_lane_facts_on_a_serving_box() -> None:
    serving = captured("lab-lanehost-serving.txt")
    assert process(lanes.LaneUnits, lines_of(lanes.LaneUnits, serving)) == {
        "coder": {"ActiveState": "active", "UnitFileState": "enabled"},
        "fast": {"ActiveState": "active", "UnitFileState": "enabled"},
    }
    assert process(lanes.LocalImages, lines_of(lanes.LocalImages, serving)) == {IMAGE}
    fact = process(lanes.LaneServing, lines_of(lanes.LaneServing, serving))
    assert fact["keys"] == {"coder": "root 600", "fast": "root 600"}
    assert fact["secrets_dir"] == "root 700"
    assert fact["listeners"] == {
        22: "sshd",
        10101: "spark-lane-coder",
        10102: "spark-lane-fast",
        33371: "containerd",
    }
    assert fact["rdma"] is True
    assert fact["unlimited_memlock"] is False  # the lab's sandbox: no CAP_SYS_RESOURCE


def test_lane_facts_on_a_bare_box_and_a_taken_port() -> None:
    bare = lane_facts(captured("lab-lanehost-bare.txt"))
    assert (bare[lanes.LaneUnits], bare[lanes.LocalImages]) == (None, None)  # no output
    assert (lanes.LaneUnits().default(), lanes.LocalImages().default()) == ({}, set())
    assert lanes.LaneServing().default()["listeners"] == {}
    serving = process(lanes.LaneServing, bare[lanes.LaneServing])
    assert (serving["keys"], serving["secrets_dir"]) == ({}, None)
    assert serving["listeners"] == {22: "sshd", 35293: "containerd"}
    taken = lane_facts(captured("lab-lanehost-port-taken.txt"))
    assert process(lanes.LaneServing, taken[lanes.LaneServing])["listeners"][10102] == "python3"
    assert process(lanes.LaneUnits, taken[lanes.LaneUnits])["fast"]["ActiveState"] == "inactive"
    full = lane_facts(captured("lanehost-full-caps.sample.txt"))[lanes.LaneServing]
    assert process(lanes.LaneServing, full)["unlimited_memlock"]


@pytest.mark.parametrize("fact", list(KINDS))
def test_lane_fact_commands_never_fail_where_nothing_is_there(fact: type) -> None:
    result = subprocess.run(
        ["sh", "-c", fact().command()], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert isinstance(process(fact, result.stdout), dict | set)


# --- quoting ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "word"),
    [
        ("--port", "--port"),
        ("org/model-1.5", "org/model-1.5"),
        ("a b", '"a b"'),
        ('{"k": 1}', '"{\\"k\\": 1}"'),
        ("50%", '"50%%"'),
        ("$HOME", '"$$HOME"'),
        ("back\\slash", '"back\\\\slash"'),
    ],
)
def test_systemd_word(arg: str, word: str) -> None:
    # Read back as systemd 252 does on the lab (tests/e2e/test_lanes.py sends such arguments).
    assert lanes.systemd_word(arg) == word


def test_serve_script_reads_the_key_into_vllms_variable_and_quotes_each_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "api-key"
    key.write_text("s3cret")
    monkeypatch.setattr(lanes, "KEY_IN_CONTAINER", str(key))
    vllm = tmp_path / "vllm"
    vllm.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        'print(json.dumps([sys.argv[1:], os.environ.get("VLLM_API_KEY")]))\n'
    )
    vllm.chmod(0o755)
    args = ["org/m", "--served-model-name", "a b", "--x", "$(touch pwned)", "'q'"]
    for api_key, expected in ((True, "s3cret"), (False, None)):
        script = lanes.serve_script(["vllm", "serve", *args], "VLLM_API_KEY" if api_key else None)
        assert "s3cret" not in script
        result = subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, check=True,
            env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, cwd=tmp_path,
        )  # fmt: skip
        assert json.loads(result.stdout) == [["serve", *args], expected]
    assert not (tmp_path / "pwned").exists()
    key.unlink()  # an unreadable key stops the container instead of serving without one
    script = lanes.serve_script(["vllm", "serve", *args], "VLLM_API_KEY")
    failed = subprocess.run(["sh", "-c", script], capture_output=True)
    assert failed.returncode == 1


# --- one lane -------------------------------------------------------------------------------------


def test_fresh_box_gets_key_files_and_a_started_lane() -> None:
    host = lane_host("lab-lanehost-bare.txt", {UNIT: None, ENV: None})
    commands = run_op(lanes.serving, host=host, unit=lane_unit())
    assert commands[0] == "install -d -m 700 -o root -g root /etc/spark/secrets"
    assert commands[1].startswith("[ -s /etc/spark/secrets/coder.key ] || ( umask 077;")
    assert commands[-3:] == [
        "systemctl daemon-reload",
        "systemctl enable spark-lane-coder.service",
        RESTART,
    ]
    unit, env = host.uploads[UNIT], host.uploads[ENV]
    assert env.splitlines()[-2:] == [
        "RAY_memory_monitor_refresh_ms=0",
        "VLLM_NVFP4_GEMM_BACKEND=marlin",
    ]
    start = exec_start(unit)
    assert start.startswith(
        "ExecStart=/usr/bin/docker run --rm --name spark-lane-coder --gpus all --network host"
        " --ipc host --oom-score-adj 500 --device /dev/infiniband"
        " --env-file /etc/spark/lanes/coder.env -v /var/lib/spark/models:/root/.cache/huggingface"
        " -v /etc/spark/secrets/coder.key:/run/secrets/api-key:ro nvcr.io/nvidia/vllm:26.04-py3"
        ' /bin/sh -c "VLLM_API_KEY=$$(cat /run/secrets/api-key) || exit 1; export VLLM_API_KEY;'
        " exec vllm serve org/model --served-model-name coder --host 127.0.0.1 --port 11101"
    )
    assert "--ulimit" not in start  # the lab cannot lift memlock: docker would refuse to start
    assert "TimeoutStartSec=600\n" in unit
    assert "After=docker.service network-online.target\n" in unit
    assert "http://127.0.0.1:11101/health" in unit  # vLLM's own port, not the front's


def test_lane_in_place_and_serving_yields_nothing() -> None:
    host = lane_host("lab-lanehost-serving.txt", rendered())
    assert run_op(lanes.serving, host=host, unit=lane_unit()) == []
    assert host.noops[-1] == "lane coder is serving on port 10101, answering right"


def test_a_lane_in_place_answering_garbage_stops_the_deploy_quoting_it() -> None:
    host = lane_host("lab-lanehost-serving.txt", rendered())
    host.outputs[lanes.LaneAnswer] = GIBBERISH
    message = refusal(run_op(lanes.serving, host=host, unit=lane_unit()))
    assert message.startswith("spark-test: lane coder serves wrong answers:\nlane coder: canary")
    assert '"Theorem quantum banana"' in message and "exit 1" not in message


def test_lane_answer_fact_asks_the_canary_and_reads_its_exit() -> None:
    assert lanes.LaneAnswer().command("coder", 11101) == (
        '/usr/local/sbin/spark-lane-canary coder 11101; echo "exit $?"'
    )
    assert process(lanes.LaneAnswer, ANSWERED) is None
    assert process(lanes.LaneAnswer, GIBBERISH).splitlines()[-1].endswith("does not fit the model")


def test_a_changed_model_rewrites_the_unit_and_restarts_only_this_lane() -> None:
    host = lane_host("lab-lanehost-serving.txt", rendered())
    commands = run_op(lanes.serving, host=host, unit=lane_unit({"model": "org/other"}))
    assert commands[0].startswith("FileUploadCommand(") and UNIT in commands[0]
    assert commands[-2:] == ["systemctl daemon-reload", RESTART]
    assert "vllm serve org/other " in exec_start(host.uploads[UNIT])
    assert not any("spark-lane-fast" in command for command in commands)


def test_a_changed_environment_restarts_the_lane_without_a_daemon_reload() -> None:
    host = lane_host("lab-lanehost-serving.txt", rendered())
    unit = lane_unit(environment={"HF_HUB_OFFLINE": "1"})
    commands = run_op(lanes.serving, host=host, unit=unit)
    assert ENV in commands[0]
    assert commands[-1] == RESTART
    assert "systemctl daemon-reload" not in commands
    assert host.uploads[ENV].splitlines()[-1] == "HF_HUB_OFFLINE=1"


def test_a_stopped_lane_is_started_not_rewritten() -> None:
    fast = {"name": "fast", "port": 10102}
    files = rendered(lane=fast)
    # The serving capture with lane fast's state edited by hand to "failed".
    failed = captured("lab-lanehost-serving.txt").replace(
        "unit ActiveState=active\nunit UnitFileState=enabled\nsecrets",
        "unit ActiveState=failed\nunit UnitFileState=enabled\nsecrets",
    )
    host = lane_host("lab-lanehost-serving.txt", files)
    host.outputs |= lane_facts(failed)
    commands = run_op(lanes.serving, host=host, unit=lane_unit(fast))
    assert commands == [RESTART.replace("coder", "fast").replace("restart ", "start ")]


FETCH = "spark-fetch-org--model.service"


def stopped_lane_fetching(active: str, queued: str = "") -> tuple[list[str], FakeHost]:
    """Lane coder, enabled and stopped (the serving capture's state edited by hand), its model's
    fetch ``active`` (weights.FetchState's first line), ``queued`` what `systemctl list-jobs`
    says of the lane (its line format: job, unit, type, state, as the lab's systemd 255 prints
    it)."""
    files = rendered(fetch_unit=FETCH)
    stopped = captured("lab-lanehost-serving.txt").replace(
        "unit Id=spark-lane-coder.service\nunit ActiveState=active",
        "unit Id=spark-lane-coder.service\nunit ActiveState=inactive",
    )
    host = lane_host("lab-lanehost-serving.txt", files)
    host.outputs |= lane_facts(stopped) | {
        weights.FetchState: f"{active}\nbytes 0",
        lanes.QueuedStart: queued,
    }
    return run_op(lanes.serving, host=host, unit=lane_unit(fetch_unit=FETCH)), host


def test_a_lane_whose_model_is_fetching_is_ordered_after_it_and_left_queued() -> None:
    assert f"\nAfter={FETCH}\n" in rendered(fetch_unit=FETCH)[UNIT]
    assert "spark-fetch" not in rendered()[UNIT]
    queued = "490 spark-lane-coder.service start waiting"
    commands, host = stopped_lane_fetching("activating", queued)
    assert commands == []
    assert host.noops[-1] == f"lane coder: starts once {FETCH} lands"
    # Stopped by hand meanwhile, nothing queued: queued again, without waiting.
    commands, _ = stopped_lane_fetching("activating")
    assert commands == ["systemctl start --no-block spark-lane-coder.service"]


def test_queued_start_reads_systemctl_list_jobs() -> None:
    # The line format of `systemctl list-jobs --no-legend --plain` (systemd 255, the lab's).
    assert process(lanes.QueuedStart, "490 spark-lane-coder.service start waiting") is True
    assert process(lanes.QueuedStart, "491 spark-lane-coder.service stop running") is False
    assert process(lanes.QueuedStart, "") is False
    assert lanes.QueuedStart().command("spark-lane-coder.service") == (
        "systemctl list-jobs --no-legend --plain spark-lane-coder.service 2>/dev/null; true"
    )


def test_a_lane_whose_fetch_is_over_is_started_after_a_wait_for_it() -> None:
    commands, _ = stopped_lane_fetching("active")
    # The lane's start queued while the fetch runs, up to FETCH_WAIT_S (10) seconds for it to
    # land, then the start as any stopped lane's (test_fetch_unit.py runs this shell).
    running = f'[ "$(systemctl show -p ActiveState --value {FETCH})" = activating ]'
    wait = (
        f"if {running}; then systemctl start --no-block spark-lane-coder.service; n=0;"
        f" while {running} && [ $n -lt 10 ]; do sleep 1; n=$((n + 1)); done;"
        f" if {running}; then echo 'spark-lane-coder.service: starts once {FETCH} lands';"
        " exit 0; fi; fi"
    )
    assert commands == [f"{wait}; {RESTART.replace('restart ', 'start ')}"]


def test_a_port_held_by_another_service_is_refused_by_name() -> None:
    host = lane_host("lab-lanehost-port-taken.txt", {})
    assert re.search(
        r"spark-test: port 10102 of lane fast is taken by"
        r" python3; stop that service or give the lane another port",
        refusal(run_op(lanes.serving, host=host, unit=lane_unit({"name": "fast", "port": 10102}))),
    )


def test_a_key_with_a_loose_mode_is_tightened_without_a_restart() -> None:
    host = lane_host("lab-lanehost-serving.txt", rendered())
    # The serving capture with the key's mode changed by hand.
    host.outputs |= lane_facts(
        captured("lab-lanehost-serving.txt").replace("coder.key root 600", "coder.key root 644")
    )
    commands = run_op(lanes.serving, host=host, unit=lane_unit())
    key = "/etc/spark/secrets/coder.key"
    assert commands == [f"chown root:root {key} && chmod 600 {key}"]


def test_a_lane_without_a_key_mounts_none_and_a_token_when_asked() -> None:
    files = rendered(lane={"api_key": False}, hf_token=True)
    start = exec_start(files[UNIT])
    assert "api-key" not in start and "VLLM_API_KEY" not in start
    assert "-v /etc/spark/secrets/hf-token:/run/secrets/hf-token:ro" in start
    assert "HF_TOKEN_PATH=/run/secrets/hf-token\n" in files[ENV]
    host = lane_host("lab-lanehost-bare.txt", {UNIT: None, ENV: None})
    commands = run_op(lanes.serving, host=host, unit=lane_unit({"api_key": False}))
    assert not any("secrets" in command for command in commands)


def test_a_model_directory_of_the_users_is_mounted_read_only_where_the_lane_names_it() -> None:
    start = exec_start(rendered(lane={"model": "/srv/models/coder"})[UNIT])
    assert "-v /srv/models/coder:/srv/models/coder:ro" in start
    assert ":/srv/models/coder" not in exec_start(rendered()[UNIT])


def test_a_lane_never_downloads_its_weights_unless_its_own_environment_says_so() -> None:
    # The deploy puts the weights on the box first (preflight.model_present).
    assert "HF_HUB_OFFLINE=1\n" in rendered()[ENV]
    online = rendered(lane={"environment": {"HF_HUB_OFFLINE": "0"}})[ENV]
    assert "HF_HUB_OFFLINE=0\n" in online and "HF_HUB_OFFLINE=1" not in online


def test_memlock_is_lifted_where_root_may_and_the_order_is_in_the_unit() -> None:
    host = lane_host("lanehost-full-caps.sample.txt", {UNIT: None, ENV: None})
    run_op(lanes.serving, host=host, unit=lane_unit(after="coder-a"))
    unit = host.uploads[UNIT]
    assert " --ulimit memlock=-1 --device /dev/infiniband " in exec_start(unit)
    assert "After=docker.service network-online.target spark-lane-coder-a.service\n" in unit
    assert "\nWants=spark-lane" not in unit  # ordered only: a stopped lane stays stopped


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"after": "a b"},
            "after: 'a b' is no lane name (1-32 of a-z 0-9 -, a letter or digit first);"
            " rename that lane",
        ),
        (
            {"environment": {"A": "x\ny"}},
            "variables[A]: 'x\\ny' has a line break or NUL, which a unit cannot carry; remove it",
        ),
        (
            {"environment": {"1A": "x"}},
            "variables[1A]: '1A' is no variable name (A-Z a-z 0-9 _, no digit first); rename it",
        ),
    ],
)
def test_what_a_unit_cannot_carry_stops_this_box_alone(
    changes: dict[str, Any], problem: str
) -> None:
    # A failed command on this box (util.refused), not an exception that would end the run of
    # every box; the inventory's checks refuse these before any box is contacted.
    host = lane_host("lab-lanehost-bare.txt", {UNIT: None, ENV: None})
    commands = run_op(lanes.serving, host=host, unit=lane_unit(**changes))
    assert refusal(commands) == f"spark-test: lane coder: {problem}"


def test_a_command_word_with_a_line_break_stops_this_box_alone() -> None:
    # systemd reads a unit line by line, and no quoting carries a line break (systemd.syntax).
    host = lane_host("lab-lanehost-bare.txt", {UNIT: None, ENV: None})
    unit = lane_unit().model_copy(update={"argv": ("vllm", "serve", "a\rb\0c")})
    assert refusal(run_op(lanes.serving, host=host, unit=unit)) == (
        "spark-test: lane coder: argv[2]: 'a\\rb\\x00c' has a line break or NUL, which a unit"
        " cannot carry; remove it"
    )


# --- removal, image, token ------------------------------------------------------------------------


def test_a_lane_no_longer_configured_is_stopped_disabled_and_removed() -> None:
    host = FakeHost(lane_facts(captured("lab-lanehost-serving.txt")))
    assert run_op(lanes.lanes_removed, host=host, keep=["coder"]) == [
        "systemctl disable --now spark-lane-fast.service",
        # The container by name (the unit's `docker run --rm --name spark-lane-fast`).
        "docker rm -f spark-lane-fast >/dev/null 2>&1 || true",
        "rm -f /etc/systemd/system/spark-lane-fast.service /etc/spark/lanes/fast.env",
        "systemctl daemon-reload",
        "systemctl reset-failed spark-lane-fast.service || true",
    ]


def test_configured_lanes_are_left_alone() -> None:
    host = FakeHost(lane_facts(captured("lab-lanehost-serving.txt")))
    assert run_op(lanes.lanes_removed, host=host, keep=["coder", "fast", "new"]) == []
    assert host.noops == ["no lane unit to remove"]


DIGEST = "sha256:cbbf2f9a99b47fc460d422812b6a5adff7dfee951d8fa2e4a98caa0382cfbdbf"
# `docker image ls --digests` lines in the fact's format, written by hand after the example of
# docker's own documentation (an image pulled by digest has the tag <none>; an imported one has
# no digest: <none>).
IMAGE_LINES = {
    "imported": f"image {IMAGE} <none>",
    "by tag": f"image {IMAGE} {DIGEST}",
    "by digest": f"image nvcr.io/nvidia/vllm:<none> {DIGEST}",
}


@pytest.mark.parametrize(
    ("line", "listed"),
    [
        ("imported", {IMAGE}),
        ("by tag", {IMAGE, f"nvcr.io/nvidia/vllm@{DIGEST}"}),
        ("by digest", {f"nvcr.io/nvidia/vllm@{DIGEST}"}),
    ],
)
def test_local_images_by_tag_and_by_digest(line: str, listed: set[str]) -> None:
    assert process(lanes.LocalImages, IMAGE_LINES[line] + "\n") == listed


@pytest.mark.parametrize(
    ("image", "name"),
    [
        (IMAGE, IMAGE),
        (f"{IMAGE}@{DIGEST}", f"nvcr.io/nvidia/vllm@{DIGEST}"),
        (f"registry.local:5000/team/vllm:mine@{DIGEST}", f"registry.local:5000/team/vllm@{DIGEST}"),
        (f"vllm@{DIGEST}", f"vllm@{DIGEST}"),
    ],
)
def test_local_name_of_a_pinned_image(image: str, name: str) -> None:
    assert lanes.local_name(image) == name


def test_hf_token_is_uploaded_into_a_file_that_is_0600_first(tmp_path: Path) -> None:
    token = tmp_path / "hf-token"
    token.write_text("hf_sentinel")
    host = FakeHost({(Sha1File, (("path", box_paths.HF_TOKEN),)): None})
    commands = run_op(lanes.hf_token, host=host, src=str(token))
    temporary = host.get_temp_filename()
    assert commands[0] == (
        "install -d -m 700 -o root -g root /etc/spark/secrets && { [ -e /etc/spark/secrets/"
        "hf-token ] || install -m 600 /dev/null /etc/spark/secrets/hf-token; } && chown root:root"
        " /etc/spark/secrets/hf-token && chmod 600 /etc/spark/secrets/hf-token"
        f' && install -m 600 -o "${{SUDO_USER:-root}}" /dev/null {temporary}'
    )
    assert host.uploads == {box_paths.HF_TOKEN: "hf_sentinel"}
    assert "hf_sentinel" not in " ".join(commands)
    same = hashlib.sha1(b"hf_sentinel").hexdigest()
    host = FakeHost({(Sha1File, (("path", box_paths.HF_TOKEN),)): f"{same}  {box_paths.HF_TOKEN}"})
    assert run_op(lanes.hf_token, host=host, src=str(token)) == []


# --- the memory guard ---------------------------------------------------------------------------

GUARD_FILES = (
    "/usr/local/lib/spark/memguard.py",
    "/etc/spark/memguard.json",
    "/etc/systemd/system/spark-memguard.service",
)


def guard_host(files: dict[str, str | None], state: str = "running") -> FakeHost:
    host = FakeHost(file_facts(files))
    if files[GUARD_FILES[0]] is not None:
        host.outputs[(File, (("path", GUARD_FILES[0]),))] = captured(
            "lab-stat-memguard-script-0755.txt"
        )
    host.outputs[SystemdStatus] = captured(f"lab-systemctl-memguard-{state}.txt")
    host.outputs[SystemdEnabled] = captured("lab-systemctl-memguard-enabled.txt")
    return host


def guard_files(**kwargs: Any) -> dict[str, str]:
    host = guard_host(dict.fromkeys(GUARD_FILES))
    run_op(memguard.memory_guard, host=host, **kwargs)
    return host.uploads


GUARD = {"lanes": [("coder", 2), ("fast", 1)], "min_available_gib": 8.0}


def test_stop_order_lowest_priority_first_then_the_later_lane() -> None:
    order = memguard.stop_order([("a", 5), ("b", 1), ("c", 5), ("d", 1)])
    assert [lane["name"] for lane in order] == ["d", "b", "c", "a"]
    assert order[0] == {
        "name": "d",
        "unit": "spark-lane-d.service",
        "container": "spark-lane-d",
        "priority": 1,
    }


def test_guard_installed_and_started_on_a_fresh_box() -> None:
    host = guard_host(dict.fromkeys(GUARD_FILES))
    commands = run_op(memguard.memory_guard, host=host, **GUARD)
    # The captured `systemctl is-enabled` says enabled: no enable, a restart.
    assert commands[-2:] == ["systemctl daemon-reload", "systemctl restart spark-memguard.service"]
    config = json.loads(host.uploads[GUARD_FILES[1]])
    assert config["min_available_gib"] == 8.0
    assert [lane["name"] for lane in config["lanes"]] == ["fast", "coder"]
    assert (
        "ExecStart=/usr/bin/python3 /usr/local/lib/spark/memguard.py /etc/spark/memguard.json"
        in (host.uploads[GUARD_FILES[2]])
    )


def test_guard_in_place_and_running_yields_nothing() -> None:
    host = guard_host(guard_files(**GUARD))
    assert run_op(memguard.memory_guard, host=host, **GUARD) == []


def test_guard_in_place_asks_its_three_files_in_one_question() -> None:
    # Only the one RootFiles question (the script 0755, as the lab's stat of it says) and the
    # unit's state answer: files.put's own facts would fail the test as unexpected.
    written = guard_files(**GUARD)
    lines = [
        f"{path}\troot root {mode} {hashlib.sha1(written[path].encode()).hexdigest()}"
        for path, mode in zip(GUARD_FILES, ("755", "644", "644"), strict=True)
    ]
    host = FakeHost({
        (util.RootFiles, (("paths", GUARD_FILES),)): "\n".join(lines),
        SystemdStatus: captured("lab-systemctl-memguard-running.txt"),
        SystemdEnabled: captured("lab-systemctl-memguard-enabled.txt"),
    })  # fmt: skip
    assert run_op(memguard.memory_guard, host=host, **GUARD) == []


def test_a_stopped_guard_is_started_and_a_new_threshold_restarts_it() -> None:
    host = guard_host(guard_files(**GUARD), state="dead")
    assert run_op(memguard.memory_guard, host=host, **GUARD) == [
        "systemctl start spark-memguard.service"
    ]
    host = guard_host(guard_files(**GUARD))
    commands = run_op(memguard.memory_guard, host=host, **(GUARD | {"min_available_gib": 12}))
    assert GUARD_FILES[1] in commands[0]
    assert commands[-1].endswith("systemctl restart spark-memguard.service")


class Stop(Exception):
    """Ends the guard's loop in a test."""


@pytest.fixture
def guard_program() -> dict[str, Any]:
    """The guard's program as the deploy writes it, loaded without running it."""
    namespace: dict[str, Any] = {"__name__": "memguard"}
    text = guard_files(**GUARD)[GUARD_FILES[0]]
    exec(compile(text, "memguard.py", "exec"), namespace)
    return namespace


def test_guard_reads_memavailable_and_systemd_states(guard_program: dict[str, Any]) -> None:
    assert guard_program["available_gib"](captured("lab-proc-meminfo.txt")) == pytest.approx(
        23527300 / 2**20
    )
    shown = captured("lab-systemctl-lane-states.txt")
    run = SimpleNamespace(stdout=shown)
    guard_program["subprocess"] = SimpleNamespace(run=lambda *args, **kwargs: run)
    assert guard_program["unit_states"](["x"]) == {
        "spark-lane-fast.service": ("inactive", ""),
        "spark-lane-coder.service": ("active", ""),
        "spark-lane-gone.service": ("inactive", ""),
    }
    run.stdout = captured("systemctl-lane-substates.sample.txt")
    assert guard_program["unit_states"](["x"]) == {
        "spark-lane-fast.service": ("activating", "auto-restart"),
        "spark-lane-coder.service": ("active", "running"),
        "spark-lane-big.service": ("activating", "start-pre"),
    }


@pytest.mark.parametrize(
    ("state", "holds"),
    [
        (("active", "running"), True),
        (("activating", "start-post"), True),  # its container loads the model
        (("activating", "start"), True),
        (("activating", "auto-restart"), False),  # waiting to restart: no process
        (("activating", "start-pre"), False),  # dropping caches, waiting for Ray nodes
        (("deactivating", "stop"), False),
        (("failed", "failed"), False),
    ],
)
def test_guard_counts_only_lanes_that_hold_memory(
    guard_program: dict[str, Any], state: tuple[str, str], holds: bool
) -> None:
    assert guard_program["holds_memory"](state) is holds


def test_guard_stops_the_lowest_running_lane_and_says_why(
    guard_program: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "memguard.json"
    config.write_text(guard_files(**GUARD)[GUARD_FILES[1]])
    stopped: list[str] = []
    # fast (the lowest) waits to restart, holding nothing: coder, loading, is the one to stop.
    states = {
        "spark-lane-fast.service": ("activating", "auto-restart"),
        "spark-lane-coder.service": ("activating", "start-post"),
    }

    def sleep(seconds: float) -> None:
        if stopped:
            raise Stop

    guard_program |= {
        "available_gib": lambda meminfo: 3.5,
        "unit_states": lambda units: states,
        "stop": lambda lane: stopped.append(lane["name"]),
        "time": SimpleNamespace(sleep=sleep),
    }
    with pytest.raises(Stop):
        guard_program["main"](str(config))
    assert stopped == ["coder"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "<6>below 8 GiB MemAvailable, lanes are stopped in this order: fast, coder"
    assert lines[1] == (
        "<4>MemAvailable 3.5 GiB is below 8 GiB: stopping lane coder (spark-lane-coder.service,"
        " priority 2, the lowest running) before the box runs out of memory"
    )


def test_guard_waits_while_a_lane_is_stopping_and_says_once_when_none_is_left(
    guard_program: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "memguard.json"
    config.write_text(guard_files(**GUARD)[GUARD_FILES[1]])
    rounds = iter(
        [
            {
                "spark-lane-fast.service": ("deactivating", "stop-sigterm"),
                "spark-lane-coder.service": ("active", "running"),
            },
            {
                "spark-lane-fast.service": ("inactive", "dead"),
                "spark-lane-coder.service": ("failed", "failed"),
            },
            {
                "spark-lane-fast.service": ("inactive", "dead"),
                "spark-lane-coder.service": ("activating", "auto-restart"),
            },
        ]
    )
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise Stop

    guard_program |= {
        "available_gib": lambda meminfo: 1.0,
        "unit_states": lambda units: next(rounds),
        "stop": lambda lane: pytest.fail(f"stopped {lane}"),
        "time": SimpleNamespace(sleep=sleep),
    }
    with pytest.raises(Stop):
        guard_program["main"](str(config))
    notices = [line for line in capsys.readouterr().out.splitlines() if line.startswith("<5>")]
    assert notices == ["<5>MemAvailable 1.0 GiB is below 8 GiB and no lane is left to stop"]


# --- the configuration keys of the lanes' host side ---------------------------------------------


def test_lane_settings_defaults_and_a_token_file(tmp_path: Path) -> None:
    spark = load_from_dicts(merged(TWO_SPARKS))
    box = spark.host("spark-1")
    assert (box.memory_guard_min_available_gib, box.lane_start_timeout_min) == (8.5, 20)
    assert box.hf_token_file is None
    token = tmp_path / "hf-token"
    token.write_text("hf_x")
    with_token = {name: data | {"hf_token_file": str(token)} for name, data in TWO_SPARKS.items()}
    assert load_from_dicts(merged(with_token)).host("spark-2").hf_token_file == str(token)


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        (
            "hf_token_file",
            "/nonexistent/hf-token",
            "spark-1: hf_token_file: the value is no file on this machine (not shown: it may be a"
            " token pasted by mistake)",
        ),
        ("memory_guard_min_available_gib", 0, "spark-1: memory_guard_min_available_gib: Input"),
        ("lane_start_timeout_min", 0, "spark-1: lane_start_timeout_min: Input should be"),
        ("memory_guard_min_available_gib", "8", "spark-1: memory_guard_min_available_gib: Input"),
    ],
)
def test_lane_settings_refused(key: str, value: object, problem: str) -> None:
    hosts = {name: data | {key: value} for name, data in TWO_SPARKS.items()}
    with pytest.raises(ConfigError) as refused:
        load_from_dicts(merged(hosts))
    assert any(line.startswith(problem) for line in refused.value.problems), refused.value


# --- a cluster lane ------------------------------------------------------------------------------


CLUSTER = {"tensor_parallel_size": 2}
CLUSTER_UNIT = {"ray_address": "192.168.100.10:6379", "ray_token": True}


def test_a_cluster_lane_waits_for_every_ray_node_and_mounts_rays_token() -> None:
    files = rendered(lane=CLUSTER, **CLUSTER_UNIT)
    unit, env = files[UNIT], files[ENV]
    assert "After=docker.service network-online.target spark-ray.service\n" in unit
    assert "Requires=docker.service spark-ray.service\n" in unit
    assert "StartLimitIntervalSec=0\n" in unit and "StartLimitBurst" not in unit
    # The Ray nodes' wait after the stale container's removal; then the lane's turn to load
    # (not taken while waiting for nodes) and the page cache dropped just before `docker run`.
    pre = [line for line in unit.splitlines() if line.startswith("ExecStartPre=")]
    assert pre == [
        "ExecStartPre=-/usr/bin/docker rm -f spark-lane-coder",
        "ExecStartPre=/usr/local/sbin/spark-ray-nodes 2 300",
        "ExecStartPre=/usr/local/sbin/spark-lane-turn coder 570",
        "ExecStartPre=-/bin/sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'",
    ]
    start = exec_start(unit)
    assert (
        " --pid container:spark-ray -v /var/lib/spark/ray:/tmp/ray"
        " -v /etc/spark/secrets/ray-auth-token:/run/secrets/ray-auth-token:ro" in start
    )
    assert "RAY_ADDRESS=192.168.100.10:6379" in env.splitlines()
    assert "RAY_AUTH_MODE=token" in env.splitlines()
    assert "RAY_AUTH_TOKEN_PATH=/run/secrets/ray-auth-token" in env.splitlines()


def test_a_single_box_lane_has_no_ray_in_it() -> None:
    files = rendered()
    assert "spark-ray" not in files[UNIT] and "RAY_ADDRESS" not in files[ENV]
    assert "StartLimitBurst=6\n" in files[UNIT]


def test_a_cluster_lane_in_place_yields_nothing() -> None:
    host = lane_host("lab-lanehost-serving.txt", rendered(lane=CLUSTER, **CLUSTER_UNIT))
    assert run_op(lanes.serving, host=host, unit=lane_unit(CLUSTER, **CLUSTER_UNIT)) == []


def test_a_cluster_lane_without_rays_address_is_refused() -> None:
    with pytest.raises(ValueError, match="a cluster lane needs ray_address"):
        lane_unit(CLUSTER)


# --- a cluster lane on vLLM's own multi-node mode (executor mp) ----------------------------------


MP = {"tensor_parallel_size": 2, "executor": "mp"}
MP_HEAD = {
    "rank": MpRank(0, "192.168.100.10"),
    "peers": ("192.168.100.11",),
    "peer_boxes": ("spark-2",),
}
MP_WORKER = {
    "rank": MpRank(1, "192.168.100.10"),
    "peers": ("192.168.100.10",),
    "peer_boxes": ("spark-1",),
}
MP_ARGS = (
    "--tensor-parallel-size 2 --distributed-executor-backend mp --nnodes 2 --node-rank {rank}"
    " --master-addr 192.168.100.10 --master-port 29501"
)


def test_an_mp_cluster_lanes_head_serves_under_the_rendezvous_watch_without_ray() -> None:
    files = rendered(lane=MP, **MP_HEAD)
    unit, env = files[UNIT], files[ENV]
    assert "spark-ray" not in unit and "RAY_" not in env.replace("RAY_memory", "")
    assert "StartLimitIntervalSec=0\n" in unit and "StartLimitBurst" not in unit
    start = exec_start(unit)
    # The watch first: port 29501, 300 s for every rank to join (half the start timeout of
    # 600 s), the worker's first twin and its box, then the lane's `docker run`.
    assert start.startswith(
        "ExecStart=/usr/local/sbin/spark-lane-ranks 29501 300 192.168.100.11=spark-2"
        " -- /usr/bin/docker run"
    )
    assert MP_ARGS.format(rank=0) in start and "--headless" not in start
    assert "-v /etc/spark/secrets/coder.key:/run/secrets/api-key:ro" in start
    # The head serves: health wait and canary as any lane's.
    assert "/health" in unit and "ExecStartPost=/usr/local/sbin/spark-lane-canary coder" in unit


def test_an_mp_cluster_lanes_worker_runs_a_headless_rank_without_key_health_or_canary() -> None:
    unit_ = lane_unit(MP, **MP_WORKER)
    host = lane_host("lab-lanehost-bare.txt", dict.fromkeys(paths()))
    commands = run_op(lanes.serving, host=host, unit=unit_)
    unit = host.uploads[UNIT]
    start = exec_start(unit)
    # The rank keeps the box's turn to load (its mark) while it loads, at most the health wait
    # of a lane (600 s less 30); every rank joined within 300 s (half the start timeout).
    assert start.startswith(
        "ExecStart=/usr/local/sbin/spark-lane-ranks --turn /run/spark/loading/coder 570"
        " 29501 300 192.168.100.10=spark-1 -- /usr/bin/docker run"
    )
    assert MP_ARGS.format(rank=1) + " --headless" in start
    # The turn taken as any lane's, but not given back as the container starts: only the stop's.
    assert "ExecStartPre=/usr/local/sbin/spark-lane-turn coder 570\n" in unit
    assert post_lines(unit) == []
    assert "ExecStopPost=/bin/rm -f /run/spark/loading/coder\n" in unit
    assert "api-key" not in start and "VLLM_API_KEY" not in start
    assert "/health" not in unit and "spark-lane-canary coder" not in unit
    assert "Description=vLLM lane coder: this box's rank 1 (headless" in unit
    # No key (nor its directory) for a rank that serves nothing; started like any lane.
    assert not [c for c in commands if "secrets" in str(c)], commands
    assert commands[-3:] == [
        "systemctl daemon-reload",
        "systemctl enable spark-lane-coder.service",
        RESTART,
    ]


def test_a_headless_rank_ignores_the_lanes_ports_which_the_box_may_use_otherwise() -> None:
    # 10102 held by another service (python3): the head's lane would take it, a rank does not.
    taken = MP | {"name": "fast", "port": 10102}
    host = lane_host("lab-lanehost-port-taken.txt", dict.fromkeys(paths("fast")))
    assert run_op(lanes.serving, host=host, unit=lane_unit(taken, **MP_WORKER))
    assert re.search(
        "port 10102 of lane fast is taken by python3",
        refusal(run_op(lanes.serving, host=host, unit=lane_unit(taken, **MP_HEAD))),
    )


def test_an_mp_rank_in_place_yields_nothing() -> None:
    for unit in (MP_HEAD, MP_WORKER):
        host = lane_host("lab-lanehost-serving.txt", rendered(lane=MP, **unit))
        assert run_op(lanes.serving, host=host, unit=lane_unit(MP, **unit)) == []


def test_a_changed_mp_head_held_is_rewritten_and_stopped_not_started() -> None:
    # Its memory fraction changed while it serves: the head's first pass (stages/cluster.py),
    # before the ranks restart, leaves no old head for a new rank to join.
    host = lane_host("lab-lanehost-serving.txt", rendered(lane=MP, **MP_HEAD))
    changed = lane_unit(MP | {"memory_fraction": 0.55}, **MP_HEAD)
    commands = run_op(lanes.serving, host=host, unit=changed, held=True)
    assert commands[0].startswith("FileUploadCommand(") and UNIT in commands[0]
    assert commands[-2:] == ["systemctl daemon-reload", "systemctl stop spark-lane-coder.service"]
    assert not [c for c in commands if "start" in str(c)], commands
    assert "--gpu-memory-utilization 0.55" in exec_start(host.uploads[UNIT])


def test_an_mp_head_held_in_place_or_new_is_not_started() -> None:
    in_place = lane_host("lab-lanehost-serving.txt", rendered(lane=MP, **MP_HEAD))
    assert run_op(lanes.serving, host=in_place, unit=lane_unit(MP, **MP_HEAD), held=True) == []
    bare = lane_host("lab-lanehost-bare.txt", dict.fromkeys(paths()))
    commands = run_op(lanes.serving, host=bare, unit=lane_unit(MP, **MP_HEAD), held=True)
    assert commands[-1] == "systemctl daemon-reload"  # its files written, its key made
    assert not [c for c in commands if "systemctl" in str(c) and "start" in str(c)], commands


# --- the rendezvous watch, run by sh against a fake ss ------------------------------------------


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start the watch script for port 29501, `deadline` seconds to join and these peers
    (ADDRESS=BOX) over the rank (by default a `sleep 300` that writes its pid to
    tmp_path/rank.pid), with an `ss` that prints tmp_path/connections (ss's columns under a state
    filter), a `ping` that fails for the addresses listed in tmp_path/silent (no packet leaves
    this machine) and a `journalctl` that prints tmp_path/journal (this start's journal)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ss").write_text(
        f"#!/bin/sh\necho >> {tmp_path}/ss.calls\ncat {tmp_path}/connections 2>/dev/null\n"
    )
    (bin_dir / "ping").write_text(
        f'#!/bin/sh\nfor last; do :; done\n! grep -qxF "$last" {tmp_path}/silent 2>/dev/null\n'
    )
    (bin_dir / "journalctl").write_text(
        f"#!/bin/sh\necho >> {tmp_path}/journalctl.calls\ncat {tmp_path}/journal 2>/dev/null\n"
    )
    for tool in ("ss", "ping", "journalctl"):
        (bin_dir / tool).chmod(0o755)
    script = tmp_path / "spark-lane-ranks"
    script.write_text((util.TEMPLATES / "spark-lane-ranks.j2").read_text())
    rank = ("sh", "-c", f"echo $$ > {tmp_path}/rank.pid; exec sleep 300")
    started: list[subprocess.Popen[str]] = []

    def start(
        *peers: str,
        command: tuple[str, ...] = rank,
        deadline: int = 60,
        turn: tuple[str, ...] = (),
    ) -> subprocess.Popen[str]:
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "INVOCATION_ID": "0123abcd"}
        process = subprocess.Popen(
            ["sh", str(script), *turn, "29501", str(deadline), *peers, "--", *command],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        started.append(process)
        return process

    yield start
    for watch in started:
        watch.kill()
        watch.wait()
    if (tmp_path / "rank.pid").exists():  # a rank a failed test left behind
        subprocess.run(["kill", (tmp_path / "rank.pid").read_text().strip()], check=False)


def joined(watch: subprocess.Popen[str], seconds: float = 30) -> str:
    """The watch's output up to its "every rank joined" line, read as it comes (no fixed wait);
    AssertionError if it has not said so within `seconds`."""
    assert watch.stdout is not None
    said = ""
    with selectors.DefaultSelector() as selector:
        selector.register(watch.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + seconds
        while "every rank joined" not in said:
            left = deadline - time.monotonic()
            assert left > 0 and selector.select(left), f"not joined in {seconds:g} s: {said!r}"
            line = watch.stdout.readline()
            assert line, f"the watch ended before joining: {said!r}"
            said += line
    return said


def rank_stopped(tmp_path: Path) -> bool:
    """Whether the rank the fixture started (its pid in rank.pid) is gone."""
    pid = int((tmp_path / "rank.pid").read_text())
    return subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0


def calls(tmp_path: Path, tool: str) -> int:
    """How often the watch has run the fake `tool` so far."""
    path = tmp_path / f"{tool}.calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


def rounds_after(tmp_path: Path, tool: str, seen: int) -> None:
    """Wait until the watch has run `tool` twice more than `seen` times: a whole round of it
    has read what was written before (no fixed sleep)."""
    until(lambda: calls(tmp_path, tool) >= seen + 2, 30, f"two more rounds reading {tool}")


def connections(tmp_path: Path, *peers: str) -> None:
    """ss -Htn state established's lines as the head shows them: its store listens on [::] (as
    torch's TCPStore does), so its end and an IPv4 peer's show as IPv4-mapped IPv6 (written by
    hand in the form `ss` showed for the lab's stand-in)."""
    lines = [
        f"0 0 [::ffff:192.168.100.10]:29501 [::ffff:{peer}]:4{n}123\n"
        for n, peer in enumerate(peers)
    ]
    (tmp_path / "connections").write_text("".join(lines))


def test_the_watch_stops_the_rank_and_fails_once_a_joined_peer_leaves(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    connections(tmp_path, "192.168.100.11", "192.168.100.12")
    watch = ranks("192.168.100.11=spark-2", "192.168.100.12=spark-3")
    said = joined(watch)
    assert (
        "every rank joined the rendezvous on port 29501: 192.168.100.11 (spark-2)"
        " 192.168.100.12 (spark-3)\n" in said
    )
    connections(tmp_path, "192.168.100.12")
    output, _ = watch.communicate(timeout=20)
    assert watch.returncode == 1
    assert "the rank at 192.168.100.11 (spark-2) left the rendezvous on port 29501" in output
    assert rank_stopped(tmp_path)  # its rank was stopped with it


def test_the_watch_takes_a_peer_answering_no_ping_for_a_lost_box(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    # A box lost leaves its connection open on this side: only the fabric's silence tells.
    connections(tmp_path, "192.168.100.11")
    watch = ranks("192.168.100.11=spark-2")
    joined(watch)
    (tmp_path / "silent").write_text("192.168.100.11\n")
    output, _ = watch.communicate(timeout=40)
    assert watch.returncode == 1, output
    assert (
        "the rank at 192.168.100.11 (spark-2) answers no ping on the fabric (its box lost?)"
        in output
    )
    assert rank_stopped(tmp_path)


def test_the_watch_waits_for_peers_not_yet_joined_and_passes_the_ranks_exit_on(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    # Nobody joined yet: a missing peer is no loss within its deadline; the rank's own failure
    # is the watch's.
    watch = ranks("192.168.100.11=spark-2", command=("sh", "-c", "sleep 3; exit 7"))
    output, _ = watch.communicate(timeout=20)
    assert watch.returncode == 7 and "left" not in output and "joined" not in output


def test_the_watch_reads_a_worker_sides_plain_ipv4_connection(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    # A headless rank's end: IPv4 to the head's port (written by hand in ss's columns).
    (tmp_path / "connections").write_text("0 0 192.168.100.11:41234 192.168.100.10:29501\n")
    watch = ranks("192.168.100.10=spark-1")
    joined(watch)
    (tmp_path / "connections").write_text("")
    output, _ = watch.communicate(timeout=20)
    assert watch.returncode == 1 and "the rank at 192.168.100.10 (spark-1) left" in output, output


def test_the_watch_passes_systemds_stop_on_to_the_rank(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    connections(tmp_path, "192.168.100.11")
    watch = ranks("192.168.100.11=spark-2")
    joined(watch)  # its trap is set by then
    watch.terminate()
    watch.communicate(timeout=20)
    assert watch.returncode == 0  # a stop asked for: the unit ends inactive, not failed
    assert rank_stopped(tmp_path)  # the rank stopped with it


def test_the_watch_refuses_a_command_line_without_its_command(
    ranks: Callable[..., subprocess.Popen[str]],
) -> None:
    watch = ranks("192.168.100.11=spark-2", command=())
    output, _ = watch.communicate(timeout=20)
    assert watch.returncode == 2 and "usage: spark-lane-ranks" in output


def test_a_rank_that_never_joins_within_its_deadline_is_lost_by_name(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    # spark-3's rank never started: no endless wait for it, and the one that joined is no help.
    connections(tmp_path, "192.168.100.11")
    watch = ranks("192.168.100.11=spark-2", "192.168.100.12=spark-3", deadline=3)
    output, _ = watch.communicate(timeout=20)
    assert watch.returncode == 1, output
    assert (
        "spark-lane-ranks: the rank at 192.168.100.12 (spark-3) has not joined the rendezvous on"
        " port 29501 within 3 s (its rank never started, or its box is away): stopping this"
        " box's rank so that it starts again with the others\n" in output
    )
    assert "every rank joined" not in output
    assert rank_stopped(tmp_path)


def test_the_race_of_a_rank_that_never_joined_treated_as_lost_is_closed(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    # Issue 37's race: a rank slower to start than the others (its box's turn, its image) is
    # no loss while it has not joined, whatever rounds go by before its deadline; it joins,
    # and the group is whole. Only its deadline, or its leaving once seen, loses it.
    connections(tmp_path, "192.168.100.11")
    watch = ranks("192.168.100.11=spark-2", "192.168.100.12=spark-3", deadline=600)
    rounds_after(tmp_path, "ss", calls(tmp_path, "ss") + 1)  # three rounds without spark-3
    assert watch.poll() is None and not rank_stopped(tmp_path)
    connections(tmp_path, "192.168.100.11", "192.168.100.12")
    said = joined(watch)
    assert "stopping this box's rank" not in said, said
    assert not rank_stopped(tmp_path)


def test_a_rank_that_joined_and_left_before_the_others_joined_is_lost(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    # spark-2's rank came and went while spark-3's had not come yet: the group never completes
    # with it (torch takes no rank back), so waiting out the deadline would help nobody.
    connections(tmp_path, "192.168.100.11")
    watch = ranks("192.168.100.11=spark-2", "192.168.100.12=spark-3", deadline=600)
    rounds_after(tmp_path, "ss", 0)  # a round of the watch has seen spark-2 connected
    connections(tmp_path)
    output, _ = watch.communicate(timeout=20)
    assert watch.returncode == 1, output
    assert "the rank at 192.168.100.11 (spark-2) left the rendezvous on port 29501" in output


# A headless rank's journal as vLLM 0.19.0 writes it, written by hand from its formats, in its
# order (vllm/v1/engine/core.py _initialize_kv_caches): its weights in (gpu_model_runner.py
# load_model, "Model loading took %s GiB memory and %.6f seconds"), the KV cache sized
# (gpu_worker.py determine_available_memory, "Available KV cache memory: %s GiB") and allocated
# (no line), then its CUDA graphs captured (gpu_model_runner.py capture_model, "Graph capturing
# finished in %.0f secs, took %.2f GiB").
LOADED = (
    "(Worker pid=212) INFO 11-28 11:00:31 [gpu_model_runner.py:4820] Model loading took"
    " 57.64 GiB memory and 412.118200 seconds\n"
)
KV_CACHE_SIZED = (
    "(Worker pid=212) INFO 11-28 11:01:02 [gpu_worker.py:436] Available KV cache memory: 9.02 GiB\n"
)
GRAPHS_CAPTURED = (
    "(Worker pid=212) INFO 11-28 11:05:40 [gpu_model_runner.py:6046] Graph capturing finished"
    " in 278 secs, took 1.37 GiB\n"
)


def test_a_headless_rank_keeps_its_boxs_turn_until_its_cuda_graphs_are_captured(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    mark = tmp_path / "loading" / "big"
    mark.parent.mkdir()
    mark.touch()  # taken by spark-lane-turn in ExecStartPre
    connections(tmp_path, "192.168.100.10")
    watch = ranks("192.168.100.10=spark-1", turn=("--turn", str(mark), "600"))
    joined(watch)
    assert mark.exists()  # joined, still loading
    (tmp_path / "journal").write_text("Starting to load model Qwen/Qwen3-235B-A22B-GPTQ-Int4...\n")
    rounds_after(tmp_path, "journalctl", calls(tmp_path, "journalctl"))  # read by a round
    assert mark.exists()
    # Its weights in, its KV cache sized: its memory still grows (the KV cache, the graphs).
    (tmp_path / "journal").write_text(LOADED + KV_CACHE_SIZED)
    rounds_after(tmp_path, "journalctl", calls(tmp_path, "journalctl"))
    assert mark.exists()
    (tmp_path / "journal").write_text(LOADED + KV_CACHE_SIZED + GRAPHS_CAPTURED)
    until(lambda: not mark.exists(), 20, "the turn given back")
    watch.terminate()
    output, _ = watch.communicate(timeout=20)
    assert (
        "spark-lane-ranks: this box's rank is ready to serve (weights, KV cache and CUDA graphs"
        " in): the box's next lane may load\n" in output
    )


def test_a_headless_rank_not_ready_gives_its_turn_on_after_its_hold_saying_so(
    ranks: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    mark = tmp_path / "loading" / "big"
    mark.parent.mkdir()
    mark.touch()
    connections(tmp_path, "192.168.100.10")
    (tmp_path / "journal").write_text(LOADED + KV_CACHE_SIZED)  # its graphs never captured
    watch = ranks("192.168.100.10=spark-1", turn=("--turn", str(mark), "3"))
    until(lambda: not mark.exists(), 20, "the turn given on")
    watch.terminate()
    output, _ = watch.communicate(timeout=20)
    host = socket.gethostname()
    assert (
        f"spark-lane-ranks: this box's rank on {host} is not ready to serve within 3 s: its turn"
        " to load goes to the box's next lane anyway\n" in output
    )


# --- the lanes' turn to load, run by sh against a fake systemctl --------------------------------


@pytest.fixture
def turn(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the turn script (rendered with its marks under tmp_path) for a lane, with a systemctl
    that answers each lane's ActiveState from tmp_path/state/<lane> (else inactive)."""
    marks, states, bin_dir = tmp_path / "loading", tmp_path / "state", tmp_path / "bin"
    for directory in (states, bin_dir):
        directory.mkdir()
    script = tmp_path / "spark-lane-turn"
    script.write_text(
        jinja2.Template((util.TEMPLATES / "spark-lane-turn.j2").read_text()).render(
            loading_dir=str(marks), prefix=lanes.PREFIX
        )
    )
    systemctl = bin_dir / "systemctl"  # systemctl show -p ActiveState --value spark-lane-X.service
    systemctl.write_text(
        "#!/bin/sh\nunit=$5; lane=${unit#spark-lane-}; lane=${lane%.service}\n"
        f'cat "{states}/$lane" 2>/dev/null || echo inactive\n'
    )
    systemctl.chmod(0o755)

    def run(lane: str, timeout: float = 10, wait: int = 60) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        return subprocess.run(["sh", str(script), lane, str(wait)], capture_output=True,
                              text=True, env=env, timeout=timeout, check=False)  # fmt: skip

    run.marks, run.states = marks, states  # type: ignore[attr-defined]
    return run


def test_a_lane_takes_the_turn_when_no_other_is_loading(turn: Any) -> None:
    assert turn("coder").returncode == 0
    assert sorted(path.name for path in turn.marks.glob("[!.]*")) == ["coder"]


def test_a_mark_left_by_a_lane_that_is_not_starting_is_cleared(turn: Any) -> None:
    turn.marks.mkdir()
    (turn.marks / "fast").touch()  # fast crashed before its stop removed it; it is inactive now
    assert turn("coder").returncode == 0
    assert sorted(path.name for path in turn.marks.glob("[!.]*")) == ["coder"]


def test_a_lane_waits_while_another_loads_and_goes_once_it_serves(turn: Any) -> None:
    turn.marks.mkdir()
    (turn.marks / "fast").touch()
    (turn.states / "fast").write_text("activating\n")  # fast is loading

    def fast_serves() -> None:
        time.sleep(1.5)
        (turn.marks / "fast").unlink()  # its ExecStartPost, once /health answers
        (turn.states / "fast").write_text("active\n")

    serving = threading.Thread(target=fast_serves)
    serving.start()
    result = turn("coder")
    serving.join()
    assert result.returncode == 0, result.stderr
    assert result.stdout == "lane coder waits for lane fast to finish loading\n"
    assert sorted(path.name for path in turn.marks.glob("[!.]*")) == ["coder"]


def test_a_running_headless_ranks_mark_holds_the_turn_and_a_wait_gives_up_by_name(
    turn: Any,
) -> None:
    # The rank's unit is active once its container runs; its watch keeps the mark while it
    # loads (spark-lane-ranks --turn). coder waits, at most its 2 s, then its start fails.
    turn.marks.mkdir()
    (turn.marks / "big").touch()
    (turn.states / "big").write_text("active\n")
    result = turn("coder", wait=2)
    assert result.returncode == 1
    assert result.stdout == "lane coder waits for lane big to finish loading\n"
    assert result.stderr == (
        f"spark-lane-turn: lane coder gave up its start on {socket.gethostname()}: lane big has"
        " held this box's turn to load for more than 2 s\n"
    )
    assert sorted(path.name for path in turn.marks.glob("[!.]*")) == ["big"]


# --- the answer canary (issue 16) ---------------------------------------------------------------


def post_lines(unit: str) -> list[str]:
    return [line for line in unit.splitlines() if line.startswith("ExecStartPost=")]


def test_the_canary_runs_after_the_health_wait_and_before_the_next_lanes_turn() -> None:
    health, canary, turn = post_lines(rendered()[paths()[0]])
    assert "/health" in health and turn.startswith("ExecStartPost=/bin/rm -f")
    assert canary.startswith("ExecStartPost=/usr/local/sbin/spark-lane-canary coder 11101 ")
    assert "key" not in canary  # the script reads the key file itself


def test_the_canary_is_written_root_0755_and_reads_the_lanes_key_file() -> None:
    host = lane_host("lab-lanehost-bare.txt", dict.fromkeys(paths()), turn_script=False)
    run_op(lanes.serving, host=host, unit=lane_unit())
    assert 'SECRETS_DIR = "/etc/spark/secrets"' in host.uploads[lanes.CANARY_COMMAND]


@pytest.mark.parametrize(
    ("lane", "causes"),
    [
        ({}, ["chat template"]),
        (
            {"model_spec": LANE["model_spec"].model_copy(update={"quantization": "nvfp4"})},
            ["ModelOpt", "CUTLASS", "chat"],
        ),
        ({"model": "Qwen/Qwen3-8B"}, ["thinking template", "chat template"]),
    ],
)
def test_the_canary_names_the_causes_of_the_lanes_model(lane: dict, causes: list[str]) -> None:
    named = lane_unit(lane).canary_causes or ()
    assert len(named) == len(causes)
    for cause, word in zip(named, causes, strict=True):
        assert word in cause
    (canary,) = [line for line in post_lines(rendered(lane=lane)[paths()[0]]) if "canary" in line]
    assert all(f'"{cause}"' in canary for cause in named)


# --- a lane whose model the canary cannot judge (canary = false) ---------------------------------


def test_a_lane_without_canary_waits_for_health_then_takes_the_next_turn() -> None:
    unit = rendered(lane={"canary": False})[paths()[0]]
    health, turn = post_lines(unit)
    assert "/health" in health and turn.startswith("ExecStartPost=/bin/rm -f")
    assert "spark-lane-canary" not in unit
    assert "# No answer canary: the lane's model cannot answer its question" in unit


def test_a_lane_without_canary_is_not_asked_it_when_in_place() -> None:
    quiet = lane_unit({"canary": False})
    assert lanes.LaneAnswer not in {fact for fact, _ in lanes.serving_questions(quiet)}
    assert lanes.LaneAnswer in {fact for fact, _ in lanes.serving_questions(lane_unit())}
    host = lane_host("lab-lanehost-serving.txt", rendered(lane={"canary": False}))
    host.outputs[lanes.LaneAnswer] = GIBBERISH  # would refuse the box, were it asked
    assert run_op(lanes.serving, host=host, unit=quiet) == []
    assert host.noops[-1] == "lane coder is serving on port 10101 (canary off)"

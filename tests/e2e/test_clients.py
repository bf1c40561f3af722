"""`make clients PER_LANE=1` on the deployed lab, then the real OpenCode client (npm's
opencode-ai, which `make test` installs in .tools/) on what it wrote: every lane's model listed,
an answer from a lane, a wrong key refused; and what an earlier run wrote for a box gone from the
inventory, removed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Deployed, run_on
from tests.simlab.paths import REPO, STATE

pytestmark = pytest.mark.lab

OPENCODE = Path(REPO) / ".tools/opencode/node_modules/.bin/opencode"
# What OpenCode would otherwise fetch or start on its own, none of it reachable from the lab's
# machine, and the repository's files taken as no project configuration of its: switches the
# opencode 1.18.33 binary reads (its strings name every OPENCODE_DISABLE_* it knows).
QUIET = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
}
LANES = {"coder": "qwen3-coder-next", "fast": "qwen3.6-35b-a3b"}  # group_data/all.py's lanes


def run(home: Path, *command: str) -> subprocess.CompletedProcess:
    """A command as an owner whose home is ``home`` runs it, from there."""
    # PWD too: OpenCode takes its project directory from it, not from the working directory
    # (run from the repository, it snapshots the repository and the lab's state in it first,
    # which took OpenCode 1.18.33 past 300 s through the router).
    env = dict(os.environ, HOME=str(home), PWD=str(home), SIMLAB_STATE=str(STATE), **QUIET)
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        env.pop(name, None)  # all under ``home``
    return subprocess.run(
        command, cwd=home, env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def make(
    home: Path, module: str, *options: str, inventory: str = "inventories/sim.py"
) -> subprocess.CompletedProcess:
    # What `make clients INVENTORY=inventories/sim.py` (stages.clients) or `make status`
    # (stages.status) runs, from the repository, as an owner whose home is ``home``.
    env = dict(os.environ, HOME=str(home), SIMLAB_STATE=str(STATE))
    return subprocess.run(
        [f"{REPO}/.venv/bin/python", "-m", module, "--inventory", inventory, *options],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_make_clients_then_opencode_lists_answers_and_is_refused_a_wrong_key(
    deployed_lab: Deployed, tmp_path: Path
) -> None:
    assert OPENCODE.exists(), "OpenCode is not installed: make .tools/opencode/.installed-*"
    directory = tmp_path / ".config/opencode"
    # An earlier run's entries for spark-9, a box since taken out of the inventory, and the
    # owner's own provider.
    directory.mkdir(parents=True)
    (directory / "spark-9-coder.key").write_text("old\n")
    (directory / "spark-clients.json").write_text(
        json.dumps({"spark-9": {"keys": ["spark-9-coder.key"], "providers": ["spark-9-coder"]}})
    )
    mine = {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": "http://127.0.0.1:9/v1"}}
    (directory / "opencode.json").write_text(
        json.dumps({"provider": {"spark-9-coder": mine, "mine": mine}})
    )
    # The per-lane providers (`make clients PER_LANE=1`); the router's: tests/e2e/test_router.py.
    result = make(tmp_path, "stages.clients", "--per-lane")
    assert result.returncode == 0, result.stdout + result.stderr
    boxes = [host.name for host in deployed_lab.lab.hosts]
    for host in deployed_lab.lab.hosts:
        for lane in LANES:
            key = run_on(host, f"sudo cat /etc/spark/secrets/{lane}.key").strip()
            copied = directory / f"{host.name}-{lane}.key"
            assert copied.read_text() == key + "\n"
            assert stat.S_IMODE(copied.stat().st_mode) == 0o600
            assert key not in result.stdout + result.stderr
    assert not (directory / "spark-9-coder.key").exists()
    # Each box's metrics key too, where make status reads it by default (spark/prometheus.py).
    metrics_keys = tmp_path / ".config/spark-provisioning/metrics-keys"
    for host in deployed_lab.lab.hosts:
        key = run_on(host, "sudo cat /etc/spark/secrets/_metrics.key").strip()
        copied = metrics_keys / f"{host.name}.key"
        assert copied.read_text() == key + "\n"
        assert stat.S_IMODE(copied.stat().st_mode) == 0o600
        assert key not in result.stdout + result.stderr
    assert stat.S_IMODE(metrics_keys.stat().st_mode) == 0o700
    status = make(tmp_path, "stages.status")
    rows = {  # each box's row (its router's, "<box> (router)", is test_router.py's)
        line.split()[0]: line
        for line in status.stdout.splitlines()
        if line.strip() and "(router" not in line
    }
    for box in boxes:
        assert "no answer" not in rows[box], status.stdout + status.stderr
    config = json.loads((directory / "opencode.json").read_text())
    assert sorted(config["provider"]) == sorted(
        ["mine", *(f"{box}-{lane}" for box in boxes for lane in LANES)]
    )

    listed = run(tmp_path, str(OPENCODE), "models")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    expected = {f"{box}-{lane}/{model}" for box in boxes for lane, model in LANES.items()}
    assert expected <= set(listed.stdout.split()), listed.stdout

    box = boxes[-1]
    answer = run(tmp_path, str(OPENCODE), "run", "-m", f"{box}-fast/{LANES['fast']}", "ping")
    assert answer.returncode == 0, answer.stdout + answer.stderr
    # The stand-in's reply (tests/simlab/serving/vllm_standin.py chat_completions).
    assert f"stand-in, no model loaded] {LANES['fast']} got: " in answer.stdout

    (directory / f"{box}-coder.key").write_text("not-the-key\n")
    refused = run(tmp_path, str(OPENCODE), "run", "-m", f"{box}-coder/{LANES['coder']}", "ping")
    assert refused.returncode != 0
    # The front's 401 (templates/nginx-spark-lanes.conf.j2), as OpenCode shows it.
    assert "this lane needs its key" in refused.stdout + refused.stderr

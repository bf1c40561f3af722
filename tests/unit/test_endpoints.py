"""endpoints.py: the endpoints table and the OpenCode client files; stages/run_summary.py
EndpointsReport: both after a run, for the boxes whose lanes serve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyinfra.api.state import StateStage

import endpoints
from spark.inventory import load_from_dicts
from stages import run_summary
from tests.unit.harness import Box, run_state
from tests.unit.test_config import TWO_SPARKS, merged

CODER_URL, FAST_URL = "http://spark-1:10101/v1", "http://spark-1:10102/v1"
ENDPOINTS = [
    endpoints.Endpoint("coder", "vllm", "qwen3-coder-next", CODER_URL, 0.45, 131072, True),
    endpoints.Endpoint("fast", "llama.cpp", "qwen3.6-35b-a3b", FAST_URL, 0.35, 8192, False),
]
# The 8K lane's model as the client lists it: agent clients refuse it (seed 003: Hermes Agent).
ENDPOINTS_SHORT_NAME = (
    "qwen3.6-35b-a3b (max_model_len 8192 is below 65536: agent clients refuse it (Hermes Agent"
    " needs 64K, seed 003))"
)


def test_opencode_config_names_the_key_file_never_the_key() -> None:
    config = endpoints.opencode_config("Spark-1.local", ENDPOINTS)
    coder = config["provider"]["spark-1-local-coder"]
    assert coder["options"] == {
        "baseURL": "http://spark-1:10101/v1",
        "apiKey": "{file:~/.config/opencode/spark-1-local-coder.key}",
    }
    assert coder["npm"] == "@ai-sdk/openai-compatible"
    assert coder["models"] == {
        "qwen3-coder-next": {
            "name": "qwen3-coder-next",
            "limit": {"context": 131072, "output": 16384},
        }
    }
    fast = config["provider"]["spark-1-local-fast"]
    assert "apiKey" not in fast["options"]
    assert fast["models"]["qwen3.6-35b-a3b"]["limit"] == {"context": 8192, "output": 2048}


def test_the_key_file_a_box_and_lane_are_given_and_the_directory_named() -> None:
    assert endpoints.client_slug("Spark_1.local") == "spark-1-local"
    assert endpoints.key_file("GX10 #2", "coder") == "gx10-2-coder.key"
    config = endpoints.opencode_config("spark-1.local", ENDPOINTS[:1], "/home/o/oc")
    assert config["provider"]["spark-1-local-coder"]["options"]["apiKey"] == (
        "{file:/home/o/oc/spark-1-local-coder.key}"
    )


def test_a_lane_below_64k_says_in_its_client_configuration_that_agents_refuse_it() -> None:
    # Hermes Agent refuses a context below 64K (seed 003): 65535 is one token short, 65536 is not.
    short = endpoints.Endpoint("fast", "vllm", "fast-model", FAST_URL, 0.35, 65535, True)
    enough = short._replace(lane="coder", served_name="coder-model", max_model_len=65536)
    models = {
        name: provider["models"]
        for name, provider in endpoints.opencode_config("spark-1", [short, enough])[
            "provider"
        ].items()
    }
    assert models["spark-1-fast"]["fast-model"]["name"] == (
        "fast-model (max_model_len 65535 is below 65536: agent clients refuse it (Hermes Agent"
        " needs 64K, seed 003))"
    )
    assert models["spark-1-coder"]["coder-model"]["name"] == "coder-model"
    # The 8K lane of ENDPOINTS too, and the deploy's report names it after the table.
    assert ENDPOINTS_SHORT_NAME in json.dumps(endpoints.opencode_config("spark-1", ENDPOINTS))


def test_endpoints_table() -> None:
    assert endpoints.endpoints_table({"spark-1": ENDPOINTS}).splitlines() == [
        "    box      lane   engine     served name       URL                      memory  API key",
        "    spark-1  coder  vllm       qwen3-coder-next  http://spark-1:10101/v1  0.45"
        "    /etc/spark/secrets/coder.key",
        "    spark-1  fast   llama.cpp  qwen3.6-35b-a3b   http://spark-1:10102/v1  0.35    none",
    ]


def test_report_after_a_run_only_for_boxes_whose_lanes_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_summary.EndpointsReport()
    report.endpoints = {"spark-1": ENDPOINTS, "spark-2": ENDPOINTS, "spark-3": ENDPOINTS}
    # spark-2 stopped at its lane; spark-3 only at the cluster stage, after its own lanes
    # (written by hand, as operations/util.refused words them).
    state = run_state(
        {
            "spark-2": ("Lanes and front | Lane coder: qwen3-coder-next on port 10101", "taken"),
            "spark-3": ("Cluster | NCCL test", "spark-3: the NCCL test ... waits for spark-2"),
        },
        current_stage=StateStage.Prepare,
        cwd=tmp_path,
    )
    spark_1 = Box("spark-1")
    state.inventory = [spark_1, *state.failed_hosts]
    state.activated_hosts = set(state.inventory)
    report.host_disconnect(state, None)  # a --dry run, or one that stopped early: nothing
    assert not (tmp_path / "clients").exists()
    state.current_stage = StateStage.Disconnect
    report.host_disconnect(state, None)
    report.host_disconnect(state, None)  # the next host's disconnect: once is enough
    written_boxes = sorted(path.name for path in (tmp_path / "clients").iterdir())
    assert written_boxes == ["spark-1.json", "spark-3.json"]
    written = json.loads((tmp_path / "clients/spark-1.json").read_text())
    assert sorted(written["provider"]) == ["spark-1-coder", "spark-1-fast"]
    assert written["provider"]["spark-1-coder"]["options"] == {
        "baseURL": "http://spark-1:10101/v1",
        "apiKey": "{file:~/.config/opencode/spark-1-coder.key}",
    }
    assert written["provider"]["spark-1-fast"]["models"]["qwen3.6-35b-a3b"]["name"] == (
        ENDPOINTS_SHORT_NAME
    )
    shown = capsys.readouterr().err
    assert shown.count("--> Lanes serving:") == 1
    assert "spark-1  coder" in shown and "spark-2" not in shown.split("OpenCode")[0]
    # The key file's name as the client files spell it (spark-1.local: spark-1-local-coder.key).
    assert (
        "    OpenCode: `make clients` writes one provider into ~/.config/opencode/opencode.json,"
        " the fleet's router with every served name, and copies the fleet key"
        " (/etc/spark/secrets/_fleet.key on the router's box) to"
        " ~/.config/opencode/<box>-_fleet.key. `make clients PER_LANE=1` (or with fleet_router"
        " False) instead copies each lane's key (/etc/spark/secrets/<lane>.key) to"
        " ~/.config/opencode/<box>-<lane>.key"
        " (spark-1 coder: spark-1-coder.key) and merges every box's providers"
        " (clients/<box>.json) into ~/.config/opencode/opencode.json."
    ) in shown.splitlines()
    assert (
        "    spark-1 fast: max_model_len 8192 is below 65536: agent clients refuse it (Hermes"
        " Agent needs 64K, seed 003)"
    ) in shown.splitlines()


def test_endpoints_of_a_box_from_its_validated_lanes() -> None:
    box = load_from_dicts(merged(TWO_SPARKS)).host("spark-1")
    # The default lanes of group_data/all.py: the field's two-lane appliance (seed 003).
    assert endpoints.endpoints_of(box, "10.0.0.5") == [
        endpoints.Endpoint(
            "coder", "vllm", "qwen3-coder-next", "http://10.0.0.5:10101/v1", 0.45, 131072, True
        ),
        endpoints.Endpoint(
            "fast", "vllm", "qwen3.6-35b-a3b", "http://10.0.0.5:10102/v1", 0.35, 65536, True
        ),
    ]


def test_the_client_files_go_where_spark_clients_dir_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPARK_CLIENTS_DIR", str(tmp_path / "lab-7" / "clients"))
    report = run_summary.EndpointsReport()
    report.endpoints = {"spark-1": ENDPOINTS}
    state = run_state({}, current_stage=StateStage.Disconnect, cwd=tmp_path)
    state.inventory = [Box("spark-1")]
    state.activated_hosts = set(state.inventory)
    report.host_disconnect(state, None)
    assert sorted(path.name for path in (tmp_path / "lab-7" / "clients").iterdir()) == [
        "spark-1.json"
    ]
    assert not (tmp_path / "clients").exists()

"""The router as a box runs it: spark/router.py (its pins, pip's and the unit's command lines,
LiteLLM's configuration), what the plan holds of it (spark/plan.py), the front's router port,
and operations/router.py (its fact, the fleet key, the router serving).

Expectations are worked out from the sources: LiteLLM 1.106.12's configuration keys as its
proxy reads them (litellm/proxy/_types.py ConfigGeneralSettings, proxy_server.py
_run_background_health_check), pip's options (pip install --help: --index-url, --trusted-host,
--only-binary), systemd.exec (DynamicUser=, EnvironmentFile=).

Captures: lab-router-state-deployed.txt is RouterState's command run under sudo on the
simulated lab's spark-1 (Debian 12) after a deploy of this branch (the router's box);
lab-router-state-bare.txt the same on spark-2 of that lab (no router there).
lab-router-left-*.txt are RouterLeft's command run under sudo on the simulated lab's hosts
(Debian 12): "bare" on a bare spark-2; "running" on spark-1 after a unit of that name (with
DynamicUser=, CacheDirectory=spark-router, ExecStart=/bin/sleep infinity), the keys file, the
configuration's directory and the virtualenv's directory were made by hand and the unit enabled
and started; "virtualenv" on that spark-1 after the commands that `removed` yields below, the
virtualenv kept, had run there.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
from pyinfra.context import ctx_state

from operations import front, router
from operations.lanes import key_made
from spark import router as litellm
from spark.box_paths import FLEET_KEY
from spark.fleet import tls_fronts
from spark.inventory import ConfigError, load_from_dicts
from spark.plan import plan
from stages.show_plan import fleet_text
from tests.unit.certificates import made
from tests.unit.harness import (
    FakeHost,
    captured,
    file_facts,
    needs_tools,
    process,
    refusal,
    run_of,
    run_op,
)
from tests.unit.test_config import TWO_SPARKS, merged
from tests.unit.test_fleet import independent, small
from tests.unit.test_readme import commands, fences

VENV = "/var/lib/spark/router/venv"
REQUIREMENTS = "/var/lib/spark/router/requirements.txt"
INSTALLED = f"{VENV}/spark-installed.txt"
ENVIRONMENT = "/etc/spark/secrets/_router.env"
CONFIG = "/etc/spark/router/litellm.yaml"
UNIT_PATH = "/etc/systemd/system/spark-router.service"
CA_BUNDLE = "/etc/spark/router/fronts-ca.pem"
SERVES = (
    "timeout 300 sh -c 'until curl -fsS -o /dev/null --max-time 5"
    " http://127.0.0.1:11100/health/liveliness; do sleep 1; done' || { echo 'spark-test:"
    " spark-router.service does not answer http://127.0.0.1:11100/health/liveliness after 300"
    " s; its journal:' >&2; journalctl -u spark-router.service -n 20 -o cat --no-pager >&2;"
    " exit 1; }"
)
FLEET = "F" * 43  # keys as the deploy makes them: 43 URL-safe base64 characters
CODER_A, CODER_B = "a" * 43, "b" * 43


# spark/router.py


def test_the_pinned_set_is_the_data_files_lines_with_its_pins() -> None:
    pinned = litellm.requirements()
    assert len(pinned) == 119  # pip freeze's 118 and async-timeout
    assert pinned[0] == 'async-timeout==5.0.1 ; python_full_version < "3.11.3"'
    assert "litellm==1.106.12" in pinned and "prometheus_client==0.26.0" in pinned
    assert all("==" in line for line in pinned)
    assert litellm.LITELLM == ("litellm[proxy]==1.106.12", "prometheus-client==0.26.0")


def test_pip_installs_wheels_from_pips_index_or_the_one_given() -> None:
    pip = f"{VENV}/bin/pip install --disable-pip-version-check --no-input --only-binary=:all:"
    requirements = f"-r {REQUIREMENTS}"
    assert " ".join(litellm.pip_command(None)) == f"{pip} {requirements}"
    assert " ".join(litellm.pip_command("https://mirror.example.internal/simple/")) == (
        f"{pip} --index-url https://mirror.example.internal/simple/ {requirements}"
    )
    # pip ignores an index over plain HTTP whose host it is not told to trust.
    assert " ".join(litellm.pip_command("http://10.77.0.1:8791/simple/")) == (
        f"{pip} --index-url http://10.77.0.1:8791/simple/ --trusted-host 10.77.0.1:8791"
        f" {requirements}"
    )


def test_the_router_listens_on_loopback_with_one_worker() -> None:
    assert litellm.server_command(11100) == (
        f"{VENV}/bin/litellm", "--config", CONFIG, "--host", "127.0.0.1", "--port", "11100",
        "--num_workers", "1",
    )  # fmt: skip


def test_litellm_config_names_each_key_and_leaves_on_demand_lanes_out_of_health_checks() -> None:
    config = litellm.litellm_config(
        [
            litellm.Deployment("coder", "http://a:10101/v1", "SPARK_LANE_KEY_1", False, 3600),
            litellm.Deployment("coder", "https://b:10105/v1", "SPARK_LANE_KEY_2", True, 4800),
            litellm.Deployment("open", "http://a:10106/v1", None, False, 3600),
        ],
        health_interval_s=10,
    )
    assert config == {
        "model_list": [
            {"model_name": "coder",
             "litellm_params": {"model": "hosted_vllm/coder", "api_base": "http://a:10101/v1",
                                "timeout": 3600, "api_key": "os.environ/SPARK_LANE_KEY_1"}},
            {"model_name": "coder",
             "litellm_params": {"model": "hosted_vllm/coder", "api_base": "https://b:10105/v1",
                                "timeout": 4800, "api_key": "os.environ/SPARK_LANE_KEY_2"},
             "model_info": {"disable_background_health_check": True}},
            {"model_name": "open",
             "litellm_params": {"model": "hosted_vllm/open", "api_base": "http://a:10106/v1",
                                "timeout": 3600}},
        ],
        "general_settings": {
            "master_key": "os.environ/SPARK_FLEET_KEY",
            "background_health_checks": True,
            "health_check_interval": 10,
            "enable_health_check_routing": True,
            "health_check_skip_disabled_background_models": True,
        },
        "router_settings": {"num_retries": 2, "allowed_fails": 1, "cooldown_time": 30},
        "litellm_settings": {"callbacks": ["prometheus"], "telemetry": False},
    }  # fmt: skip


def test_the_routers_front_waits_for_every_try_litellm_makes_of_a_route() -> None:
    """LiteLLM 1.106.12 tries a request once, then num_retries (2) more times
    (litellm/router.py async_function_with_retries), each try waiting up to the route's
    timeout, and sleeps before each retry at most 60 s (a Retry-After it obeys) + 0.75 s of
    jitter (litellm/utils.py calculate_retry_after), rounded up to 61; 60 s of margin. A resident
    lane's route, one hour: 3 x 3,600 + 2 x 61 + 60 = 10,982 s."""
    assert litellm.front_timeout_s(3600) == 10982
    assert litellm.front_timeout_s(60) == 362  # 3 x 60 + 2 x 61 + 60


def test_litellm_verifies_the_fronts_with_the_bundle_where_one_speaks_tls() -> None:
    lane = litellm.Deployment("coder", "https://a:10101/v1", None, False, 3600)
    settings = litellm.litellm_config([lane], 10, "/etc/spark/router/fronts-ca.pem")[
        "litellm_settings"
    ]
    assert settings == {
        "callbacks": ["prometheus"],
        "telemetry": False,
        "ssl_verify": "/etc/spark/router/fronts-ca.pem",
    }
    assert "ssl_verify" not in litellm.litellm_config([lane], 10)["litellm_settings"]


# What the plan holds of it.


def fleet_plan(**changes: Any):
    a = small("coder", 10101, 0.4, served_name="coder")
    b = small("coder-b", 10105, 0.3, served_name="coder", on_demand_idle_s=600)
    boxes = independent(a={"lanes": [a]}, b={"lanes": [b]})
    return plan(load_from_dicts(merged({k: v | changes for k, v in boxes.items()})))


def test_the_plan_holds_the_routers_commands_its_config_and_each_lanes_key_variable() -> None:
    whole = fleet_plan(router_failover_box="b", router_pip_index="http://10.0.0.1:8791/simple/")
    fleet = whole.fleet
    assert [backend.key_variable for backend in fleet.routes[0].backends] == [
        "SPARK_LANE_KEY_1",
        "SPARK_LANE_KEY_2",
    ]
    assert fleet.pip_index == "http://10.0.0.1:8791/simple/"
    assert fleet.pip_command[-6:] == (
        "--index-url", "http://10.0.0.1:8791/simple/", "--trusted-host", "10.0.0.1:8791",
        "-r", REQUIREMENTS,
    )  # fmt: skip
    assert fleet.unit_command[-3:] == ("11100", "--num_workers", "1")
    assert len(fleet.requirements) == 119
    assert fleet.fleet_key_variable == "SPARK_FLEET_KEY"
    # The lanes through their boxes' fronts (the box's address: where the inventory reaches it).
    assert [entry["litellm_params"]["api_base"] for entry in fleet.config["model_list"]] == [
        "http://a:10101/v1",
        "http://b:10105/v1",
    ]
    assert fleet.config["model_list"][1]["model_info"] == {"disable_background_health_check": True}
    # The router's port on the fronts of its boxes only; the failover takes the first's key.
    assert whole.box("a").front.router.model_dump() == {
        "port": 10100, "backend_port": 11100, "allow_networks": (), "key_from": None,
        "timeout_s": 14582,  # every try of b's on-demand lane's route: below
    }  # fmt: skip
    assert whole.box("b").front.router.key_from == "a"
    assert fleet_plan().box("b").front.router is None


def test_an_on_demand_lanes_route_and_front_wait_for_its_load_then_its_answer() -> None:
    """b's lane coder-b is on demand: its first request waits for its load, bounded by b's
    lane_start_timeout_min (group_data: 20, so 1,200 s), then for its answer as any lane's
    (ANSWER_WAIT_S, 3,600 s); a's resident lane only for its answer. The router's front waits
    for every try LiteLLM makes of its longest route (below); each lane's front as long as the
    router waits for the lane."""
    whole = fleet_plan()
    assert [backend.timeout_s for backend in whole.fleet.routes[0].backends] == [3600, 4800]
    assert [entry["litellm_params"]["timeout"] for entry in whole.fleet.config["model_list"]] == [
        3600,
        4800,
    ]
    assert whole.box("a").front.router.timeout_s == 14582  # 3 x 4,800 + 2 x 61 + 60
    assert [lane.timeout_s for lane in whole.box("a").front.lanes] == [3600]
    assert [lane.timeout_s for lane in whole.box("b").front.lanes] == [4800]
    # A longer start timeout on b: its lane's route and front, and the router's front, wait longer.
    longer = fleet_plan(lane_start_timeout_min=240)  # 14,400 s
    assert [backend.timeout_s for backend in longer.fleet.routes[0].backends] == [3600, 18000]
    assert longer.box("a").front.router.timeout_s == 54182  # 3 x 18,000 + 2 x 61 + 60
    assert [lane.timeout_s for lane in longer.box("b").front.lanes] == [18000]


def test_the_routers_port_admits_the_clients_and_the_scrapers_networks() -> None:
    whole = fleet_plan(
        front_allow_networks=["192.168.1.0/24"], metrics_allow_networks=["10.9.0.0/16"]
    )
    assert whole.box("a").front.router.allow_networks == ("192.168.1.0/24", "10.9.0.0/16")
    # Clients from anywhere: the scrapers too.
    assert (
        fleet_plan(metrics_allow_networks=["10.9.0.0/16"]).box("a").front.router.allow_networks
        == ()
    )


def test_the_cluster_firewall_keeps_the_routers_port_open_on_its_box() -> None:
    whole = plan(load_from_dicts(merged(TWO_SPARKS)))
    head, worker = whole.boxes
    assert 10100 in head.cluster.firewall.open_ports
    assert 10100 not in worker.cluster.firewall.open_ports


# The front's router port.


def test_the_routers_server_asks_the_fleet_key_on_every_path() -> None:
    source = (Path(__file__).parents[2] / "templates" / "nginx-spark-lanes.conf.j2").read_text()
    port = front.RouterPort(10100, 11100, ("192.168.1.0/24",), timeout_s=3600)
    text = jinja2.Template(source, keep_trailing_newline=True).render(
        lanes=[], router=port, allow_networks=[], tls=False, keys_dir="/etc/nginx/spark-keys",
        key_variables={"_fleet": front.key_variable("_fleet")},
    )  # fmt: skip
    server = text[text.index("server {") :]
    assert "include /etc/nginx/spark-keys/_fleet.conf;\nserver {" in text
    assert "    listen 10100;\n    allow 192.168.1.0/24;\n    deny all;\n" in server
    assert server.index("if ($spark_key__fleet = 0) {") < server.index("    location ")
    locations = [line.strip() for line in server.splitlines() if line.startswith("    location")]
    assert locations == ["location /v1/ {", "location /health/ {", "location /metrics/ {",
                         "location / {"]  # fmt: skip
    assert server.count("proxy_pass http://127.0.0.1:11100;") == 3
    assert "proxy_read_timeout 3600s;\n    proxy_send_timeout 3600s;\n" in server
    # Its key map is the fleet key's, made where the box has none, as a lane's.
    coder = front.FrontLane("coder", 10101, 11101, key=True, timeout_s=3600)
    assert front.keyed_lanes([coder], port) == (
        "coder",
        "_fleet",
    )
    assert key_made("_fleet").startswith(f"[ -s {FLEET_KEY} ] || ")


# operations/router.py


def test_the_fact_reads_the_routers_box_and_a_bare_one() -> None:
    assert process(router.RouterState, captured("lab-router-state-deployed.txt")) == {
        "venv_package": True, "venv": True, "active": "active", "enabled": "enabled",
    }  # fmt: skip
    assert process(router.RouterState, captured("lab-router-state-bare.txt")) == {
        "venv_package": False, "venv": False, "active": "inactive", "enabled": None,
    }  # fmt: skip


def root_files(files: dict[str, tuple[str, str] | None]) -> str:
    """RootFiles' lines (operations/util.py): each path's owner, group, mode and SHA-1."""
    return "\n".join(
        f"{path}\t-" if found is None
        else f"{path}\troot root {found[0]} {hashlib.sha1(found[1].encode()).hexdigest()}"
        for path, found in files.items()
    )  # fmt: skip


def _run(*hosts: FakeHost):
    """A run holding these boxes (the others left out of it)."""
    return ctx_state.use(run_of(*hosts))


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str], str]:
    """The key files of the boxes (box, path): what read_secret finds there."""
    found = {
        ("spark-test", FLEET_KEY): FLEET,
        ("a", FLEET_KEY): FLEET,
        ("a", "/etc/spark/secrets/coder.key"): CODER_A,
        ("b", "/etc/spark/secrets/coder-b.key"): CODER_B,
    }
    monkeypatch.setattr(router, "read_secret", lambda box, path: found.get((box.name, path)))
    return found


def test_the_fleet_key_is_made_where_there_is_none_and_kept_where_there_is() -> None:
    bare = FakeHost({router.util.RootFiles: root_files({FLEET_KEY: None})})
    assert run_op(router.fleet_key, host=bare) == [
        f"install -d -m 700 -o root -g root /etc/spark/secrets && {key_made('_fleet')}"
    ]
    made = FakeHost({router.util.RootFiles: root_files({FLEET_KEY: ("600", FLEET)})})
    assert run_op(router.fleet_key, host=made) == []
    assert made.noops == [f"{FLEET_KEY} is there"]


def test_a_failover_takes_the_first_routers_key_root_only(keys: dict) -> None:
    first = FakeHost({}, name="a")
    failover = FakeHost({router.util.RootFiles: root_files({FLEET_KEY: ("600", "other")})})
    with _run(first, failover):
        commands = run_op(router.fleet_key, host=failover, source="a")
    assert failover.uploads == {FLEET_KEY: FLEET}
    assert commands[0].startswith("install -d -m 700 -o root -g root /etc/spark/secrets")
    assert "chmod 600 /etc/spark/secrets/_fleet.key" in commands[0]


def test_a_failover_whose_first_router_is_not_in_the_run_stops(keys: dict) -> None:
    failover = FakeHost({router.util.RootFiles: root_files({FLEET_KEY: None})})
    with _run(failover):
        said = refusal(run_op(router.fleet_key, host=failover, source="a"))
    assert said == (
        "spark-test: router_failover_box takes the fleet key of a, which is not in this run or"
        " has none yet (/etc/spark/secrets/_fleet.key); deploy a too"
    )


SERVING = {
    "requirements": ["litellm==1.106.12", "prometheus_client==0.26.0"],
    "pip_command": [f"{VENV}/bin/pip", "install", "-r", REQUIREMENTS],
    "config": {"model_list": []},
    "unit_command": [f"{VENV}/bin/litellm", "--port", "11100"],
    "loopback_port": 11100,
    "keys": [("SPARK_LANE_KEY_1", "a", "coder"), ("SPARK_LANE_KEY_2", "b", "coder-b")],
}
WANTED_REQUIREMENTS = "litellm==1.106.12\nprometheus_client==0.26.0\n"
WANTED_ENVIRONMENT = (
    f"SPARK_FLEET_KEY={FLEET}\nSPARK_LANE_KEY_1={CODER_A}\nSPARK_LANE_KEY_2={CODER_B}\n"
)


def router_box(state: str, files: dict[str, tuple[str, str] | None]) -> FakeHost:
    """A box in this RouterState (a capture's name) holding these files (mode, text)."""
    return FakeHost(
        {**file_facts({path: found and found[1] for path, found in files.items()}),
         router.RouterState: captured(f"lab-router-state-{state}.txt"),
         router.util.RootFiles: root_files(files)}
    )  # fmt: skip


def test_a_bare_box_gets_the_virtualenv_the_keys_the_config_and_the_unit_started(
    keys: dict,
) -> None:
    box = router_box(
        "bare", dict.fromkeys((REQUIREMENTS, INSTALLED, ENVIRONMENT, CONFIG, UNIT_PATH))
    )
    with _run(box, FakeHost({}, name="a"), FakeHost({}, name="b")):
        commands = run_op(router.serving, host=box, **SERVING)
    assert commands[:2] == [
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o"
        " DPkg::Lock::Timeout=600 install -y -o Dpkg::Options::=--force-confdef -o"
        " Dpkg::Options::=--force-confold python3-venv",
        f"install -d -m 755 /var/lib/spark/router && python3 -m venv {VENV}",
    ]
    assert f"{VENV}/bin/pip install -r {REQUIREMENTS} && cp {REQUIREMENTS} {INSTALLED}" in commands
    assert commands[-3:] == [
        "systemctl daemon-reload",
        "systemctl enable spark-router.service",
        f"systemctl restart spark-router.service && {SERVES}",
    ]
    assert box.uploads[REQUIREMENTS] == WANTED_REQUIREMENTS
    assert box.uploads[ENVIRONMENT] == WANTED_ENVIRONMENT
    assert json.loads(box.uploads[CONFIG]) == {"model_list": []}
    unit = box.uploads[UNIT_PATH]
    for line in (
        "DynamicUser=yes",
        f"EnvironmentFile={ENVIRONMENT}",
        "Environment=LITELLM_LOCAL_MODEL_COST_MAP=True",
        f"ExecStart={VENV}/bin/litellm --port 11100",
        "Restart=on-failure",
        "WantedBy=multi-user.target",
    ):
        assert f"\n{line}\n" in unit
    assert FLEET not in unit and CODER_A not in " ".join(commands)


def deployed_files() -> dict[str, tuple[str, str]]:
    config = json.dumps({"model_list": []}, indent=2) + "\n"
    unit_box = router_box(
        "bare", dict.fromkeys((REQUIREMENTS, INSTALLED, ENVIRONMENT, CONFIG, UNIT_PATH))
    )
    return {
        REQUIREMENTS: ("644", WANTED_REQUIREMENTS),
        INSTALLED: ("644", WANTED_REQUIREMENTS),
        ENVIRONMENT: ("600", WANTED_ENVIRONMENT),
        CONFIG: ("644", config),
        UNIT_PATH: ("644", _unit(unit_box)),
    }


def _unit(box: FakeHost) -> str:
    with _run(box, FakeHost({}, name="a"), FakeHost({}, name="b")):
        run_op(router.serving, host=box, **SERVING)
    return box.uploads[UNIT_PATH]


def test_a_deployed_box_changes_nothing(keys: dict) -> None:
    box = router_box("deployed", deployed_files())
    with _run(box, FakeHost({}, name="a"), FakeHost({}, name="b")):
        assert run_op(router.serving, host=box, **SERVING) == []
    assert box.noops == [
        f"file {REQUIREMENTS} is already uploaded",
        f"file {CONFIG} is already uploaded",
        f"file {UNIT_PATH} is already uploaded",
        "spark-router.service serves on 127.0.0.1:11100",
    ]


def test_a_new_key_rewrites_the_environment_and_restarts_the_router(keys: dict) -> None:
    keys[("b", "/etc/spark/secrets/coder-b.key")] = "c" * 43
    box = router_box("deployed", deployed_files())
    with _run(box, FakeHost({}, name="a"), FakeHost({}, name="b")):
        commands = run_op(router.serving, host=box, **SERVING)
    assert box.uploads == {ENVIRONMENT: WANTED_ENVIRONMENT.replace(CODER_B, "c" * 43)}
    assert commands[-1] == f"systemctl restart spark-router.service && {SERVES}"


def test_a_box_left_out_of_the_run_keeps_its_key_from_the_environment_file(keys: dict) -> None:
    keys[("spark-test", ENVIRONMENT)] = WANTED_ENVIRONMENT
    box = router_box("deployed", deployed_files())
    with _run(box, FakeHost({}, name="a")):  # b left out (--limit)
        assert run_op(router.serving, host=box, **SERVING) == []


def test_a_key_found_nowhere_stops_the_routers_box(keys: dict) -> None:
    box = router_box(
        "bare", dict.fromkeys((REQUIREMENTS, INSTALLED, ENVIRONMENT, CONFIG, UNIT_PATH))
    )
    with _run(box, FakeHost({}, name="a")):  # b left out, and no file on this box yet
        said = refusal(run_op(router.serving, host=box, **SERVING))
    assert said == (
        "spark-test: the router holds every lane's key, and cannot read"
        " b:/etc/spark/secrets/coder-b.key (a box not deployed yet, left out of this run or"
        " stopped in it); deploy every box of the fleet"
    )


CACHE = (
    "/var/cache/spark-router",
    "/var/cache/private/spark-router",
)  # systemd.exec: CacheDirectory=


def test_the_left_fact_reads_a_router_and_a_bare_box() -> None:
    assert process(router.RouterLeft, captured("lab-router-left-running.txt")) == {
        "active": "active",
        "enabled": "enabled",
        "left": [UNIT_PATH, ENVIRONMENT, "/etc/spark/router", *CACHE, "/var/lib/spark/router"],
    }
    assert process(router.RouterLeft, captured("lab-router-left-bare.txt")) == {
        "active": "inactive", "enabled": None, "left": [],
    }  # fmt: skip
    assert process(router.RouterLeft, captured("lab-router-left-virtualenv.txt")) == {
        "active": "inactive", "enabled": None, "left": ["/var/lib/spark/router"],
    }  # fmt: skip


def left(capture: str) -> FakeHost:
    return FakeHost({router.RouterLeft: captured(f"lab-router-left-{capture}.txt")})


def test_a_router_left_on_a_box_is_stopped_and_removed_its_virtualenv_kept() -> None:
    assert run_op(router.removed, host=left("running"), keep_virtualenv=True) == [
        "systemctl disable --now spark-router.service",
        f"rm -rf {UNIT_PATH} {ENVIRONMENT} /etc/spark/router {' '.join(CACHE)}",
        "systemctl daemon-reload",
    ]


def test_a_box_that_prunes_loses_the_virtualenv_too() -> None:
    assert run_op(router.removed, host=left("running"), keep_virtualenv=False) == [
        "systemctl disable --now spark-router.service",
        f"rm -rf {UNIT_PATH} {ENVIRONMENT} /etc/spark/router {' '.join(CACHE)}"
        " /var/lib/spark/router",
        "systemctl daemon-reload",
    ]
    virtualenv = left("virtualenv")
    assert run_op(router.removed, host=virtualenv, keep_virtualenv=False) == [
        "rm -rf /var/lib/spark/router"
    ]


def test_a_box_without_a_router_changes_nothing() -> None:
    bare = left("bare")
    assert run_op(router.removed, host=bare, keep_virtualenv=True) == []
    assert bare.noops == ["no router here"]
    kept = left("virtualenv")
    assert run_op(router.removed, host=kept, keep_virtualenv=True) == []
    assert kept.noops == ["no router here (its virtualenv kept)"]


def test_a_failed_router_whose_unit_is_gone_is_stopped_and_forgotten() -> None:
    """Its unit file removed by hand while it had failed: systemd still holds it (failed)."""
    failed = FakeHost({router.RouterLeft: "ActiveState=failed\nUnitFileState="})
    assert run_op(router.removed, host=failed, keep_virtualenv=True) == [
        "systemctl stop spark-router.service",
        "systemctl reset-failed spark-router.service || true",
    ]


# The router's trust of the TLS fronts (front_tls_ca_file; spark/trust.py).


def tls(front: made, authority: made | None = None) -> dict[str, str]:
    data = {
        "front_tls_certificate_file": str(front.path),
        "front_tls_key_file": str(front.key_path),
    }
    return data | ({"front_tls_ca_file": str(authority.path)} if authority else {})


def two_fronts(a: dict[str, str], b: dict[str, str]):
    """Boxes a and b (the fleet_plan's), each with these keys."""
    lanes_a = [small("coder", 10101, 0.4, served_name="coder")]
    lanes_b = [small("coder-b", 10105, 0.3, served_name="coder")]
    boxes = independent(a={"lanes": lanes_a} | a, b={"lanes": lanes_b} | b)
    return load_from_dicts(merged(boxes))


def test_the_bundle_holds_each_tls_fronts_authority_once_in_inventory_order(
    tmp_path: Path,
) -> None:
    """a's front self-signed (its own file trusted), b's signed by an authority given."""
    authority = made(tmp_path / "ca", "fleet authority")
    front_a = made(tmp_path / "a", "a", ("a",))
    front_b = made(tmp_path / "b", "b", ("b",), issuer=authority)
    fleet = plan(two_fronts(tls(front_a), tls(front_b, authority))).fleet
    assert fleet.ca_files == (str(front_a.path), str(authority.path))
    assert fleet.ca_bundle == "/etc/spark/router/fronts-ca.pem"
    assert fleet.config["litellm_settings"]["ssl_verify"] == "/etc/spark/router/fronts-ca.pem"
    assert [entry["litellm_params"]["api_base"] for entry in fleet.config["model_list"]] == [
        "https://a:10101/v1",
        "https://b:10105/v1",
    ]
    # One authority for both: once. No TLS front: no bundle, certifi's trust (LiteLLM's own).
    front_a2 = made(tmp_path / "a2", "a", ("a",), issuer=authority)
    both = plan(two_fronts(tls(front_a2, authority), tls(front_b, authority))).fleet
    assert both.ca_files == (str(authority.path),)
    assert (
        f"TLS fronts verified with /etc/spark/router/fronts-ca.pem: {authority.path}\n"
        in fleet_text(both)
    )
    plain = plan(two_fronts({}, {})).fleet
    assert (plain.ca_files, plain.ca_bundle) == ((), None)
    assert "ssl_verify" not in plain.config["litellm_settings"]


def test_a_front_the_router_cannot_verify_is_refused_naming_the_box_the_key_and_the_fix(
    tmp_path: Path,
) -> None:
    authority = made(tmp_path / "ca", "fleet authority")
    other = made(tmp_path / "other", "another authority")
    signed = made(tmp_path / "a", "a", ("a",), issuer=authority)
    elsewhere = made(tmp_path / "b", "b", ("10.0.0.9", "b.lan"))
    with pytest.raises(ConfigError) as caught:
        two_fronts(tls(signed), tls(elsewhere))
    assert caught.value.problems == [
        "a: front_tls_certificate_file: the fleet's router trusts the certificate file's own"
        " certificates, and the front's certificate does not chain to one: 'a' is signed by"
        " 'CN=fleet authority', which is not among them; give the authority that signed it"
        " (its self-signed root) in front_tls_ca_file",
        "b: front_tls_certificate_file: its subjectAltName (IP:10.0.0.9, DNS:b.lan) does not"
        " cover b, where the router reaches the box (its ssh_hostname, else its name); make the"
        " certificate with subjectAltName DNS:b",
    ]
    with pytest.raises(ConfigError) as caught:
        two_fronts(tls(signed, other), {"ssh_hostname": "10.0.0.8"} | tls(elsewhere))
    assert caught.value.problems == [
        "a: front_tls_ca_file: the fleet's router trusts front_tls_ca_file's certificates, and"
        " the front's certificate does not chain to one: 'a' is signed by 'CN=fleet"
        " authority', which is not among them; give the authority that signed it (its"
        " self-signed root) in front_tls_ca_file",
        "b: front_tls_certificate_file: its subjectAltName (IP:10.0.0.9, DNS:b.lan) does not"
        " cover 10.0.0.8, where the router reaches the box (its ssh_hostname, else its name);"
        " make the certificate with subjectAltName IP:10.0.0.8",
    ]
    # An address the certificate names, and a wildcard of its domain: both pass.
    wild = made(tmp_path / "w", "b", ("*.lan",))
    two_fronts(tls(signed, authority), {"ssh_hostname": "b.lan"} | tls(wild))
    two_fronts(tls(signed, authority), {"ssh_hostname": "10.0.0.9"} | tls(elsewhere))


def test_the_authority_file_must_hold_a_pem_certificate(tmp_path: Path) -> None:
    front = made(tmp_path / "a", "a", ("a",))
    with pytest.raises(ConfigError) as caught:
        two_fronts(tls(front) | {"front_tls_ca_file": str(front.key_path)}, {})
    assert caught.value.problems == [
        "a: front_tls_ca_file: the file holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    ]


def test_the_router_reaches_over_tls_the_fronts_with_a_certificate_and_lanes(
    tmp_path: Path,
) -> None:
    """In the inventory's order: b's front has no lanes behind it, c's no certificate."""
    fronts = {name: tls(made(tmp_path / name, name, (name,))) for name in ("a", "b", "d")}
    boxes = independent(
        a={"lanes": [small("la", 10101, 0.3)]} | fronts["a"],
        b={"lanes": []} | fronts["b"],
        c={"lanes": [small("lc", 10101, 0.3)]},
        d={"lanes": [small("ld", 10101, 0.3)]} | fronts["d"],
    )
    hosts = load_from_dicts(merged(boxes)).hosts
    assert [host.name for host in tls_fronts(hosts)] == ["a", "d"]


def unreadable(path: Path) -> str:
    """A file with PEM's certificate markers around what is no certificate: past the inventory's
    marker check (spark/inventory/front.py), refused where cryptography reads it."""
    path.write_text(
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
    )
    return str(path)


def refused(a: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        two_fronts(a, {})
    return caught.value.problems


def test_a_certificate_file_cryptography_cannot_read_is_named_by_its_own_key(
    tmp_path: Path,
) -> None:
    authority = made(tmp_path / "ca", "fleet authority")
    front = made(tmp_path / "a", "a", ("a",), issuer=authority)
    bad = unreadable(tmp_path / "bad.pem")
    cert = "a: front_tls_certificate_file: cryptography reads no certificate there"
    ca = "a: front_tls_ca_file: cryptography reads no certificate there"
    for data, said in [
        # The front's own certificate unreadable, with and without a CA file beside it.
        (tls(front, authority) | {"front_tls_certificate_file": bad}, [cert]),
        (tls(front) | {"front_tls_certificate_file": bad}, [cert]),
        # The CA file unreadable; then both, each named.
        (tls(front) | {"front_tls_ca_file": bad}, [ca]),
        (tls(front) | {"front_tls_certificate_file": bad, "front_tls_ca_file": bad}, [cert, ca]),
    ]:
        problems = refused(data)
        # cryptography's own words come between the parentheses (they vary by its release).
        assert [problem.partition(" (")[0] for problem in problems] == said
        assert [problem.rpartition(")")[2] for problem in problems] == ["; give PEM ones"] * len(
            said
        )


def test_the_router_writes_its_bundle_and_removes_one_no_front_needs(
    keys: dict, tmp_path: Path
) -> None:
    authority = made(tmp_path / "ca", "fleet authority")
    front = made(tmp_path / "a", "a", ("a",))
    bundle = front.path.read_text() + authority.path.read_text()
    box = router_box("deployed", deployed_files() | {CA_BUNDLE: None})
    ca = {"ca_files": [str(front.path), str(authority.path)], "ca_bundle": CA_BUNDLE}
    with _run(box, FakeHost({}, name="a"), FakeHost({}, name="b")):
        commands = run_op(router.serving, host=box, **SERVING, **ca)
    assert box.uploads == {CA_BUNDLE: bundle}
    assert commands[-1] == f"systemctl restart spark-router.service && {SERVES}"
    # Written: nothing to do. TLS gone from every front: the bundle removed, the router restarted.
    written = router_box("deployed", deployed_files() | {CA_BUNDLE: ("644", bundle)})
    with _run(written, FakeHost({}, name="a"), FakeHost({}, name="b")):
        assert run_op(router.serving, host=written, **SERVING, **ca) == []
    with _run(written, FakeHost({}, name="a"), FakeHost({}, name="b")):
        commands = run_op(router.serving, host=written, **SERVING)
    assert commands == [
        f"rm -f {CA_BUNDLE}",
        f"systemctl restart spark-router.service && {SERVES}",
    ]


def router_doc_commands() -> list[str]:
    """The sh commands of docs/router.md, as a reader copies them (continuations joined)."""
    text = (Path(__file__).parents[2] / "docs" / "router.md").read_text()
    return [command for tag, block in fences(text) if tag == "sh" for command in commands(block)]


def test_the_docs_self_signed_certificate_is_one_the_router_trusts(tmp_path: Path) -> None:
    """docs/router.md's openssl command, run as written: the certificate it makes passes the
    router's checks as a box's front (spark-1.local, or 192.168.1.21), self-signed, with
    front_tls_ca_file None; at an address it does not name, refused."""
    needs_tools("openssl")
    (made_here,) = [command for command in router_doc_commands() if command.startswith("openssl")]
    done = subprocess.run(made_here, shell=True, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    files = {"front_tls_certificate_file": str(tmp_path / "spark-1.pem")}
    files["front_tls_key_file"] = str(tmp_path / "spark-1.key")
    for address in ("spark-1.local", "192.168.1.21"):
        fleet = plan(two_fronts({"ssh_hostname": address} | files, {})).fleet
        assert fleet.ca_files == (str(tmp_path / "spark-1.pem"),)
    with pytest.raises(ConfigError) as caught:
        two_fronts({"ssh_hostname": "spark-2.local"} | files, {})
    assert caught.value.problems == [
        "a: front_tls_certificate_file: its subjectAltName (IP:192.168.1.21, DNS:spark-1.local)"
        " does not cover spark-2.local, where the router reaches the box (its ssh_hostname,"
        " else its name); make the certificate with subjectAltName DNS:spark-2.local"
    ]

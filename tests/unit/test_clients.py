"""stages/clients.py (`make clients`): the lanes' keys and one OpenCode configuration for the
fleet, written into a client's configuration directory."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import paramiko
import pytest

from endpoints import Endpoint, RouterEndpoint, routers_of, served_models
from spark.inventory import load_from_dicts
from spark.plan import plan
from stages import clients, prometheus_config, status

from .certificates import made
from .test_config import REPO, TWO_SPARKS, merged
from .test_preconnect import closed_port

CODER = Endpoint(
    "coder", "vllm", "qwen3-coder-next", "http://10.0.0.5:10101/v1", 0.45, 131072, True
)
FAST = Endpoint("fast", "vllm", "qwen3.6-35b-a3b", "http://10.0.0.5:10102/v1", 0.35, 65536, True)
OPEN = Endpoint("open", "llama.cpp", "tiny", "http://10.0.0.6:10103/v1", 0.1, 65536, False)
KEYS = "~/.config/opencode"
# The owner's own settings and provider in opencode.json, which the command must keep.
OWNERS = {"theme": "opencode", "provider": {"mine": {"options": {"baseURL": "http://x/v1"}}}}


def reader(keys: dict[str, dict[str, str]], unreachable: tuple[str, ...] = ()):
    """A KeyReader over keys given per box and lane; the lanes asked for, recorded."""
    asked: list[tuple[str, list[str]]] = []

    def read(box: str, lanes: list[str]) -> clients.Keys | str:
        asked.append((box, lanes))
        if box in unreachable:
            return "cannot connect: timed out"
        own = keys.get(box, {})
        return clients.Keys(
            {lane: own[lane] for lane in lanes if lane in own},
            [f"{lane}: no key read (No such file)" for lane in lanes if lane not in own],
        )

    read.asked = asked  # type: ignore[attr-defined]
    return read


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keys_written_0600_and_every_lane_of_every_box_in_one_configuration(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "opencode"
    directory.mkdir()
    (directory / "opencode.json").write_text(json.dumps(OWNERS))
    fleet = {"Spark-1.local": [CODER, FAST], "spark-2": [OPEN]}
    read = reader({"Spark-1.local": {"coder": "sk-coder", "fast": "sk-fast"}})
    assert clients.update_clients(fleet, read, directory, KEYS) == []
    # spark-2's only lane has no key: its box is not even asked.
    assert read.asked == [("Spark-1.local", ["coder", "fast"])]
    assert (directory / "spark-1-local-coder.key").read_text() == "sk-coder\n"
    assert (directory / "spark-1-local-fast.key").read_text() == "sk-fast\n"
    assert mode(directory / "spark-1-local-coder.key") == 0o600
    config = json.loads((directory / "opencode.json").read_text())
    assert config["theme"] == "opencode"
    assert config["$schema"] == "https://opencode.ai/config.json"
    assert sorted(config["provider"]) == [
        "mine",
        "spark-1-local-coder",
        "spark-1-local-fast",
        "spark-2-open",
    ]
    assert config["provider"]["spark-1-local-coder"]["options"] == {
        "baseURL": "http://10.0.0.5:10101/v1",
        "apiKey": "{file:~/.config/opencode/spark-1-local-coder.key}",
    }
    assert config["provider"]["spark-2-open"]["options"] == {"baseURL": "http://10.0.0.6:10103/v1"}
    assert json.loads((directory / "spark-clients.json").read_text()) == {
        "Spark-1.local": {
            "keys": ["spark-1-local-coder.key", "spark-1-local-fast.key"],
            "providers": ["spark-1-local-coder", "spark-1-local-fast"],
        },
        "spark-2": {"keys": [], "providers": ["spark-2-open"]},
    }
    assert not list(directory.glob(".*partial"))


def test_a_removed_lane_and_a_removed_box_leave_neither_provider_nor_key(tmp_path: Path) -> None:
    keys = {"spark-1": {"coder": "sk-1c", "fast": "sk-1f"}, "spark-2": {"coder": "sk-2c"}}
    clients.update_clients(
        {"spark-1": [CODER, FAST], "spark-2": [CODER]}, reader(keys), tmp_path, KEYS
    )
    assert (tmp_path / "spark-2-coder.key").exists()
    # The fast lane taken off spark-1, spark-2 taken out of the inventory.
    assert clients.update_clients({"spark-1": [CODER]}, reader(keys), tmp_path, KEYS) == []
    assert sorted(path.name for path in tmp_path.glob("*.key")) == ["spark-1-coder.key"]
    config = json.loads((tmp_path / "opencode.json").read_text())
    assert sorted(config["provider"]) == ["spark-1-coder"]
    # A box whose every lane was removed: nothing of it either, and no empty provider left.
    assert clients.update_clients({"spark-1": []}, reader(keys), tmp_path, KEYS) == []
    assert list(tmp_path.glob("*.key")) == []
    assert json.loads((tmp_path / "opencode.json").read_text()) == {
        "$schema": "https://opencode.ai/config.json"
    }


def test_an_unreachable_box_keeps_what_it_had_and_a_missing_key_is_named(tmp_path: Path) -> None:
    keys = {"spark-1": {"coder": "sk-1c"}, "spark-2": {"coder": "sk-2c"}}
    fleet = {"spark-1": [CODER], "spark-2": [CODER]}
    clients.update_clients(fleet, reader(keys), tmp_path, KEYS)
    # spark-2 switched off; spark-1's fast lane added in the inventory, not deployed yet.
    problems = clients.update_clients(
        {"spark-1": [CODER, FAST], "spark-2": [CODER]},
        reader(keys, unreachable=("spark-2",)),
        tmp_path,
        KEYS,
    )
    assert problems == [
        "spark-1: fast: no key read (No such file)",
        "spark-2: cannot connect: timed out; its providers and keys are kept as they were",
    ]
    assert (tmp_path / "spark-2-coder.key").read_text() == "sk-2c\n"
    config = json.loads((tmp_path / "opencode.json").read_text())
    assert sorted(config["provider"]) == ["spark-1-coder", "spark-2-coder"]
    assert json.loads((tmp_path / "spark-clients.json").read_text())["spark-2"] == {
        "keys": ["spark-2-coder.key"],
        "providers": ["spark-2-coder"],
    }


def test_a_configuration_with_comments_is_left_alone(tmp_path: Path) -> None:
    # OpenCode reads JSON with comments (JSONC); this command would lose them: it writes nothing.
    text = '{\n  // mine\n  "theme": "opencode"\n}\n'
    (tmp_path / "opencode.json").write_text(text)
    problems = clients.update_clients(
        {"spark-1": [CODER]}, reader({"spark-1": {"coder": "k"}}), tmp_path, KEYS
    )
    assert len(problems) == 1 and problems[0].endswith("nothing written (merge by hand)")
    assert (tmp_path / "opencode.json").read_text() == text
    assert sorted(path.name for path in tmp_path.iterdir()) == ["opencode.json"]


def test_write_private_is_0600_under_any_umask_and_replaces(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        clients.write_private(tmp_path / "k", "one\n")
        clients.write_private(tmp_path / "k", "two\n")
    finally:
        os.umask(old)
    assert mode(tmp_path / "k") == 0o600
    assert (tmp_path / "k").read_text() == "two\n"


class FakeChannel:
    def __init__(self, status: int) -> None:
        self.status = status

    def recv_exit_status(self) -> int:
        return self.status


class FakeStream(io.BytesIO):
    def __init__(self, data: bytes, status: int = 0) -> None:
        super().__init__(data)
        self.channel = FakeChannel(status)


class FakeClient:
    """paramiko's exec_command over answers given per command."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers, self.commands = answers, []

    def exec_command(self, command: str):
        self.commands.append(command)
        status, out, err = self.answers[command]
        return None, FakeStream(out.encode(), status), FakeStream(err.encode())


def host_with(client: FakeClient | None, data: dict, error: Exception | None = None):
    def connect() -> None:
        if error:
            raise error

    return SimpleNamespace(data=data, connector=SimpleNamespace(connect=connect, client=client))


def test_read_keys_with_sudo_without_a_password_the_key_never_in_the_command() -> None:
    # As sudo -n and cat answer on a box (sudo(8): -n, non-interactive).
    client = FakeClient(
        {
            "sudo -n cat /etc/spark/secrets/coder.key": (0, "sk-coder\n", ""),
            "sudo -n cat /etc/spark/secrets/fast.key": (
                1,
                "",
                "cat: /etc/spark/secrets/fast.key: No such file or directory\n",
            ),
        }
    )
    found = clients.read_keys(host_with(client, {"_sudo": True}), ["coder", "fast"])
    assert found == clients.Keys(
        {"coder": "sk-coder"},
        ["fast: no key read (cat: /etc/spark/secrets/fast.key: No such file or directory)"],
    )
    assert not any("sk-coder" in command for command in client.commands)
    plain = FakeClient({"cat /etc/spark/secrets/coder.key": (0, "sk\n", "")})
    assert clients.read_keys(host_with(plain, {}), ["coder"]) == clients.Keys({"coder": "sk"}, [])


def test_read_keys_of_an_unreachable_box() -> None:
    host = host_with(None, {}, paramiko.SSHException("No existing session"))
    assert clients.read_keys(host, ["coder"]) == "cannot connect: No existing session"


def test_no_box_reached_writes_nothing_and_names_every_box(tmp_path: Path) -> None:
    """Issue 37: with no box reached, an opencode.json with an empty provider was written."""
    directory = tmp_path / "opencode"
    fleet = {"spark-1": [CODER], "spark-2": [CODER, OPEN]}
    metrics = clients.MetricsKeys(frozenset(fleet), tmp_path / "metrics-keys")

    problems = clients.update_clients(
        fleet, reader({}, unreachable=("spark-1", "spark-2")), directory, KEYS, metrics
    )

    assert problems == [
        "spark-1: cannot connect: timed out",
        "spark-2: cannot connect: timed out",
        f"no box was reached (spark-1, spark-2); nothing written in {directory}: make clients"
        " again once they answer over SSH",
    ]
    assert not directory.exists() and not metrics.directory.exists()


def test_no_box_reached_leaves_the_owners_configuration_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "opencode.json").write_text(json.dumps(OWNERS))

    problems = clients.update_clients(
        {"spark-1": [CODER]}, reader({}, unreachable=("spark-1",)), tmp_path, KEYS
    )

    assert problems[-1].startswith("no box was reached (spark-1); nothing written")
    assert json.loads((tmp_path / "opencode.json").read_text()) == OWNERS
    assert sorted(path.name for path in tmp_path.iterdir()) == ["opencode.json"]


def test_each_boxs_metrics_key_is_copied_0600_beside_the_others(tmp_path: Path) -> None:
    """Read as a lane's key is (operations/metrics.py KEY_NAME: /etc/spark/secrets/_metrics.key),
    written as <box>.key, where make status and prometheus.yml read it; a box without metrics
    is not asked for one. Under umask 0 the file is still 0600 and its directory 0700."""
    metrics = clients.MetricsKeys(frozenset({"spark-1", "spark-2"}), tmp_path / "metrics-keys")
    fleet = {"spark-1": [CODER], "spark-2": [OPEN], "spark-3": [OPEN]}
    read = reader({"spark-1": {"coder": "sk-coder", "_metrics": "mk-1"}, "spark-2": {}})

    old = os.umask(0)
    try:
        problems = clients.update_clients(fleet, read, tmp_path / "opencode", KEYS, metrics)
    finally:
        os.umask(old)

    assert read.asked == [("spark-1", ["coder", "_metrics"]), ("spark-2", ["_metrics"])]
    assert problems == ["spark-2: _metrics: no key read (No such file)"]
    assert (metrics.directory / "spark-1.key").read_text() == "mk-1\n"
    assert mode(metrics.directory / "spark-1.key") == 0o600
    assert mode(metrics.directory) == 0o700
    assert sorted(path.name for path in metrics.directory.iterdir()) == ["spark-1.key"]
    # Not a lane: no provider and no key file of it in OpenCode's directory.
    config = json.loads((tmp_path / "opencode" / "opencode.json").read_text())
    assert sorted(config["provider"]) == ["spark-1-coder", "spark-2-open", "spark-3-open"]
    assert sorted(path.name for path in (tmp_path / "opencode").glob("*.key")) == [
        "spark-1-coder.key"
    ]


def test_make_status_and_prometheus_config_read_the_metrics_keys_where_clients_puts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """inventories/lab.py's boxes, each command with its default place, under one home; the
    boxes' keys as read_keys would return them (no box contacted)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    keys = tmp_path / ".config/spark-provisioning/metrics-keys"
    boxes = ("spark-1.local", "spark-2.local")

    assert status.main(["--inventory", "inventories/lab.py"]) == 1  # no key yet: red
    said = capsys.readouterr().out
    for box in boxes:
        assert f"no key (No such file or directory: {keys}/{box}.key)" in said
    assert (
        "spark-1.local (router)  router DOWN: no key (No such file or directory:"
        f" {keys}/fleet/spark-1.local.key)"
    ) in said

    monkeypatch.setattr(
        clients,
        "read_keys",
        lambda host, lanes: clients.Keys({lane: f"{host.name}-{lane}" for lane in lanes}, []),
    )
    assert clients.main(["--inventory", "inventories/lab.py", "--dir", str(tmp_path / "oc")]) == 0
    for box in boxes:
        assert (keys / f"{box}.key").read_text() == f"{box}-_metrics\n"
        assert mode(keys / f"{box}.key") == 0o600

    # The router on the head, spark-1.local (group_data: router_box None): its fleet key too.
    assert (keys / "fleet/spark-1.local.key").read_text() == "spark-1.local-_fleet\n"
    assert sorted(path.name for path in (keys / "fleet").iterdir()) == ["spark-1.local.key"]
    assert mode(keys / "fleet") == 0o700

    out = tmp_path / "prometheus"
    assert prometheus_config.main(["--inventory", "inventories/lab.py", "--out", str(out)]) == 0
    config = json.loads((out / "prometheus.yml").read_text())
    assert {job["authorization"]["credentials_file"] for job in config["scrape_configs"]} == {
        f"{keys}/{box}.key" for box in boxes
    } | {f"{keys}/fleet/spark-1.local.key"}


def test_make_clients_with_every_box_down_writes_nothing_and_exits_1(tmp_path: Path) -> None:
    """The real command over SSH to boxes at a port that refuses: each box named, no file."""
    reached = {"ssh_hostname": "127.0.0.1", "ssh_port": closed_port(), "ssh_connect_retries": 0}
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"spark = {[(n, reached | d) for n, d in TWO_SPARKS.items()]!r}\n")

    run = subprocess.run(
        [sys.executable, "-m", "stages.clients", "--inventory", str(inventory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"HOME": str(tmp_path)},
    )

    assert run.returncode == 1
    for box in TWO_SPARKS:
        assert f"{box}: cannot connect: " in run.stderr
    assert (
        f"no box was reached (spark-1, spark-2); nothing written in {tmp_path}/.config/opencode:"
        " make clients again once they answer over SSH"
    ) in run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["inventory.py"]


# The fleet's router (stages/clients.py Router): on spark-1, its failover on spark-2 (https).
ROUTERS = [
    RouterEndpoint("spark-1", "http://10.0.0.5:10100/v1"),
    RouterEndpoint("spark-2", "https://10.0.0.6:10100/v1"),
]
# Every served name as the router's providers list it (endpoints.model_entry): max_model_len
# as context, output a quarter of it up to 16384; none below AGENT_CONTEXT (65536).
MODELS = {
    "qwen3-coder-next": {"name": "qwen3-coder-next", "limit": {"context": 131072, "output": 16384}},
    "qwen3.6-35b-a3b": {"name": "qwen3.6-35b-a3b", "limit": {"context": 65536, "output": 16384}},
    "tiny": {"name": "tiny", "limit": {"context": 65536, "output": 16384}},
}


def router_provider(name: str, box: str, url: str) -> dict:
    return {
        "npm": "@ai-sdk/openai-compatible",
        "name": f"{name} (router on {box})",
        "options": {"baseURL": url, "apiKey": f"{{file:~/.config/opencode/{box}-_fleet.key}}"},
        "models": MODELS,
    }


def test_the_router_is_one_provider_with_every_served_name_keyed_by_the_fleet_key(
    tmp_path: Path,
) -> None:
    """No lane's key is read (the router holds them): the fleet key alone, from the router's
    box (/etc/spark/secrets/_fleet.key, read as a lane's), 0600 under any umask, into OpenCode's
    directory and beside the metrics keys (fleet/<box>.key) for make status and Prometheus."""
    directory, metrics = tmp_path / "opencode", clients.MetricsKeys(frozenset(), tmp_path / "mk")
    fleet = {"spark-1": [CODER, FAST], "spark-2": [OPEN]}
    read = reader({"spark-1": {"_fleet": "fk-1", "coder": "sk-coder"}})
    router = clients.Router(ROUTERS[:1], [CODER, FAST, OPEN])

    old = os.umask(0)
    try:
        problems = clients.update_clients(fleet, read, directory, KEYS, metrics, router)
    finally:
        os.umask(old)

    assert problems == []
    assert read.asked == [("spark-1", ["_fleet"])]
    config = json.loads((directory / "opencode.json").read_text())
    assert config == {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "spark-fleet": router_provider("fleet", "spark-1", "http://10.0.0.5:10100/v1")
        },
    }
    assert sorted(path.name for path in directory.iterdir()) == [
        "opencode.json",
        "spark-1-_fleet.key",
        "spark-clients.json",
    ]
    assert (directory / "spark-1-_fleet.key").read_text() == "fk-1\n"
    assert (metrics.directory / "fleet/spark-1.key").read_text() == "fk-1\n"
    assert [mode(directory / "spark-1-_fleet.key"), mode(metrics.directory / "fleet/spark-1.key")]\
        == [0o600, 0o600]  # fmt: skip
    assert mode(metrics.directory / "fleet") == 0o700
    assert json.loads((directory / "spark-clients.json").read_text()) == {
        "spark-1": {"keys": ["spark-1-_fleet.key"], "providers": ["spark-fleet"]},
        "spark-2": {"keys": [], "providers": []},
    }


def test_a_failover_router_is_a_second_provider_with_its_own_boxs_key(tmp_path: Path) -> None:
    """OpenCode takes one baseURL a provider: the failover's is spark-fleet-failover, the same
    models, its key read from its own box."""
    read = reader({"spark-1": {"_fleet": "fk-1"}, "spark-2": {"_fleet": "fk-2"}})
    router = clients.Router(ROUTERS, [CODER, FAST, OPEN])
    fleet = {"spark-1": [CODER, FAST], "spark-2": [OPEN]}

    assert clients.update_clients(fleet, read, tmp_path, KEYS, router=router) == []

    assert read.asked == [("spark-1", ["_fleet"]), ("spark-2", ["_fleet"])]
    assert json.loads((tmp_path / "opencode.json").read_text())["provider"] == {
        "spark-fleet": router_provider("fleet", "spark-1", "http://10.0.0.5:10100/v1"),
        "spark-fleet-failover": router_provider(
            "fleet, failover", "spark-2", "https://10.0.0.6:10100/v1"
        ),
    }
    assert (tmp_path / "spark-2-_fleet.key").read_text() == "fk-2\n"


def test_per_lane_and_back_each_removes_the_others_providers_and_keys(tmp_path: Path) -> None:
    """PER_LANE=1 writes today's providers (the fleet key still copied for make status and
    Prometheus, not into OpenCode's directory); the router's provider again takes their place;
    a box that no longer runs the router loses its copy of the fleet key."""
    directory, metrics = tmp_path / "opencode", clients.MetricsKeys(frozenset(), tmp_path / "mk")
    fleet = {"spark-1": [CODER, FAST], "spark-2": [OPEN]}
    keys = {"spark-1": {"_fleet": "fk-1", "coder": "sk-c", "fast": "sk-f"}, "spark-2": {}}
    per_lane = clients.Router(ROUTERS[:1], [CODER, FAST, OPEN], per_lane=True)

    read = reader(keys)
    assert clients.update_clients(fleet, read, directory, KEYS, metrics, per_lane) == []
    assert read.asked == [("spark-1", ["coder", "fast", "_fleet"])]
    config = json.loads((directory / "opencode.json").read_text())
    assert sorted(config["provider"]) == ["spark-1-coder", "spark-1-fast", "spark-2-open"]
    assert sorted(path.name for path in directory.glob("*.key")) == [
        "spark-1-coder.key",
        "spark-1-fast.key",
    ]
    assert (metrics.directory / "fleet/spark-1.key").read_text() == "fk-1\n"

    router = per_lane._replace(per_lane=False)
    assert clients.update_clients(fleet, reader(keys), directory, KEYS, metrics, router) == []
    config = json.loads((directory / "opencode.json").read_text())
    assert sorted(config["provider"]) == ["spark-fleet"]
    assert sorted(path.name for path in directory.glob("*.key")) == ["spark-1-_fleet.key"]

    moved = router._replace(boxes=[RouterEndpoint("spark-2", "http://10.0.0.6:10100/v1")])
    keys["spark-2"] = {"_fleet": "fk-2"}
    assert clients.update_clients(fleet, reader(keys), directory, KEYS, metrics, moved) == []
    assert sorted(path.name for path in (metrics.directory / "fleet").iterdir()) == ["spark-2.key"]
    assert sorted(path.name for path in directory.glob("*.key")) == ["spark-2-_fleet.key"]
    config = json.loads((directory / "opencode.json").read_text())
    assert config["provider"]["spark-fleet"]["options"]["baseURL"] == "http://10.0.0.6:10100/v1"


def test_a_router_whose_key_cannot_be_read_gets_no_provider(tmp_path: Path) -> None:
    """Its box answers but holds no fleet key (the router not deployed there yet): named, and
    no provider without its key, nor an empty one."""
    router = clients.Router(ROUTERS[:1], [CODER])
    problems = clients.update_clients(
        {"spark-1": [CODER]}, reader({}), tmp_path, KEYS, None, router
    )
    assert problems == ["spark-1: _fleet: no key read (No such file)"]
    assert json.loads((tmp_path / "opencode.json").read_text()) == {
        "$schema": "https://opencode.ai/config.json"
    }


def test_a_fleet_without_a_lane_gets_no_router_provider(tmp_path: Path) -> None:
    router = clients.Router(ROUTERS[:1], [])
    read = reader({"spark-1": {"_fleet": "fk-1"}})
    assert clients.update_clients({"spark-1": []}, read, tmp_path, KEYS, None, router) == []
    assert "provider" not in json.loads((tmp_path / "opencode.json").read_text())


def test_served_models_are_each_name_once_in_the_inventorys_order() -> None:
    replica = CODER._replace(url="http://10.0.0.6:10101/v1")
    fleet = {"spark-1": [CODER, FAST], "spark-2": [replica, OPEN]}
    assert served_models(fleet) == [CODER, FAST, OPEN]


def test_the_routers_urls_go_through_its_boxs_front_https_with_its_certificate(
    tmp_path: Path,
) -> None:
    front = made(tmp_path / "front", "spark-1", ("spark-1",))  # self-signed, for spark-1
    certificate, key = front.path, front.key_path
    router = {"router_box": "spark-2", "router_failover_box": "spark-1", "router_port": 10200}
    hosts = {
        "spark-1": TWO_SPARKS["spark-1"]
        | router
        | {"front_tls_certificate_file": str(certificate), "front_tls_key_file": str(key)},
        "spark-2": TWO_SPARKS["spark-2"] | router,
    }
    assert routers_of(plan(load_from_dicts(merged(hosts)))) == [
        RouterEndpoint("spark-2", "http://spark-2:10200/v1"),
        RouterEndpoint("spark-1", "https://spark-1:10200/v1"),
    ]


def test_make_clients_writes_the_routers_provider_for_the_owners_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """inventories/lab.py: the router on spark-1.local, the head, at router_port 10100; the two
    served names of group_data's lanes (both boxes serve both: replicas); PER_LANE: each lane."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(
        clients,
        "read_keys",
        lambda host, lanes: clients.Keys({lane: f"{host.name}-{lane}" for lane in lanes}, []),
    )
    directory = tmp_path / "oc"
    assert clients.main(["--inventory", "inventories/lab.py", "--dir", str(directory)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{directory}/opencode.json: the router, http://spark-1.local:10100/v1, with the 2 served"
        " names of 2 boxes"
    )
    config = json.loads((directory / "opencode.json").read_text())
    assert list(config["provider"]) == ["spark-fleet"]
    assert config["provider"]["spark-fleet"]["options"] == {
        "baseURL": "http://spark-1.local:10100/v1",
        "apiKey": f"{{file:{directory}/spark-1-local-_fleet.key}}",
    }
    assert list(config["provider"]["spark-fleet"]["models"]) == [
        "qwen3-coder-next",
        "qwen3.6-35b-a3b",
    ]
    assert (directory / "spark-1-local-_fleet.key").read_text() == "spark-1.local-_fleet\n"

    argv = ["--inventory", "inventories/lab.py", "--dir", str(directory), "--per-lane"]
    assert clients.main(argv) == 0
    config = json.loads((directory / "opencode.json").read_text())
    assert sorted(config["provider"]) == [
        f"spark-{n}-local-{lane}" for n in (1, 2) for lane in ("coder", "fast")
    ]

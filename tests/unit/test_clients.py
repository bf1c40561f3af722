"""stages/clients.py (`make clients`): the lanes' keys and one OpenCode configuration for the
fleet, written into a client's configuration directory."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import paramiko

from endpoints import Endpoint
from stages import clients

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
    # A box whose every lane was removed: nothing of it either.
    assert clients.update_clients({"spark-1": []}, reader(keys), tmp_path, KEYS) == []
    assert list(tmp_path.glob("*.key")) == []
    assert json.loads((tmp_path / "opencode.json").read_text())["provider"] == {}


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

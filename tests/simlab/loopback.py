"""What the tests of the serving stand-ins share: servers started as local processes on
127.0.0.1 (no lab), requests to them that ignore any proxy, and their stop."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.simlab.waits import until

START_TIMEOUT = 15.0
# Ignore any proxy of the environment: every request here goes to loopback.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def request(
    url: str, body: Any = None, key: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str, dict[str, str]]:
    """(status, body text, headers) of one GET, or POST when there is a JSON body; `key` is
    sent as `Authorization: Bearer <key>`."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers or {})
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with HTTP.open(req, timeout=5) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """A stand-in started on 127.0.0.1:port, its output in `log`."""

    def __init__(self, process: subprocess.Popen[str], port: int, log: Path):
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.log = log

    def exited(self) -> str | None:
        """Why waiting for the server is over: it exited, with its log."""
        return None if self.process.poll() is None else f"exited:\n{self.log.read_text()}"

    def wait_for_log(self, text: str) -> None:
        until(lambda: text in self.log.read_text(), START_TIMEOUT, f"{text!r} in its log",
              every=0.05, hopeless=self.exited)  # fmt: skip

    def wait_healthy(self) -> None:
        until(lambda: request(f"{self.url}/health")[0] == 200, START_TIMEOUT, "healthy",
              every=0.05, hopeless=self.exited)  # fmt: skip


def stop_all(processes: list[subprocess.Popen[str]]) -> None:
    """Terminate each process, killing one that has not ended within 5 s."""
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Servers:
    """The stand-ins a test starts, each on a free port with its log in `folder`; stop() ends
    them all."""

    def __init__(self, folder: Path, name: str):
        self.folder, self.name = folder, name
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, command: Callable[[int], list[str]], env: dict[str, str], wait: bool) -> Server:
        """Run command(port); once it answers /health with 200 where `wait`."""
        port = free_port()
        log = self.folder / f"{self.name}-{port}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                command(port), stdout=out, stderr=subprocess.STDOUT, text=True, env=env
            )
        self.processes.append(process)
        server = Server(process, port, log)
        if wait:
            server.wait_healthy()
        return server

    def stop(self) -> None:
        stop_all(self.processes)

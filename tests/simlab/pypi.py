"""A Python package index stand-in for the lab: the router's pinned wheels (spark/router.py) as a
PEP 503 simple index, which the lab's inventory gives the deploy as `router_pip_index`.

The wheels are real, as pip downloaded them from the index this machine's pip uses, for the lab
hosts' Python (Debian 12's CPython 3.11.2, x86_64): a wheelhouse made once into WHEELHOUSE,
outside the clone, and shared by every lab. What is served is what PEP 503 says an index serves
and pip reads (pip's own index client, `pip/_internal/index/collector.py`):

- `GET /simple/`: an HTML page with one anchor per project;
- `GET /simple/<project>/`, the project's name normalized (PEP 503: lower case, runs of `-`, `_`
  and `.` made one `-`): one anchor per file, its URL ending in `#sha256=<hash>`, which pip checks
  the download against;
- `GET /files/<file>`: the file.

A project the wheelhouse lacks answers 404, as a real index does, so a requirement the pinned set
misses fails the install on the box instead of coming from elsewhere. HTTP only: the inventory's
index URL makes the deploy pass `--trusted-host` for it (spark/router.py pip_command), as an owner's
plain-HTTP mirror would need.

The lab runs one while it is up (lab.py up/down: `python -m tests.simlab.pypi --bind ADDRESS
--port PORT`).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import os
import re
import subprocess
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from spark.router import REQUIREMENTS_FILE
from tests.simlab.rootfs import building
from tests.simlab.threaded_server import ThreadedServer

WHEELHOUSE = Path(os.environ.get("SPARK_ROUTER_CACHE", "/var/cache/spark-router")) / "wheels"
# The lab hosts' python3 (Debian 12's), whose wheels and markers the wheelhouse is made for.
LAB_PYTHON = "3.11.2"
# Its own lock in the lab's cache: the base images' builds do not wait on the download.
DOWNLOAD_LOCK = ".router-wheels.lock"
PROJECT = re.compile(r"/simple/(?P<project>[^/]+)/")


def normalized(name: str) -> str:
    """A project's name as PEP 503 normalizes it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(wheel: str) -> str:
    """The normalized project of a wheel's file name (PEP 427: name-version-...)."""
    return normalized(wheel.split("-", 1)[0])


def wheelhouse(directory: Path = WHEELHOUSE) -> Path:
    """The pinned set's wheels for the lab hosts' Python, downloaded once (a stamp names the
    requirements' SHA-256, so a new pinned set downloads again); labs started side by side
    (`make test`'s workers) take turns on the cache's lock instead of both downloading
    into the same directory."""
    requirements = REQUIREMENTS_FILE.read_bytes()
    stamp = directory / f".downloaded-{hashlib.sha256(requirements).hexdigest()[:12]}"
    if stamp.exists():
        return directory
    with building(stamp, DOWNLOAD_LOCK) as needed:
        if needed:
            directory.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
                 "--only-binary=:all:", "--python-version", LAB_PYTHON, "--dest",
                 str(directory), "-r", str(REQUIREMENTS_FILE)],
                check=True, timeout=1800,
            )  # fmt: skip
            stamp.touch()
    return directory


def index(directory: Path) -> dict[str, dict[str, str]]:
    """Every project of the wheelhouse: its files and each one's SHA-256."""
    projects: dict[str, dict[str, str]] = {}
    for wheel in sorted(directory.glob("*.whl")):
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        projects.setdefault(project_of(wheel.name), {})[wheel.name] = digest
    return projects


def page(title: str, anchors: list[tuple[str, str]]) -> bytes:
    """A PEP 503 page: one anchor a line."""
    links = "".join(
        f'<a href="{html.escape(href)}">{html.escape(text)}</a><br/>\n' for href, text in anchors
    )
    return (
        f"<!DOCTYPE html>\n<html><head><title>{html.escape(title)}</title></head><body>\n"
        f"{links}</body></html>\n"
    ).encode()


class Index(ThreadedServer):
    """The index on ``address``:``port`` (an ephemeral port unless given), serving ``directory``;
    ``served`` counts the files sent, by name."""

    def __init__(self, directory: Path, address: str = "127.0.0.1", port: int = 0):
        self.directory = directory
        self.projects = index(directory)
        self.served: dict[str, int] = {}
        super().__init__(_handler(self), address, port)

    @property
    def url(self) -> str:
        """The index's URL, as pip's --index-url takes it."""
        return f"{self.origin}/simple/"


def _handler(served: Index) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/simple/":
                anchors = [(f"/simple/{name}/", name) for name in served.projects]
                return self._reply(page("Simple index", anchors), "text/html")
            if match := PROJECT.fullmatch(path):
                files = served.projects.get(match["project"])
                if files is None or match["project"] != normalized(match["project"]):
                    return self._reply(b"not found\n", "text/plain", HTTPStatus.NOT_FOUND)
                anchors = [(f"/files/{name}#sha256={sha}", name) for name, sha in files.items()]
                return self._reply(page(f"Links for {match['project']}", anchors), "text/html")
            name = path.removeprefix("/files/")
            if path.startswith("/files/") and project_of(name) in served.projects:
                files = served.projects[project_of(name)]
                if name in files:
                    served.served[name] = served.served.get(name, 0) + 1
                    body = (served.directory / name).read_bytes()
                    return self._reply(body, "application/octet-stream")
            self._reply(b"not found\n", "text/plain", HTTPStatus.NOT_FOUND)

        def _reply(self, body: bytes, kind: str, status: HTTPStatus = HTTPStatus.OK) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def main(argv: list[str] | None = None) -> None:
    """The lab's index, until killed (lab.py starts and stops it)."""
    parser = argparse.ArgumentParser(prog="python -m tests.simlab.pypi")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    served = Index(wheelhouse(), args.bind, args.port)
    print(f"index at {served.url}", flush=True)
    served.serve_until_stopped()


if __name__ == "__main__":
    main()

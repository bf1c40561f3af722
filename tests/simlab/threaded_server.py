"""The HTTP server the lab's stand-ins share (the hub, hub.py; the package index, pypi.py): the
standard library's threading server on a daemon thread of its own, started and stopped with the
stand-in."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class ThreadedServer:
    """Serves ``handler`` on ``address``:``port`` (an ephemeral port when 0) once started."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], address: str, port: int) -> None:
        self._server = ThreadingHTTPServer((address, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def origin(self) -> str:
        """http://address:port, where it listens."""
        address, port = self._server.server_address[:2]
        return f"http://{address}:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def serve_until_stopped(self) -> None:
        """Start, then wait on the server's thread (a stand-in run as its own process)."""
        self.start()._thread.join()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

#!/usr/bin/python3
"""A box's Hugging Face cache served read-only to the boxes of its fleet that copy a model from it
(the unit spark-weights-serve, operations/weights.py ``blobs_served``).

    spark_serve.py PORT --bind ADDRESS --directory DIR

Python's own http.server (the host's python3, standard library alone), as `python3 -m
http.server` serves (ThreadingHTTPServer: a thread per connection), with two changes:

- Each file is sent with sendfile(2) (socket.sendfile, Python's socket docs: "high-performance
  os.sendfile"), the kernel's copy from the page cache to the socket: http.server's own
  copyfile reads and writes it in 64 KiB pieces through Python (shutil.copyfileobj,
  COPY_BUFSIZE), which cost the fleet copy a core of its own.
- A `Range: bytes=N-` (RFC 9110 14.2, the form spark_fetch.py sends to resume) is answered
  206 with Content-Range from byte N (14.4, 15.3.7), or 416 past the end (15.5.17):
  http.server answers every GET whole, so a cut copy started over.

Files only (no directory listings): the boxes ask each blob by its hash.
"""

from __future__ import annotations

import argparse
import http.server
import os
import re
import sys
from functools import partial

RANGE = re.compile(r"bytes=(\d+)-$")  # the form spark_fetch.py sends


def span(header: str | None, size: int) -> int | None:
    """The first byte asked (0: the whole file), None when past the end; any other form of
    Range is ignored and the file sent whole, as RFC 9110 14.2 lets a server do."""
    match = RANGE.match(header or "")
    start = int(match.group(1)) if match else 0
    return start if start < size or start == 0 else None


class Blobs(http.server.SimpleHTTPRequestHandler):
    """GET and HEAD of a file under the directory, whole or from a byte on, sent by sendfile."""

    def do_GET(self) -> None:
        self.answer(body=True)

    def do_HEAD(self) -> None:
        self.answer(body=False)

    def answer(self, body: bool) -> None:
        path = self.translate_path(self.path)  # http.server's: no way out of the directory
        try:
            source = open(path, "rb")  # noqa: SIM115 (closed below)
        except OSError:  # not there (yet: being fetched), or a directory
            self.send_error(404, "File not found")
            return
        with source:
            size = os.fstat(source.fileno()).st_size
            start = span(self.headers.get("Range"), size)
            if start is None:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()  # sent: StreamRequestHandler's wfile is unbuffered (wbufsize 0)
            if body:
                self.connection.sendfile(source, offset=start, count=size - start)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spark_serve.py")
    parser.add_argument("port", type=int)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--directory", required=True)
    args = parser.parse_args(argv)
    handler = partial(Blobs, directory=args.directory)
    with http.server.ThreadingHTTPServer((args.bind, args.port), handler) as server:
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

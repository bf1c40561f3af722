"""Every wait of the lab and its tests: ask again until the deadline.

Several labs share one small machine (`make test` runs two beside whatever else runs there): an
answer can be slow, an ssh connection can time out, a port can refuse while its service starts.
None of that is a failure until the deadline has passed; only then does the wait fail, naming
what it waited for and the last answer it got.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
# What an answer that did not come raises: a timeout, a refused or reset connection (OSError),
# a command that ran past its own timeout or exited non-zero when checked (SubprocessError).
NO_ANSWER = (OSError, subprocess.SubprocessError)


def until(
    answer: Callable[[], T],
    seconds: float | None,
    what: str,
    *,
    deadline: float | None = None,
    every: float = 1.0,
    hopeless: Callable[[], str | None] | None = None,
    retried: tuple[type[BaseException], ...] = NO_ANSWER,
) -> T:
    """``answer()`` again and again, ``every`` seconds apart, until it gives something true,
    which is returned. An answer that raises one of ``retried`` (NO_ANSWER unless told) counts
    as none. The deadline:
    ``seconds`` from now, or ``deadline`` (time.monotonic()) where several waits share one.
    Past it, TimeoutError naming ``what`` and the last answer or error; ``hopeless()``, asked
    after each answer that is not yet the one, says why waiting longer cannot help (a container
    that exited), which fails the wait at once."""
    if deadline is None:
        assert seconds is not None, "until: give seconds or a deadline"
        deadline = time.monotonic() + seconds
    while True:
        try:
            found: T | None = answer()
            last = repr(found)
        except retried as error:
            found, last = None, f"{type(error).__name__}: {error}"
        if found:
            return found
        if hopeless is not None and (why := hopeless()):
            raise RuntimeError(f"{what}: {why} (last answer: {last})")
        if time.monotonic() > deadline:
            waited = f"{seconds:g} s" if seconds is not None else "the deadline"
            raise TimeoutError(f"{what}: not within {waited} (last answer: {last})")
        time.sleep(every)


def patiently(ask: Callable[[], T], seconds: float, what: str) -> T:
    """``ask()``, once more each time its answer was too slow (a timeout: the machine is busy
    with other labs), until ``seconds``; any other answer or error is the answer (a refused
    connection, an HTTP error, a failed command: what tests of those look for)."""

    def asked() -> tuple[T] | None:
        try:
            return (ask(),)  # answered, whatever the answer
        except (TimeoutError, subprocess.TimeoutExpired):
            return None
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                return None
            raise

    return until(asked, seconds, f"{what}: an answer in time", retried=())[0]

"""`make test`'s set-up: every cached build, in order, timed."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from tests.simlab import caches


def recording(calls: list[str], name: str) -> Callable[[], None]:
    return lambda: calls.append(name)


def test_each_build_runs_once_in_order_and_its_seconds_are_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    # Two clock readings a build (before, after), and none for anything else.
    clock = iter([100.0, 103.5, 103.5, 110.0])
    monkeypatch.setattr(caches, "monotonic", lambda: next(clock))
    builds = [("base image", recording(calls, "base")), ("server", recording(calls, "server"))]

    assert caches.build_all(builds) == {"base image": 3.5, "server": 6.5}
    assert calls == ["base", "server"]


def test_a_build_that_fails_stops_the_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(caches, "monotonic", itertools.count().__next__)

    def broken() -> None:
        raise RuntimeError("cmake failed")

    builds = [("base image", recording(calls, "base")), ("server", broken),
              ("wheels", recording(calls, "wheels"))]  # fmt: skip
    with pytest.raises(RuntimeError, match="cmake failed"):
        caches.build_all(builds)
    assert calls == ["base"]  # no test runs on a half-built cache


def test_the_set_up_builds_what_the_lab_and_the_tests_take_from_the_caches() -> None:
    names = [name for name, _build in caches.BUILDS]
    assert names == [
        "host packages",
        "stand-in NVIDIA repositories",
        "bare Spark image",
        "registry program",
        "prometheus",
        "llama.cpp source",
        "gguf's Python",
        "the lab's GGUF",
        "serving image",
        "llama-server",
        "registry's layers",
        "router wheelhouse",
    ]

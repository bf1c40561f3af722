"""`make test`'s set-up: every cached build once, in its chain's order, chains side by side,
phases one after the other, each build timed."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import pytest

from tests.simlab import caches


def recording(calls: list[str], name: str) -> Callable[[], None]:
    return lambda: calls.append(name)


def test_a_chains_builds_run_in_turn_and_their_seconds_are_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    # Two clock readings a build (before, after), and none for anything else.
    clock = iter([100.0, 103.5, 103.5, 110.0])
    monkeypatch.setattr(caches, "monotonic", lambda: next(clock))
    chain = (("base image", recording(calls, "base")), ("server", recording(calls, "server")))

    assert caches.build_chain(chain) == {"base image": 3.5, "server": 6.5}
    assert calls == ["base", "server"]


def test_a_phases_chains_run_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caches, "monotonic", lambda: 0.0)
    # The first chain's build waits for the second chain's: one after the other, it would wait
    # in vain (the guard's 60 s end it as a failure, not a hang).
    compiled = threading.Event()

    def download() -> None:
        if not compiled.wait(60):
            raise AssertionError("the compile never ran beside the download")

    phases = [((("wheels", download),), (("server", compiled.set),))]
    assert caches.build_all(phases) == {"wheels": 0.0, "server": 0.0}


def test_each_phase_starts_when_the_one_before_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caches, "monotonic", lambda: 0.0)
    calls: list[str] = []
    phases = [
        ((("host packages", recording(calls, "packages")),),),
        ((("base image", recording(calls, "base")),), (("source", recording(calls, "source")),)),
        ((("layers", recording(calls, "layers")),),),
    ]
    caches.build_all(phases)
    assert calls[0] == "packages" and sorted(calls[1:3]) == ["base", "source"]
    assert calls[3:] == ["layers"]


def test_a_build_that_fails_stops_its_chain_and_the_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(caches, "monotonic", itertools.count().__next__)

    def broken() -> None:
        raise RuntimeError("cmake failed")

    phases = [
        (
            (("source", recording(calls, "source")), ("server", broken),
             ("server's test", recording(calls, "server's test"))),
            (("wheels", recording(calls, "wheels")),),
        ),
        ((("layers", recording(calls, "layers")),),),
    ]  # fmt: skip
    with pytest.raises(RuntimeError, match="cmake failed"):
        caches.build_all(phases)
    # The other chain ends its work; nothing after the failed build, no later phase: no test
    # runs on a half-built cache.
    assert sorted(calls) == ["source", "wheels"]


def test_the_set_up_builds_what_the_lab_and_the_tests_take_from_the_caches() -> None:
    chains = [[name for name, _build in chain] for phase in caches.PHASES for chain in phase]
    assert chains == [
        ["host packages"],
        ["stand-in NVIDIA repositories", "bare Spark image", "registry program", "prometheus",
         "serving image"],
        ["llama.cpp source", "llama-server"],
        ["gguf's Python", "the lab's GGUF"],
        ["router wheelhouse"],
        ["registry's layers"],
    ]  # fmt: skip
    assert [len(phase) for phase in caches.PHASES] == [1, 4, 1]

"""The lane engines, each a record (spark/engines/record.py: Engine) in its own module, by the
name a lane's `engine` gives. Nothing else tests an engine's name: CONTRIBUTING.md says how to
add one."""

from __future__ import annotations

from spark.engines import llamacpp, vllm
from spark.engines.record import Engine

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (vllm.ENGINE, llamacpp.ENGINE)}
DEFAULT = vllm.ENGINE.name

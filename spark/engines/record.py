"""What every lane engine answers (spark/engines/__init__.py maps each name to its record)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from spark.lane import Lane, MpRank


@dataclass(frozen=True)
class ModelAtStart:
    """A model path the container's shell reads as it starts, into the server's own variable:
    the snapshot refs/main names in the cache, read where the model is loaded (a llama.cpp
    lane's GGUF file)."""

    variable: str
    repo: str  # the repository's directory in the container's cache
    file: str  # the file in its snapshot


class Engine(Protocol):
    """A lane engine: its release data and option checks, its command line, health path, memory
    model (its KV cache default) and the canary's causes. The lane, the planner and the
    operations ask this record, never the engine's name."""

    name: str  # the lane's `engine` value
    health_path: str  # answers 200 once the model is loaded (the unit's start waits for it)
    key_variable: str  # the server's own variable for the API key (never argv)
    replaces_entrypoint: bool  # the image's entrypoint is the server: a shell replaces it
    holds_hf_cli: bool  # its images carry huggingface_hub's `hf`, which can fetch weights
    default_kv_cache: str | None  # the KV cache type where the lane names none (None: model's)

    def problems(self, lane: Lane) -> list[str]:
        """Everything the engine's release refuses, or the GB10 does badly, in the lane."""
        ...

    def catalog_key(self, lane: Lane) -> str:
        """The lane's model as the catalog names it."""
        ...

    def option(self, lane: Lane, name: str) -> str | bool | None:
        """The value extra_args give an option (True for a flag), the last one winning."""
        ...

    def argv(self, lane: Lane, rank: MpRank | None = None) -> list[str]:
        """The server's command line in the container, for this box's ``rank`` of a cluster
        lane; never a key."""
        ...

    def container_env(self, lane: Lane) -> dict[str, str]:
        """The lane's environment plus what the engine needs on the GB10."""
        ...

    def model_at_start(self, lane: Lane) -> ModelAtStart | None:
        """A model path read as the container starts, or None where argv names the model."""
        ...

    def canary_causes(self, lane: Lane) -> list[str]:
        """The usual causes of a wrong answer, named by the canary when it fails."""
        ...

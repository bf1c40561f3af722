"""What `llama-server` accepts at a llama.cpp commit.

Each commit's options are data read from llama.cpp's own argument table (common/arg.cpp):
operations/data/llama.cpp-<commit>-server-options.json, made by tools/llama_cpp_options.py (its
docstring and the data's "about" say how). The field's image (seed 002:
ghcr.io/ardge-labs/llama-cpp-dgx-spark:server) builds llama.cpp master; DEFAULT_COMMIT is the
one whose table is here, vendored by llama-cpp-python 0.3.36 (its CHANGELOG).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).parent / "data"
DEFAULT_COMMIT = "0c1e57098"
_PREFIX, _SUFFIX = "llama.cpp-", "-server-options.json"


@dataclass(frozen=True)
class Option:
    """One llama-server option: its names (short first, as declared), its `--no-` names, the
    hints of the values it takes (None: a flag), the environment variable it reads and what its
    handler takes ("void", "bool", "int", "string", "string_string": common_arg in arg.h)."""

    names: tuple[str, ...]
    negatives: tuple[str, ...]
    value: str | None
    value_2: str | None
    env: str | None
    handler: str

    @property
    def takes_value(self) -> bool:
        return self.value is not None

    @property
    def values(self) -> int:
        """How many command-line words follow the option (common_params_parse_ex)."""
        return 0 if self.value is None else 1 if self.value_2 is None else 2


@cache
def known_commits() -> list[str]:
    """The commits operations/data/ holds a llama-server option list of."""
    return sorted(p.name[len(_PREFIX) : -len(_SUFFIX)] for p in DATA.glob(f"{_PREFIX}*{_SUFFIX}"))


def data_path(commit: str) -> Path:
    return DATA / f"{_PREFIX}{commit}{_SUFFIX}"


@cache
def options(commit: str = DEFAULT_COMMIT) -> dict[str, Option]:
    """Every option by each of its names and negative names; ValueError for a commit with no
    list here."""
    if commit not in known_commits():
        raise ValueError(
            f"llama.cpp commit {commit!r} has no llama-server option list here; one of:"
            f" {', '.join(known_commits())} (tools/llama_cpp_options.py makes another)"
        )
    by_name: dict[str, Option] = {}
    for row in json.loads(data_path(commit).read_text())["options"]:
        option = Option(
            names=tuple(row["names"]),
            negatives=tuple(row["negatives"]),
            value=row["value"],
            value_2=row["value_2"],
            env=row["env"],
            handler=row["handler"],
        )
        for name in (*option.names, *option.negatives):
            by_name[name] = option
    return by_name


def distinct(commit: str = DEFAULT_COMMIT) -> list[Option]:
    """The commit's options once each, in arg.cpp's order."""
    return list(dict.fromkeys(options(commit).values()))

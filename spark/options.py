"""Each inventory key's declaration in one place: its allowed values (the field's description,
which also ends pydantic's own messages), its scope and why it exists, with its source.

HostSettings (spark/inventory/) declares every key with `option`; group_data/all.py holds the
default values; docs/variables.md is generated from both (`python -m tools.options_reference`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

Scope = Literal["host", "box", "fleet"]
# What each scope lets an owner do, as the reference prints it.
SCOPES: dict[Scope, str] = {
    "host": "per box: in a box's own data in the inventory, no group_data default",
    "box": "group_data/all.py's default; a box's data in the inventory may override it",
    "fleet": "group_data/all.py's value, the same on every box (a box that differs is refused)",
}


def option(allowed: str, *, why: str, scope: Scope = "box", **field: Any) -> Any:
    """A HostSettings field: ``allowed`` the values it takes (pydantic's messages end with it),
    ``why`` the reason and its source, ``field`` pydantic's own (a default, ge, le...)."""
    return Field(description=allowed, json_schema_extra={"scope": scope, "why": why}, **field)

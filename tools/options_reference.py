"""Write docs/variables.md, the inventory's variables reference, from where each key is declared.

Every key's type, allowed values, scope and why come from its declaration (spark/inventory/
HostSettings, spark/fleet.py: spark.options.option); its default is the value group_data/all.py
holds, read from its source, not run. A lane's keys come from spark/lane.py's Lane, a model_spec's
from spark/catalog.py's ModelSpec. tests/unit/test_options_reference.py fails when the committed
file differs from what this writes; from the repository root:

    .venv/bin/python -m tools.options_reference            # rewrites docs/variables.md
    .venv/bin/python -m tools.options_reference --check    # exit 1 where it differs
"""

from __future__ import annotations

import argparse
import ast
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from spark.catalog import ModelSpec
from spark.inventory import HostSettings
from spark.lane import Lane
from spark.options import SCOPES

REPO = Path(__file__).resolve().parents[1]
GROUP_DATA = REPO / "group_data" / "all.py"
REFERENCE = REPO / "docs" / "variables.md"


def type_name(annotation: Any) -> str:
    """A field's type as an owner writes the value: `int`, `'pair' | 'ring3'`, `list[lane]`."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return type_name(get_args(annotation)[0])
    if origin is Literal:
        return " | ".join(repr(value) for value in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in get_args(annotation))
    if origin is not None:
        inner = ", ".join(
            "..." if arg is Ellipsis else type_name(arg) for arg in get_args(annotation)
        )
        return f"{origin.__name__}[{inner}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {"Lane": "lane", "ModelSpec": "model_spec", "Throughput": "dict"}.get(
            annotation.__name__, annotation.__name__
        )
    return {"IPv4Network": "network (str)", "HttpUrl": "URL (str)"}.get(
        getattr(annotation, "__name__", ""), getattr(annotation, "__name__", str(annotation))
    )


def group_data_defaults(source: str) -> dict[str, str]:
    """Each top-level assignment of group_data/all.py: its value as written, or, where that
    spans lines, a summary (a list of lanes by their names)."""
    defaults = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                written = ast.get_source_segment(source, node.value) or ""
                defaults[target.id] = written if "\n" not in written else summary(node.value)
    return defaults


def summary(value: ast.expr) -> str:
    """A value written over several lines: a list of dicts by their names, else a pointer."""
    if isinstance(value, ast.List) and all(isinstance(item, ast.Dict) for item in value.elts):
        names = [
            val.value
            for item in value.elts
            for key, val in zip(item.keys, item.values, strict=True)
            if isinstance(key, ast.Constant) and key.value == "name"
            if isinstance(val, ast.Constant)
        ]
        return f"{len(value.elts)} entries: " + ", ".join(names) + " (see group_data/all.py)"
    return "see group_data/all.py"


def field_default(field: FieldInfo) -> str | None:
    """The default a declaration itself gives, as Python writes it; None where it gives none."""
    if field.default_factory is not None:
        return repr(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return None
    return repr(field.default)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def host_section(defaults: dict[str, str]) -> list[str]:
    lines = [
        "| key | type | default | scope |",
        "|---|---|---|---|",
    ]
    fields = HostSettings.model_fields
    for name, field in fields.items():
        default = defaults.get(name) or field_default(field) or "(none)"
        scope = (field.json_schema_extra or {})["scope"]  # type: ignore[index]
        lines.append(
            f"| [`{name}`](#{name}) | `{cell(type_name(field.annotation))}` |"
            f" `{cell(default)}` | {scope} |"
        )
    for name, field in fields.items():
        extra = field.json_schema_extra or {}
        default = defaults.get(name) or field_default(field) or "(none)"
        where = "group_data/all.py" if name in defaults else "its declaration"
        lines += [
            "",
            f"### {name}",
            "",
            f"- type: `{type_name(field.annotation)}`; default: `{default}` ({where});"
            f" scope: {extra['scope']}",  # type: ignore[index]
            f"- allowed: {field.description}",
            f"- why: {extra['why']}",  # type: ignore[index]
        ]
    return lines


def model_table(model: type[BaseModel]) -> list[str]:
    lines = ["| key | type | default | allowed |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        default = field_default(field)
        shown = f"`{cell(default)}`" if default is not None else "required"
        lines.append(
            f"| `{name}` | `{cell(type_name(field.annotation))}` | {shown} |"
            f" {cell(field.description or '')} |"
        )
    return lines


def reference() -> str:
    defaults = group_data_defaults(GROUP_DATA.read_text())
    scopes = "\n".join(f"- **{scope}**: {meaning}" for scope, meaning in SCOPES.items())
    lines = [
        "# The inventory's variables",
        "",
        "<!-- Generated by `.venv/bin/python -m tools.options_reference` from the declarations"
        " (spark/inventory/ HostSettings, spark/fleet.py, spark/lane.py Lane, spark/catalog.py"
        " ModelSpec) and the defaults in group_data/all.py: edit those, not this file."
        " tests/unit/test_options_reference.py fails when the two differ. -->",
        "",
        "Every key a box's data may hold: `group_data/all.py` gives the defaults, a box's own data"
        " in the inventory overrides them key by key. Everything is checked before any box is"
        " contacted; a wrong type or value is refused naming the box, the key and what it takes"
        " (the *allowed* text below ends each such message). Scopes:",
        "",
        scopes,
        "",
        "## A box's keys",
        "",
        *host_section(defaults),
        "",
        "## A lane's keys",
        "",
        "Each entry of `lanes` (per lane; `docs/reference.md`, Lanes, says what each does):",
        "",
        *model_table(Lane),
        "",
        "## A model_spec's keys",
        "",
        "A lane's `model_spec`, for a model the catalog (`spark/data/model-catalog.json`) lacks:",
        "",
        *model_table(ModelSpec),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where the file differs")
    args = parser.parse_args(argv)
    text = reference()
    if args.check:
        if REFERENCE.read_text() != text:
            print(f"{REFERENCE.relative_to(REPO)} differs: run make variables", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The documented example lane of a model outside the catalog (docs/reference.md, Lanes, "A model
outside the catalog"), read from the document itself: what the tests plan and deploy is what it
shows."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

REFERENCE = Path(__file__).parents[2] / "docs" / "reference.md"
MARK = "<!-- model-spec-example -->"


def readme_lane() -> dict[str, Any]:
    """The lane in the fenced block after the document's mark (a Python literal, comments and
    all)."""
    after = REFERENCE.read_text().split(MARK, 1)[1]
    block = after.split("```text\n", 1)[1].split("```", 1)[0]
    return ast.literal_eval(block.strip())

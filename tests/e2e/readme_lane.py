"""The README's example lane of a model outside the catalog (Lanes, "A model outside the
catalog"), read from the README itself: what the tests plan and deploy is what it shows."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

README = Path(__file__).parents[2] / "README.md"
MARK = "<!-- model-spec-example -->"


def readme_lane() -> dict[str, Any]:
    """The lane in the fenced block after the README's mark (a Python literal, comments and all)."""
    after = README.read_text().split(MARK, 1)[1]
    block = after.split("```text\n", 1)[1].split("```", 1)[0]
    return ast.literal_eval(block.strip())

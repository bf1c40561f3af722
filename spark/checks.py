"""What the lane model's validators share: a refusal pydantic reports under its field, a
pattern check, the shape of a Hugging Face id (a lane's model, a catalog entry's name), of a
variable's name, and the characters that would split a unit or an environment file."""

from __future__ import annotations

import re
from typing import TypeVar

from pydantic import AfterValidator

# A Hugging Face repository id: org/name.
HF_ID = re.compile(r"(?P<org>[A-Za-z0-9][A-Za-z0-9._-]{0,95})/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a shell's and systemd's variable name
LINE_BREAK = re.compile(r"[\n\r\0]")  # would split the unit or env file that carries it
T = TypeVar("T")


def refused(value: T, problems: list[str]) -> T:
    """``value``, unless there are ``problems``: pydantic reports them (one a line) under the
    field, or the model, that the validator checks."""
    if problems:
        raise ValueError("\n".join(problems))
    return value


def matching(pattern: re.Pattern[str], problem: str) -> AfterValidator:
    """A field's check that all of its value matches ``pattern``, else ``problem`` ("{!r}" is
    the value), which pydantic reports under the field."""

    def check(value: str) -> str:
        return refused(value, [] if pattern.fullmatch(value) else [problem.format(value)])

    return AfterValidator(check)

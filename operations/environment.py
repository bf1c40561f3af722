"""The cluster environment every unit and login shell sees."""

from __future__ import annotations

import re
import shlex

from pyinfra import host
from pyinfra.api import operation

from operations import util
from operations.asked import Question, question
from spark.checks import ENV_NAME

PROFILE_PATH = "/etc/profile.d/spark-cluster-env.sh"
UNSAYABLE = ("\n", "\r", "\0")  # a line break ends an assignment in one reader, not the other
ESCAPED = re.compile(r'([\\"`$])')


def quote(value: str) -> str:
    """A double-quoted value that sh and systemd's EnvironmentFile= (v240 and later) read back
    alike: both take a backslash before \\ " ` $ as that character, and every other character
    inside double quotes as itself."""
    return '"' + ESCAPED.sub(r"\\\1", value) + '"'


@operation()
def cluster_env(
    variables: dict[str, str],
    path: str,
    notes: dict[str, str] | None = None,
    profile_path: str = PROFILE_PATH,
):
    """
    Write the cluster environment for systemd units and export it to login shells.

    + variables: name to value, e.g. {"NCCL_IB_GID_INDEX": "3"}; world-readable: no secrets
    + notes: name to one line written as a comment above it (where a setting comes from)
    + path: the file, root:root 0644, in systemd's EnvironmentFile= syntax (KEY="value")
    + profile_path: the /etc/profile.d script that exports the file's variables to login shells

    **Example:**

    .. code:: python

        environment.cluster_env(name="Cluster environment", variables=cluster.environment)
    """
    notes = notes or {}
    # The plan computes every name, value and note from checked data (spark/inventory/
    # cluster_environment): a problem here is the plan's, and stops this box alone.
    if wrong := unwritable(variables, notes):
        yield from util.refused(f"{host.name}: the cluster environment: {'; '.join(wrong)}")
        return
    found = util.on_box(path, profile_path)
    yield from util.template(
        "cluster.env.j2",
        path,
        found=found,
        variables=[(key, quote(value), notes.get(key)) for key, value in sorted(variables.items())],
    )
    yield from util.template(
        "profile-cluster-env.sh.j2", profile_path, found=found, env_file=shlex.quote(path)
    )


def unwritable(variables: dict[str, str], notes: dict[str, str]) -> list[str]:
    """What the environment file cannot carry: a name no shell or systemd takes, a value or a
    note with a line break or NUL (sh and systemd would split it differently)."""
    wrong = [
        f"{key!r} is not a valid environment variable name"
        for key in variables
        if not ENV_NAME.fullmatch(key)
    ]
    wrong += [
        f"the value of {key} holds a line break or NUL: {value!r}"
        for key, value in variables.items()
        if any(character in value for character in UNSAYABLE)
    ]
    wrong += [
        f"the note of {key} holds a line break or NUL: {note!r}"
        for key, note in notes.items()
        if any(character in note for character in UNSAYABLE)
    ]
    return wrong


def questions(path: str) -> list[Question]:
    """What ``cluster_env`` reads for the file at ``path`` (operations/asked.py)."""
    return [question(util.RootFiles, paths=(path, PROFILE_PATH))]

"""Every command README.md, CONTRIBUTING.md and docs/*.md show in their code blocks is one that
something
runs (this project's issue 31: "every command the README shows is run by a test or by make, so
none can rot again"): a target of the Makefile, given only variables the Makefile reads; a
`.venv/bin/` program, a `python -m` module that exists, and the repository paths it is given; or
a command the table below names with the test that runs it. Anything else fails.

The documents fence their code blocks and tag each: `sh` holds commands, one a line (a trailing
backslash continues it, `#` starts a comment); `text` and `json` hold output, examples and data
(inventory fragments are `text`: ruff format would rewrite a `python` fence). An untagged fence,
or a command in an indented block outside the fences, fails too.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import shlex
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]
# The owner's and the contributor's guides, which must show commands, then every document under
# docs/ (some, such as the generated variables reference, show none).
GUIDES = ("README.md", "CONTRIBUTING.md")
DOCS = (*GUIDES, *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")))
TAGS = {"sh", "text", "json"}
# What an indented block outside the fences would start with if it were a command.
COMMAND_WORDS = ("make ", ".venv/", "ssh ", "sudo ", "curl ", "pyinfra ", "python")


class RunBy(NamedTuple):
    """A command that is not make's nor the virtualenv's, and the test that runs it."""

    pattern: str  # a regular expression the whole command matches
    test: str  # the test module, from the repository's root
    evidence: str  # what in that module runs it


RUN_BY = (
    # Quick start 6 and 7: a lane's key read from its root-only file over SSH.
    RunBy(
        r"\(umask 077; ssh \S+ sudo cat /etc/spark/secrets/\w+\.key"
        r" > ~/\.config/opencode/\S+\.key\)",
        "tests/e2e/test_lanes.py",
        "sudo cat /etc/spark/secrets/",
    ),
    RunBy(
        r"key=\$\(ssh \S+ sudo cat /etc/spark/secrets/\w+\.key\)",
        "tests/e2e/test_lanes.py",
        "sudo cat /etc/spark/secrets/",
    ),
    # The chat request through the front with the lane's key (the test sends it from Python).
    RunBy(
        r"curl http://\S+:\d+/v1/chat/completions -H \"Authorization: Bearer \$key\" .*",
        "tests/e2e/test_lanes.py",
        "/chat/completions",
    ),
    # The fetch command the deploy prints for a missing model, and runs with fetch_weights.
    RunBy(
        r"sudo docker run --rm -v /var/lib/spark/models:/root/\.cache/huggingface .*hf download .*",
        "tests/e2e/test_cluster.py",
        '"fetch_weights=True"',
    ),
    # The NCCL test's command as the deploy writes it, run with a stand-in docker.
    RunBy(r"ssh -t \S+ sudo spark-nccl-test", "tests/unit/test_nccl.py", "spark-nccl-test"),
    # The throughput probe as the deploy writes it, against a loopback server.
    RunBy(r"sudo spark-lane-bench \w+ \d+", "tests/unit/test_lane_bench.py", "spark-lane-bench"),
    # Re-provisioning after a reimage: the section's block, run line by line on the lab.
    RunBy(r"ssh-keygen -R \S+", "tests/e2e/test_reprovision.py", "readme_commands()"),
    # docs/router.md's self-signed front certificate, made and checked as the router checks it.
    RunBy(r"openssl req -x509 .*", "tests/unit/test_router.py", "router_doc_commands()"),
    RunBy(
        r"ssh-keyscan -t ed25519 \S+"
        r" (\| tee /dev/stderr \| ssh-keygen -lf -|>> ~/\.ssh/known_hosts)",
        "tests/e2e/test_reprovision.py",
        "readme_commands()",
    ),
)


def fences(text: str) -> list[tuple[str, str]]:
    """Each fenced block's tag and its lines, dedented to the fence."""
    return [
        (tag, "\n".join(line[len(indent) :] for line in body.splitlines()))
        for indent, tag, body in re.findall(
            r"^( *)```(\w*)\n(.*?)\n\1```[ \t]*$", text, re.MULTILINE | re.DOTALL
        )
    ]


def unfenced_commands(text: str) -> list[str]:
    """Command lines of indented code blocks outside the fences (a block left untagged)."""
    outside = re.sub(r"^( *)```.*?^\1```[ \t]*$", "", text, flags=re.MULTILINE | re.DOTALL)
    lines = outside.splitlines()
    return [
        line.strip()
        for before, line in itertools.pairwise(lines)
        if not before.strip() and line.startswith("    ") and line.strip().startswith(COMMAND_WORDS)
    ]


def commands(block: str) -> list[str]:
    """The commands of an `sh` block: continuations joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n\s*", "", block)
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:  # the line as written, its comment and runs of spaces left out
            found.append(" ".join(line.split(" #", 1)[0].split()))
    return found


def makefile() -> tuple[set[str], str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, re.MULTILINE)), text


def module_exists(name: str) -> bool:
    """A module of this repository, or one the virtualenv installs (pytest)."""
    path = REPO / name.replace(".", "/")
    return (
        path.with_suffix(".py").is_file()
        or (path / "__init__.py").is_file()
        or (importlib.util.find_spec(name) is not None)
    )


def problem(command: str) -> str | None:
    """Why ``command`` is not one that make, the virtualenv or a named test runs; None if it is."""
    words = shlex.split(command, comments=True)
    if words[0] == "make":
        targets, text = makefile()
        for word in words[1:]:
            name, is_variable, _ = word.partition("=")
            if is_variable and f"$({name})" not in text:
                return f"{command!r}: the Makefile reads no variable {name}"
            if not is_variable and word not in targets:
                return f"{command!r}: the Makefile has no target {word!r}"
        return None
    if words[0].startswith(".venv/bin/"):
        program = words[0].removeprefix(".venv/bin/")
        if program == "python" and words[1:2] == ["-m"] and not module_exists(words[2]):
            return f"{command!r}: no module {words[2]}"
        if program not in ("python", "pyinfra", "pytest", "ruff"):
            return f"{command!r}: {program} is not a program of the virtualenv the tests use"
        for word in words[1:]:
            # A path of this repository (inventories/lab.py, deploy.py, tests/compliance).
            is_path = re.fullmatch(r"[\w-]+(/[\w.-]+)*\.py|tests/[\w/]+", word)
            if is_path and not (REPO / word).exists():
                return f"{command!r}: no {word} in the repository"
        return None
    for entry in RUN_BY:
        if re.fullmatch(entry.pattern, command):
            test = REPO / entry.test
            if not test.is_file() or entry.evidence not in test.read_text():
                return f"{command!r}: {entry.test} no longer runs it ({entry.evidence!r})"
            return None
    return f"{command!r}: neither make's, the virtualenv's, nor in test_readme.py's RUN_BY table"


def problems(text: str) -> list[str]:
    """Every code block problem of one document."""
    found = [f"a fence tagged {tag or 'nothing'!r}" for tag, _ in fences(text) if tag not in TAGS]
    found += [f"{line!r} in an indented block: fence it as sh" for line in unfenced_commands(text)]
    for tag, body in fences(text):
        if tag == "sh":
            found += [p for c in commands(body) if (p := problem(c))]
    return found


def test_every_command_of_the_documents_is_run_by_make_or_a_test() -> None:
    assert len(DOCS) > len(GUIDES), "no document under docs/: the check would skip them"
    for doc in DOCS:
        text = (REPO / doc).read_text()
        if doc in GUIDES:
            assert fences(text), f"{doc} has no code block: the check would pass on nothing"
        assert problems(text) == [], doc


def test_the_documents_show_commands_of_each_kind() -> None:
    """The check reads the commands that are there: make's, the virtualenv's and RUN_BY's."""
    shown = [c for doc in DOCS for tag, b in fences((REPO / doc).read_text()) if tag == "sh"
             for c in commands(b)]  # fmt: skip
    assert "make demo" in shown and "make test" in shown  # the newcomer's two commands
    assert ".venv/bin/pyinfra inventories/lab.py deploy.py" in shown
    assert "ssh-keygen -R spark-2.local" in shown


def test_a_made_up_command_fails() -> None:
    doc = (
        "Try:\n\n```sh\nmake plan BOX=spark-1.local   # one box\nfrobnicate --all\n"
        "make no-such-target\nmake plan NO_SUCH_VARIABLE=1\n.venv/bin/python -m no_such_module\n"
        ".venv/bin/pyinfra inventories/nowhere.py deploy.py\n"
        "ssh -t nvidia@spark-1.local sudo spark-nccl-test\n```\n\n"
        "```\nuntagged\n```\n\nOld style:\n\n    make demo\n"
    )
    assert problems(doc) == [
        "a fence tagged 'nothing'",
        "'make demo' in an indented block: fence it as sh",
        "'frobnicate --all': neither make's, the virtualenv's, nor in test_readme.py's RUN_BY"
        " table",
        "'make no-such-target': the Makefile has no target 'no-such-target'",
        "'make plan NO_SUCH_VARIABLE=1': the Makefile reads no variable NO_SUCH_VARIABLE",
        "'.venv/bin/python -m no_such_module': no module no_such_module",
        "'.venv/bin/pyinfra inventories/nowhere.py deploy.py': no inventories/nowhere.py in the"
        " repository",
    ]


def test_make_passes_no_arguments_so_bench_takes_a_variable() -> None:
    """`make bench --converge-reps 1` would hand the option to make itself, not to bench.run."""
    assert problem("make bench --converge-reps 1") == (
        "'make bench --converge-reps 1': the Makefile has no target '--converge-reps'"
    )
    assert problem('make bench BENCH_ARGS="--hosts 0"') is None


def test_a_continued_command_is_one_command() -> None:
    block = "curl http://a:1/v1/chat/completions \\\n  -H 'X: y' \\\n  -d '{}'   # a comment\n"
    assert commands(block) == ["curl http://a:1/v1/chat/completions -H 'X: y' -d '{}'"]


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_anchors(doc: Path) -> list[str]:
    """Links of ``doc`` to a section (``file.md#anchor``, ``#anchor``) whose file exists but has
    no heading of that anchor: a section renamed or moved under docs/."""
    found = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", doc.read_text()):
        path = doc.parent / target if target else doc
        if path.is_file():
            headings = re.findall(r"^#+ (.*)$", path.read_text(), re.MULTILINE)
            if anchor not in {heading_anchor(h) for h in headings}:
                found.append(f"{doc.name}: {target}#{anchor}")
    return found


def test_every_link_to_a_section_names_one_of_its_headings() -> None:
    assert [p for doc in DOCS for p in broken_anchors(REPO / doc)] == []


def test_a_heading_anchor_is_githubs(tmp_path: Path) -> None:
    assert heading_anchor("Taking it off: teardown.py, a box leaving the cluster") == (
        "taking-it-off-teardownpy-a-box-leaving-the-cluster"
    )
    assert heading_anchor("Watching the fleet: metrics, alerts, `make status`") == (
        "watching-the-fleet-metrics-alerts-make-status"
    )
    doc = tmp_path / "a.md"
    doc.write_text("# A title\n\n[here](#a-title), [gone](#no-such), [b](b.md#x)\n")
    assert broken_anchors(doc) == ["a.md: #no-such"]

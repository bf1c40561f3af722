"""Write spark/data/llama.cpp-<commit>-server-options.json from llama.cpp's common/arg.cpp.

Every option `llama-server` accepts, as llama.cpp's own argument table declares it: each
`add_opt(common_arg({names}, [{negative names}], ["VALUE" ["VALUE2"]], help, handler)...)` in
`common_params_parser_init`, with the chained `.set_examples(...)`, `.set_excludes(...)` and
`.set_env(...)`. An option belongs to llama-server by the rule of that function's `add_opt`
lambda (arg.cpp at 0c1e57098, the "filter options by example" comment and the lambda below it):
it lists LLAMA_EXAMPLE_SERVER or LLAMA_EXAMPLE_COMMON among its examples (COMMON when
set_examples is not called: common_arg's default in common/arg.h) and LLAMA_EXAMPLE_SERVER is
not among its excludes. Declarations inside `if (ex == LLAMA_EXAMPLE_...)` blocks of that
function count only where the condition holds for the server; preset-only arguments
(`set_preset_only`) are no command-line options and are left out. Standard library only.

llama.cpp's source ships inside llama-cpp-python's source distribution (its CHANGELOG names the
llama.cpp commit it vendors: 0c1e57098 for 0.3.36):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d <dir>
    tar -xzf <dir>/llama_cpp_python-0.3.36.tar.gz -C <dir>

then, from the repository root:

    python3 tools/llama_cpp_options.py \\
        <dir>/llama_cpp_python-0.3.36/vendor/llama.cpp/common/arg.cpp 0c1e57098 \\
        spark/data/llama.cpp-0c1e57098-server-options.json

Each option in the output: "names" (as declared, short first), "negatives" (the `--no-...`
names of a boolean pair), "value" and "value_2" (the hints of the values it takes, null for
none), "env" (the environment variable it reads, or null) and "handler" (what its handler
takes: "void" a flag, "bool" a flag with negatives, "int" a number read by std::stoi, "string"
one value, "string_string" two values), which decides how a command line and the environment
are read (common_params_parse_ex in the same file).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

SERVER = "LLAMA_EXAMPLE_SERVER"
COMMON = "LLAMA_EXAMPLE_COMMON"
PARSER_INIT = re.compile(r"\bcommon_params_context\s+common_params_parser_init\s*\(")
NAMED_EXAMPLES = re.compile(
    r"std::initializer_list<enum llama_example>\s+(\w+)\s*=\s*\{([^}]*)\}\s*;"
)
EXAMPLE_TEST = re.compile(r"\s*ex\s*(==|!=)\s*(LLAMA_EXAMPLE_\w+)\s*")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
CLOSING = {"(": ")", "{": "}", "[": "]"}


class ArgTableError(ValueError):
    """arg.cpp holds something this reader does not know how to read."""


def _literal_end(text: str, i: int) -> int | None:
    """The end of the string, character or raw literal, or comment, starting at i; else None."""
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    if text.startswith("/*", i):
        return text.index("*/", i + 2) + 2
    raw = re.match(r'R"([^(\s]*)\(', text[i : i + 20])
    if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
        return text.index(f'){raw[1]}"', i) + len(raw[1]) + 2
    if text[i] in "\"'":
        quote, j = text[i], i + 1
        while text[j] != quote:
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return None


def _without_comments(source: str) -> str:
    """The source with every comment blanked (its newlines kept), literals untouched."""
    kept, i, start = [], 0, 0
    while i < len(source):
        end = _literal_end(source, i)
        if end is None:
            i += 1
            continue
        if source.startswith(("//", "/*"), i):
            kept += [source[start:i], re.sub(r"[^\n]", " ", source[i:end])]
            start = end
        i = end
    return "".join([*kept, source[start:]])


def _close(text: str, i: int) -> int:
    """The index just past the bracket closing the one at text[i]."""
    stack = [CLOSING[text[i]]]
    j = i + 1
    while stack:
        end = _literal_end(text, j)
        if end is not None:
            j = end
            continue
        char = text[j]
        if char in CLOSING:
            stack.append(CLOSING[char])
        elif char in ")}]" and char != stack.pop():
            raise ArgTableError(f"unbalanced {char!r} at offset {j}")
        j += 1
    return j


def _split(text: str) -> list[str]:
    """The comma-separated parts of an argument list, commas inside brackets kept."""
    parts, start, j = [], 0, 0
    while j < len(text):
        end = _literal_end(text, j)
        if end is not None:
            j = end
        elif text[j] in CLOSING:
            j = _close(text, j)
        elif text[j] == ",":
            parts.append(text[start:j].strip())
            start = j = j + 1
        else:
            j += 1
    tail = text[start:].strip()
    return [*parts, tail] if tail or parts else parts


def _string(text: str) -> str:
    """The value of one C++ string literal, or of adjacent ones (simple escapes only)."""
    pieces = re.findall(r'"((?:[^"\\]|\\.)*)"', text)
    if not pieces or re.sub(r'"((?:[^"\\]|\\.)*)"', "", text).strip():
        raise ArgTableError(f"not a string literal: {text[:80]!r}")
    return "".join(piece.encode().decode("unicode_escape") for piece in pieces)


def _hint(text: str) -> str:
    """A value hint: its string, or the C++ expression that makes it where it is no literal
    (--spec-type's is common_speculative_all_types_str())."""
    try:
        return _string(text)
    except ArgTableError:
        return " ".join(text.split())


def _strings(text: str) -> list[str]:
    """The strings of a braced list of literals: { "-c", "--ctx-size" }."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ArgTableError(f"not a braced list: {text[:80]!r}")
    return [_string(part) for part in _split(text[1:-1])]


def _handler_kind(lambda_text: str) -> str:
    """What a handler lambda takes after `common_params &`: from its parameter list."""
    match = re.match(r"\s*\[[^\]]*\]\s*\(([^)]*)\)", lambda_text)
    if match is None:
        raise ArgTableError(f"handler is not a lambda: {lambda_text[:80]!r}")
    taken = [part.strip() for part in match[1].split(",")[1:]]
    kinds = {
        (): "void",
        ("bool",): "bool",
        ("int",): "int",
        ("string",): "string",
        ("string", "string"): "string_string",
    }
    key = tuple("string" if "std::string" in p else p.split()[0] if p else p for p in taken)
    if key not in kinds:
        raise ArgTableError(f"handler takes {taken}: not one of common_arg's handlers")
    return kinds[key]


@dataclass
class Declared:
    """One common_arg as declared, with its chained calls."""

    names: list[str]
    negatives: list[str]
    value: str | None
    value_2: str | None
    handler: str
    examples: set[str] = field(default_factory=lambda: {COMMON})
    excludes: set[str] = field(default_factory=set)
    env: str | None = None
    preset_only: bool = False

    def for_server(self) -> bool:
        """The add_opt lambda's rule for llama-server (whose examples inherit COMMON)."""
        listed = SERVER in self.examples or COMMON in self.examples
        return listed and SERVER not in self.excludes and not self.preset_only

    def to_json(self) -> dict[str, object]:
        return {
            "names": self.names,
            "negatives": self.negatives,
            "value": self.value,
            "value_2": self.value_2,
            "env": self.env,
            "handler": self.handler,
        }


def _examples(text: str, named: dict[str, set[str]]) -> set[str]:
    text = text.strip()
    if text in named:
        return named[text]
    if not (text.startswith("{") and text.endswith("}")):
        raise ArgTableError(f"examples neither a list nor a known name: {text[:80]!r}")
    return {part for part in _split(text[1:-1]) if part}


def _declared(call: str, named: dict[str, set[str]]) -> Declared:
    """One `common_arg(...).set_x(...)...` expression (the text inside add_opt's brackets)."""
    start = re.match(r"\s*common_arg\s*\(", call)
    if start is None:
        raise ArgTableError(f"add_opt of something other than common_arg: {call[:80]!r}")
    close = _close(call, start.end() - 1)
    args = _split(call[start.end() : close - 1])
    names = _strings(args[0])
    negatives: list[str] = []
    value = value_2 = None
    if len(args) == 3:  # names, help, handler
        pass
    elif len(args) == 4 and args[1].startswith("{"):  # names, negatives, help, handler
        negatives = _strings(args[1])
    elif len(args) == 4:  # names, value hint, help, handler
        value = _hint(args[1])
    elif len(args) == 5:  # names, value hint, second value hint, help, handler
        value, value_2 = _hint(args[1]), _hint(args[2])
    else:
        raise ArgTableError(f"common_arg with {len(args)} arguments: {names}")
    declared = Declared(names, negatives, value, value_2, _handler_kind(args[-1]))
    rest = call[close:]
    position = 0
    while True:
        method = re.compile(r"\s*\.\s*(\w+)\s*\(").match(rest, position)
        if method is None:
            break
        end = _close(rest, method.end() - 1)
        inner = rest[method.end() : end - 1]
        if method[1] == "set_examples":
            declared.examples = _examples(inner, named)
        elif method[1] == "set_excludes":
            declared.excludes = _examples(inner, named)
        elif method[1] == "set_env":
            declared.env = _string(inner)
        elif method[1] == "set_preset_only":
            declared.preset_only = True
        position = end
    if rest[position:].strip():
        raise ArgTableError(f"{names}: unread text after the declaration: {rest[position:]!r}")
    return declared


def _condition(text: str) -> bool | None:
    """Whether `if (text)` holds for llama-server; None where it is no test of `ex`."""
    match = EXAMPLE_TEST.fullmatch(text)
    if match is None:
        return None
    return (match[2] == SERVER) == (match[1] == "==")


def _function_body(source: str) -> str:
    match = PARSER_INIT.search(source)
    if match is None:
        raise ArgTableError("no common_params_parser_init in this file")
    params_end = _close(source, match.end() - 1)
    brace = source.index("{", params_end)
    return source[brace + 1 : _close(source, brace) - 1]


def server_options(source: str) -> list[Declared]:
    """The options llama-server gets, in the order arg.cpp declares them."""
    named = {
        name: {part.strip() for part in body.split(",") if part.strip()}
        for name, body in NAMED_EXAMPLES.findall(source)
    }
    body = _function_body(_without_comments(source))
    found: list[Declared] = []
    # A block's state: whether it holds for the server (None: not known), and the conditions of
    # the if/else-if chain it belongs to (for a following `else`).
    stack: list[tuple[bool | None, list[bool | None]]] = [(True, [])]
    chain: list[bool | None] = []  # the chain just closed, for an `else` right after it
    pending: tuple[bool | None, list[bool | None]] | None = None
    i = 0
    while i < len(body):
        end = _literal_end(body, i)
        if end is not None:
            i = end
            continue
        word = IDENTIFIER.match(body, i)
        if word and (i == 0 or not (body[i - 1].isalnum() or body[i - 1] == "_")):
            keyword, after = word[0], word.end()
            if keyword == "add_opt" and body[after:].lstrip().startswith("("):
                paren = body.index("(", after)
                close = _close(body, paren)
                active = stack[-1][0]
                if active is None:
                    raise ArgTableError("an add_opt under a condition that is no test of `ex`")
                declared = _declared(body[paren + 1 : close - 1], named)
                if active and declared.for_server():
                    found.append(declared)
                i = close
                continue
            if keyword == "if":
                paren = body.index("(", after)
                close = _close(body, paren)
                holds = _condition(body[paren + 1 : close - 1])
                previous = chain if body[:i].rstrip().endswith("else") else []
                pending = (holds, [*previous, holds])
                i = close
                continue
            if keyword == "else" and body[after:].lstrip().startswith("{"):
                pending = (None, chain)  # resolved at its brace
                i = after
                continue
            i = after
            continue
        char = body[i]
        if char == "{":
            parent = stack[-1][0]
            if pending is not None and pending[0] is None and pending[1] is chain:
                # `else {`: holds where no condition of the chain did
                known = all(c is not None for c in chain)
                holds = (not any(chain)) if known else None
                stack.append((None if parent is None or holds is None else parent and holds, []))
            elif pending is not None:
                holds, conditions = pending
                others = conditions[:-1]
                if holds is None or any(c is None for c in others):
                    state = None
                else:
                    state = holds and not any(others)
                stack.append((None if parent is None or state is None else parent and state,
                              conditions))  # fmt: skip
            else:
                stack.append((parent, []))
            pending = None
            i = _block_start(body, i)
            continue
        if char == "}":
            chain = stack.pop()[1]
            if not stack:
                raise ArgTableError("unbalanced } in common_params_parser_init")
        elif char == ";":
            chain = []
        i += 1
    return found


def _block_start(body: str, i: int) -> int:
    """Past the `{` at i where it opens a block of statements (after `if (...)`, `else`,
    `for (...)`); a lambda's body or an initializer list is skipped whole, up to its `}`."""
    before = body[:i].rstrip()
    lambda_body = re.search(r"\]\s*\([^()]*\)\s*(->\s*[\w:<>]+\s*)?$", before)
    if before.endswith((")", "else")) and not lambda_body:
        return i + 1
    return _close(body, i) - 1


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        print("usage: llama_cpp_options.py ARG_CPP COMMIT OUTPUT_JSON", file=sys.stderr)
        return 2
    source_path, commit, output = Path(argv[0]), argv[1], Path(argv[2])
    options = server_options(source_path.read_text())
    seen: dict[str, list[str]] = {}
    for option in options:
        for name in [*option.names, *option.negatives]:
            if name in seen:
                raise ArgTableError(f"{name} declared twice for llama-server: {seen[name]}")
            seen[name] = option.names
    data = {
        "about": (
            f"Every option `llama-server` accepts at llama.cpp commit {commit}, read from"
            " llama.cpp's own argument table (common/arg.cpp, common_params_parser_init: options"
            " of LLAMA_EXAMPLE_SERVER or LLAMA_EXAMPLE_COMMON not excluding the server) in the"
            " copy vendored by llama-cpp-python's source distribution (0.3.36 vendors"
            " ggml-org/llama.cpp@0c1e57098 per its CHANGELOG), by tools/llama_cpp_options.py."
            " handler: what the option's handler takes (void: a flag; bool: a flag with"
            " negatives; int: a number; string: one value; string_string: two values)."
        ),
        "commit": commit,
        "options": [option.to_json() for option in options],
    }
    output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(options)} options for llama-server written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

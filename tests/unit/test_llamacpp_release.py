"""llama-server's option list (spark/data/llama.cpp-0c1e57098-server-options.json, read
from llama.cpp's common/arg.cpp at 0c1e57098 by tools/llama_cpp_options.py), and that tool on
an excerpt written by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark import llamacpp_release
from spark.llamacpp_release import DEFAULT_COMMIT, Option, distinct, known_commits, options

TOOL = Path(__file__).resolve().parents[2] / "tools" / "llama_cpp_options.py"
# tools/server/README.md at the same commit lists 255 options (its table is made by
# llama-gen-docs from the same arg.cpp) and 148 environment variables.
SERVER_OPTIONS = 255


def test_the_default_commit_has_its_list() -> None:
    assert DEFAULT_COMMIT == "0c1e57098"
    assert DEFAULT_COMMIT in known_commits()
    data = json.loads(llamacpp_release.data_path(DEFAULT_COMMIT).read_text())
    assert data["commit"] == DEFAULT_COMMIT
    assert "common/arg.cpp" in data["about"] and "0.3.36" in data["about"]


def test_count_of_options_and_variables() -> None:
    assert len(distinct()) == SERVER_OPTIONS
    assert len({option.env for option in distinct() if option.env}) == 148


@pytest.mark.parametrize(
    ("names", "env", "handler"),
    [
        (("-c", "--ctx-size"), "LLAMA_ARG_CTX_SIZE", "int"),
        (("-ngl", "--gpu-layers", "--n-gpu-layers"), "LLAMA_ARG_N_GPU_LAYERS", "string"),
        # The server's own -np (arg.cpp's `if (ex == LLAMA_EXAMPLE_SERVER)` branch).
        (("-np", "--parallel"), "LLAMA_ARG_N_PARALLEL", "int"),
        (("-t", "--threads"), "LLAMA_ARG_THREADS", "int"),
        (("-ctk", "--cache-type-k"), "LLAMA_ARG_CACHE_TYPE_K", "string"),
        (("-ctv", "--cache-type-v"), "LLAMA_ARG_CACHE_TYPE_V", "string"),
        (("--api-key",), "LLAMA_API_KEY", "string"),
        (("--api-key-file",), "LLAMA_ARG_API_KEY_FILE", "string"),
        (("--host",), "LLAMA_ARG_HOST", "string"),
        (("--port",), "LLAMA_ARG_PORT", "int"),
        (("-m", "--model"), "LLAMA_ARG_MODEL", "string"),
        (("-a", "--alias"), "LLAMA_ARG_ALIAS", "string"),
        (("--spec-draft-model", "-md", "--model-draft"), "LLAMA_ARG_SPEC_DRAFT_MODEL", "string"),
    ],
)
def test_options_that_take_a_value(names: tuple[str, ...], env: str, handler: str) -> None:
    for name in names:
        option = options()[name]
        assert option.names == names
        assert option.takes_value and option.values == 1
        assert option.env == env
        assert option.handler == handler


def test_jinja_is_a_pair_of_flags() -> None:
    # arg.cpp: common_arg({"--jinja"}, {"--no-jinja"}, help, [](common_params &, bool) ...)
    jinja = options()["--jinja"]
    assert options()["--no-jinja"] is jinja
    assert jinja == Option(("--jinja",), ("--no-jinja",), None, None, "LLAMA_ARG_JINJA", "bool")
    assert not jinja.takes_value


def test_flags_and_two_values() -> None:
    assert options()["--metrics"].handler == "void"
    assert options()["--metrics"].values == 0
    assert options()["--control-vector-layer-range"].values == 2


@pytest.mark.parametrize("name", ["-p", "--prompt", "-f", "--file", "-i", "--interactive"])
def test_options_llama_server_does_not_take(name: str) -> None:
    # -p/--prompt: set_excludes({LLAMA_EXAMPLE_SERVER}); -i: set_examples({CLI, COMPLETION}).
    assert name not in options()


def test_an_unknown_commit_is_refused() -> None:
    with pytest.raises(ValueError, match="no llama-server option list here; one of: 0c1e57098"):
        options("deadbeef")


# Written by hand in the shape of llama.cpp's common/arg.cpp (not copied from it): a named
# example list, a server-only branch and its else, an exclusion, a comment and a raw string
# holding brackets, a bool pair, two values, and options of other programs.
EXCERPT = r"""
static std::initializer_list<enum llama_example> media_examples = {
    LLAMA_EXAMPLE_MTMD,
    LLAMA_EXAMPLE_SERVER,
};

common_params_context common_params_parser_init(common_params & params, llama_example ex,
                                                void(*print_usage)(int, char **)) {
    if (ex == LLAMA_EXAMPLE_COMPLETION) {
        params.x = 1;
    } else if (ex == LLAMA_EXAMPLE_SERVER) {
        params.y = 2; // a comment with a brace {
    }
    auto add_opt = [&](common_arg arg) {
        if (arg.in_example(ex)) { ctx_arg.options.push_back(std::move(arg)); }
    };
    add_opt(common_arg(
        {"-s", "--size"}, "N",
        string_format("size (default: %d)", params.size),
        [](common_params & params, int value) { params.size = value; }
    ).set_env("LLAMA_ARG_SIZE"));
    add_opt(common_arg(
        {"--say"}, "TEXT",
        "words, with a ) and a { in them",
        [](common_params & params, const std::string & value) {
            const std::regex re{ R"([)(]+)" };
        }
    ).set_excludes({LLAMA_EXAMPLE_SERVER}));
    /* add_opt(common_arg({"--gone"}, "old", [](common_params &) {})); */
    if (ex == LLAMA_EXAMPLE_SERVER) {
        add_opt(common_arg(
            {"-k", "--slots"}, "N",
            "server slots",
            [](common_params & params, int value) { params.slots = value; }
        ).set_env("LLAMA_ARG_SLOTS").set_examples({LLAMA_EXAMPLE_SERVER}));
    } else {
        add_opt(common_arg(
            {"-k", "--slots"}, "N",
            "sequences",
            [](common_params & params, int value) { params.slots = value; }
        ));
    }
    add_opt(common_arg(
        {"--tmpl"},
        {"--no-tmpl"},
        "templates",
        [](common_params & params, bool value) { params.tmpl = value; }
    ).set_examples({LLAMA_EXAMPLE_CLI, LLAMA_EXAMPLE_SERVER}).set_env("LLAMA_ARG_TMPL"));
    add_opt(common_arg(
        {"--range"}, "A", "B",
        "a range",
        [](common_params & params, const std::string & a, const std::string & b) {}
    ));
    add_opt(common_arg(
        {"--image"}, "FILE",
        "an image",
        [](common_params & params, const std::string & value) {}
    ).set_examples(media_examples));
    add_opt(common_arg(
        {"--bench-only"},
        "bench",
        [](common_params & params) {}
    ).set_examples({LLAMA_EXAMPLE_BENCH}));
    return ctx_arg;
}

void common_params_add_preset_options(std::vector<common_arg> & args) {
    args.push_back(common_arg({"preset-only"}, "X", "h", [](common_params &, int) {}));
}
"""


def test_the_tool_on_an_excerpt_written_by_hand(tmp_path: Path) -> None:
    source = tmp_path / "arg.cpp"
    source.write_text(EXCERPT)
    output = tmp_path / "options.json"
    result = subprocess.run(
        [sys.executable, str(TOOL), str(source), "abc1234", str(output)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "5 options for llama-server" in result.stdout
    data = json.loads(output.read_text())
    assert data["commit"] == "abc1234"

    def row(
        names: list[str], value: str | None, env: str | None, handler: str, **more: object
    ) -> dict[str, object]:
        return {"names": names, "negatives": [], "value": value, "value_2": None, "env": env,
                "handler": handler, **more}  # fmt: skip

    assert data["options"] == [
        row(["-s", "--size"], "N", "LLAMA_ARG_SIZE", "int"),
        row(["-k", "--slots"], "N", "LLAMA_ARG_SLOTS", "int"),
        row(["--tmpl"], None, "LLAMA_ARG_TMPL", "bool", negatives=["--no-tmpl"]),
        row(["--range"], "A", None, "string_string", value_2="B"),
        row(["--image"], "FILE", None, "string"),
    ]


def test_the_tool_refuses_an_option_under_an_unknown_condition(tmp_path: Path) -> None:
    source = tmp_path / "arg.cpp"
    source.write_text(
        "common_params_context common_params_parser_init(common_params & params) {\n"
        "    if (params.x) {\n"
        '        add_opt(common_arg({"-x"}, "x", [](common_params & params) {}));\n'
        "    }\n"
        "}\n"
    )
    result = subprocess.run(
        [sys.executable, str(TOOL), str(source), "abc", str(tmp_path / "out.json")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "condition that is no test of `ex`" in result.stderr

"""Write spark/data/vllm-<version>-option-values.json for the installed vLLM.

What the value of each `vllm serve` option must be, where it is more than a string: the
type of every field of EngineArgs and FrontendArgs as vLLM's own `_compute_kwargs` turns it
into an argparse type, named as the data file names it (int, float, human_int,
human_int_or_auto, json, json_or_str, str with nargs '+', and 'none' where vLLM's
optional_type also takes 'None' or ''). The parser itself (`make_arg_parser`) gives the
option names, which fields are options at all, the choices (options with choices are left
out: their values are in vllm-<version>-serve-options.json) and the options declared in
make_arg_parser itself (--api-server-count). Types are taken from the fields, not from the
parser's actions, because EngineArgs.add_cli_args and FrontendArgs.add_cli_args replace a
few of them afterwards (--block-size, --data-parallel-rank, --allowed-origins, ...), and the
data files describe the field types.

Run it with the Python of a venv of its own (Python 3.11) that holds, no GPU needed:

    pip download --no-deps vllm==<version>
    pip install --no-deps vllm-<version>-*.whl
    pip install torch==2.13.0  # the CPU build, for every release
    pip install numpy packaging regex pyyaml pydantic cbor2 huggingface_hub safetensors \
        transformers gguf aiohttp psutil pyzmq msgspec cloudpickle pillow pybase64 \
        cachetools uvloop py-cpuinfo openai openai-harmony prometheus_client \
        partial-json-parser
    # 0.31.0 also needs: pip install xgrammar llguidance; 0.33.0 also fastapi

then, from the repository root:

    <venv>/bin/python tools/vllm_option_values.py \
        --out spark/data/vllm-<version>-option-values.json

DeviceConfig.__post_init__ is bypassed (it cannot infer a device without a GPU) and vLLM's
platform reports device type 'cuda' while the parser is built, as for the serve-options
files; vLLM's compiled extensions are not loaded.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

# Where `vllm serve` has taken make_arg_parser from, newest first; the import in
# vllm/entrypoints/cli/serve.py decides, these are the fallback.
CLI_ARGS_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)

ABOUT = (
    "What the value of each `vllm serve` option of vLLM {v} must be, where it is more than a"
    " string: read from the field types of EngineArgs ({engine_file}) and FrontendArgs"
    " ({frontend_file}) in vLLM {v}'s PyPI wheel, turned into argparse types by the rules of"
    " vLLM's own _compute_kwargs in the same file: a config dataclass or a dict is a JSON object"
    " (json); a dict or a string is a JSON object where the value starts with '{{', else any"
    " string (json_or_str); a list or set takes one or more values (nargs '+');{optional_value}"
    " int and float are argparse's int and float; {human_int}; 'none': the value may also be"
    " 'None' or empty (vLLM's optional_type).{relaxed_json} {own} are declared in"
    " make_arg_parser itself ({own_kinds}). Options not listed take one plain string, or one of"
    " their choices in vllm-{v}-serve-options.json; boolean flags take no value."
)
# Where the release has them: bool | str fields (from 0.31.0), bare numbers in a config's JSON.
OPTIONAL_VALUE = " a bool or a string takes one string or none at all (nargs '?');"
RELAXED_JSON = (
    ' A config dataclass\'s JSON may also hold bare human-readable numbers ({"x": 80m}),'
    " which vLLM expands before it reads the JSON."
)


def serve_cli_args_module() -> str:
    """The module that `vllm serve` imports make_arg_parser from."""
    import vllm

    serve = Path(vllm.__file__).parent / "entrypoints" / "cli" / "serve.py"
    if serve.is_file():  # read, not imported: the server's imports are not installed
        tree = ast.parse(serve.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and any(alias.name == "make_arg_parser" for alias in node.names)
            ):
                return node.module
    for name in CLI_ARGS_MODULES:
        if importlib.util.find_spec(name) is not None:
            return name
    raise SystemExit("no module of this vLLM defines make_arg_parser")


def prepare_cpu_only() -> None:
    """Let the parser be built without a GPU: no device inference, platform 'cuda'."""
    import vllm.config.device as device

    device.DeviceConfig.__post_init__ = lambda self: None  # type: ignore[method-assign]
    import vllm.platforms as platforms

    platform = platforms.current_platform
    if not getattr(platform, "device_type", ""):
        with contextlib.suppress(AttributeError, TypeError):
            type(platform).device_type = "cuda"


def enclosed(func: Callable[..., Any], name: str) -> Any:
    """The value a vLLM type wrapper (optional_type, parse_type) closes over."""
    return inspect.getclosurevars(func).nonlocals[name]


def type_name(func: Any) -> tuple[str | None, bool]:
    """The data file's name for an argparse type callable, and whether it takes 'None'.

    None for the name where the callable is none of those vLLM's rules make.
    """
    import vllm.engine.arg_utils as arg_utils

    if func is None:
        return None, False
    qualname = getattr(func, "__qualname__", "")
    if qualname.startswith("optional_type."):
        inner, _ = type_name(enclosed(func, "return_type"))
        return inner, True
    if qualname.startswith("parse_type."):
        return type_name(enclosed(func, "return_type"))
    if func is json.loads or qualname.endswith("parse_dataclass"):
        return "json", False
    if func is getattr(arg_utils, "union_dict_and_str", None):
        return "json_or_str", False
    if func is getattr(arg_utils, "human_readable_int", None):
        return "human_int", False
    if func is getattr(arg_utils, "human_readable_int_or_auto", None):
        return "human_int_or_auto", False
    if func in (int, float, str):
        return func.__name__, False
    return None, False


def type_checking_names(module: ModuleType) -> dict[str, Any]:
    """The names a module imports only under `if TYPE_CHECKING:`."""
    names: dict[str, Any] = {}
    source = inspect.getsource(module)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                if isinstance(statement, ast.Import | ast.ImportFrom):
                    with contextlib.suppress(Exception):
                        exec(compile(ast.Module([statement], []), module.__name__, "exec"), names)
    names.pop("__builtins__", None)
    return names


def field_type(cls: type, field: dataclasses.Field[Any]) -> Any:
    """A field's type, its annotation evaluated where it is a string."""
    if not isinstance(field.type, str):
        return field.type
    owner = next(c for c in cls.__mro__ if field.name in vars(c).get("__annotations__", {}))
    module = sys.modules[owner.__module__]
    namespace = {**type_checking_names(module), **vars(module)}
    return eval(field.type, namespace)


def field_kwargs(cls: type, dests: set[str]) -> dict[str, dict[str, Any]]:
    """argparse kwargs of each field of cls that is an option, by vLLM's own _compute_kwargs.

    It runs on a copy of cls with just those fields, their string annotations evaluated
    (vLLM's parser never runs it on EngineArgs itself, whose annotations may be strings).
    """
    import vllm.engine.arg_utils as arg_utils

    copied = []
    for field in dataclasses.fields(cls):
        if field.name not in dests:
            continue
        spec = dataclasses.field(default=field.default, default_factory=field.default_factory)
        copied.append((field.name, field_type(cls, field), spec))
    stand_in = dataclasses.make_dataclass(cls.__name__, copied, kw_only=True)
    compute = getattr(arg_utils, "get_kwargs", None) or arg_utils._compute_kwargs
    return compute(stand_in)


def describe(action: argparse.Action, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """The entry of one option, or None where it takes one plain string, a choice or no value."""
    if action.nargs == 0 or action.choices or (kwargs and kwargs.get("choices")):
        return None
    if kwargs is None:
        # Declared in make_arg_parser itself: its own type, 'None' where its default is None.
        name, none = type_name(action.type)
        nargs = action.nargs
        none = none or (name not in (None, "str") and action.default is None)
    else:
        if "action" in kwargs:  # boolean flags
            return None
        name, none = type_name(kwargs.get("type"))
        nargs = kwargs.get("nargs")
        if name is None:
            # A class of vLLM's own as the element type (LoRAModulePath): the parser's.
            name, _ = type_name(action.type)
    if name is None:
        if action.type is None and nargs is None:
            return None
        raise SystemExit(f"{action.option_strings}: no rule for type {action.type!r}")
    if name == "str":
        if nargs is None:
            return None
        none = False  # 'None' is a string like any other
    entry: dict[str, Any] = {"type": name}
    if nargs is not None:
        entry["nargs"] = nargs
    if none:
        entry["none"] = True
    return entry


def spoken_list(items: list[str]) -> str:
    return " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


def human_int_sentence(values: dict[str, dict[str, Any]]) -> str:
    """Which options take vLLM's human-readable integers, in the order vLLM names them."""
    import vllm.engine.arg_utils as arg_utils

    source = inspect.getsource(arg_utils._compute_kwargs)

    def named(kind: str) -> list[str]:
        options = [o for o, entry in values.items() if entry["type"] == kind]
        options.sort(key=lambda o: source.find(o[2:].replace("-", "_")) % (len(source) + 1))
        return options

    parts = []
    if human := named("human_int"):
        verb = "take" if len(human) > 1 else "takes"
        parts.append(f"{spoken_list(human)} {verb} vLLM's human_readable_int ('8k', '1M')")
    if auto := named("human_int_or_auto"):
        parts.append(f"{spoken_list(auto)} human_readable_int_or_auto")
    return ", ".join(parts)


def relative_file(obj: Any) -> str:
    """Where obj is defined, as a path inside the wheel (vllm/...)."""
    path = Path(inspect.getsourcefile(obj) or "")
    parts = path.parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("vllm") :])


def parser_entry(action: argparse.Action) -> dict[str, Any] | None:
    """The entry as the parser's own action reads the value (for --differences)."""
    if action.nargs == 0 or action.choices:
        return None
    name, none = type_name(action.type)
    name = name or "str"  # a lambda of add_cli_args: it takes one string
    if name == "str" and action.nargs is None:
        return None
    entry: dict[str, Any] = {"type": name}
    if action.nargs is not None:
        entry["nargs"] = action.nargs
    if none and name != "str":
        entry["none"] = True
    return entry


OWN_KINDS = {"--config": "a file path"}


def option_values(differences: bool = False) -> dict[str, Any]:
    prepare_cpu_only()
    import vllm
    import vllm.engine.arg_utils as arg_utils

    module = importlib.import_module(serve_cli_args_module())
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]

    parser = module.make_arg_parser(FlexibleArgumentParser())
    dests = {action.dest for action in parser._actions}
    kwargs = {
        **field_kwargs(module.FrontendArgs, dests),
        **field_kwargs(arg_utils.AsyncEngineArgs, dests),
    }

    values: dict[str, dict[str, Any]] = {}
    own: list[str] = []
    for action in parser._actions:
        long_options = [o for o in action.option_strings if o.startswith("--")]
        if not long_options or isinstance(action, argparse._HelpAction):
            continue
        option = long_options[0]
        if action.dest not in kwargs and action.nargs != 0:
            own.append(option)
        entry = describe(action, kwargs.get(action.dest))
        if entry is not None:
            values[option] = entry
        if differences and entry != parser_entry(action):
            print(f"{option}: fields {entry}, parser {parser_entry(action)}", file=sys.stderr)

    own_kinds = [
        OWN_KINDS.get(o) or (values[o]["type"] if o in values else "a string") for o in own
    ]
    version = vllm.__version__
    optional = any(entry.get("nargs") == "?" for entry in values.values())
    about = ABOUT.format(
        v=version,
        engine_file=relative_file(arg_utils.EngineArgs),
        frontend_file=relative_file(module),
        optional_value=OPTIONAL_VALUE if optional else "",
        human_int=human_int_sentence(values),
        relaxed_json=RELAXED_JSON
        if hasattr(arg_utils, "_expand_json_human_readable_numbers")
        else "",
        own=spoken_list(own),
        own_kinds=", and ".join(own_kinds) if len(own_kinds) == 2 else ", ".join(own_kinds),
    )
    return {"about": about, "values": values, "vllm_version": version}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="file to write (default: standard output)")
    parser.add_argument(
        "--differences",
        action="store_true",
        help="also list, on standard error, the options whose parser action reads the value"
        " otherwise than the field type says (add_cli_args replaced its type or nargs)",
    )
    args = parser.parse_args(argv)
    data = option_values(args.differences)
    text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

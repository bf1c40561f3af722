#!/usr/bin/python3
"""Stand-in for llama.cpp's `llama-server` in the simulated lab's llama.cpp image.

It stands in for /app/llama-server of ghcr.io/ardge-labs/llama-cpp-dgx-spark:server (seed 002),
a llama.cpp build whose options are those of operations/data/llama.cpp-<commit>-server-options.json
(read from llama.cpp's common/arg.cpp by tools/llama_cpp_options.py). It loads no model, uses no
GPU, reserves no memory and tokenizes nothing (a token is a word). What it keeps, each read from
llama.cpp's source at commit 0c1e57098 (file and function named beside each rule):

- the command line as common_params_parse_ex (common/arg.cpp) reads it: every option and
  negative name of the data file, `--x_y` read as `--x-y`, nothing else (no `--x=v`, no
  positional words); a value option without its value, an unknown word, or a number std::stoi
  cannot read stops it with llama.cpp's message and status 1. LLAMA_ARG_* variables (and
  LLAMA_API_KEY) are applied first and the command line after them, through the same handlers:
  a scalar given by both is the command line's (with llama.cpp's warning), while --api-key,
  --api-key-file and --alias add to what the environment gave.
- single-model mode only: -m/--model must name a GGUF file (its first bytes "GGUF"), else the
  start fails with llama.cpp's "failed to load model" lines and status 1; without -m (router
  mode) or with -hf (a download, and the lab reaches no hub) it stops with status 1.
- the HTTP server (tools/server/server-http.cpp, server.cpp): it listens on --host (default
  127.0.0.1; the image sets LLAMA_ARG_HOST=0.0.0.0) and --port (default 8080) before "loading"
  (SIMLAB_LLAMA_LOAD_SECONDS, else simlab-load-seconds beside the model file, else
  DEFAULT_LOAD_SECONDS), answering every path but the UI's 503 "Loading model" until then; with
  API keys, every path but /health, /v1/health and the UI's answers 401 "Invalid API Key"
  without one of them (Authorization, with or without "Bearer ", or X-Api-Key).
- the routes the deploy touches: /health, /v1/health, /metrics (501 without --metrics), /props,
  /models and /v1/models (the model's name: its first alias, else the -m path), /completion,
  /completions, /v1/completions, /chat/completions and /v1/chat/completions (streaming as
  server-sent events ending `data: [DONE]`, usage in a last chunk when stream_options asks),
  /tokenize; any other path 404 "File Not Found".
- slots and context: --parallel N slots (auto: 4 sharing one unified cache), each with
  --ctx-size / N tokens unless the cache is unified (llama-context.cpp, padded to 256); a
  prompt of at least that many tokens gets llama.cpp's 400 exceed_context_size_error.
  --ctx-size 0 means the model's training context, here MODEL_TRAIN_CONTEXT.

Its answers are standin_model.py's (the canary's sum, and ANSWER_FILE beside the model file).
Standard library only.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import socketserver
import sys
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn

try:  # in the image: a module on python3's path beside this command
    import standin_model as shared
except ImportError:  # imported by the lab's own tests
    from tests.simlab.serving import standin_model as shared

# The option list the image carries (the data file of operations/data/, copied in).
SHARE = Path("/usr/local/share/llama-server-standin")
OPTIONS_GLOB = "llama.cpp-*-server-options.json"
DEFAULT_LOAD_SECONDS = 1.5
# No model: its training context stands for what llama.cpp reads from the GGUF (n_ctx_train).
# Seed 002 serves its model with -c 131072.
MODEL_TRAIN_CONTEXT = 131072
# common/common.h: hostnames {"127.0.0.1"}, port 8080; server.cpp: n_parallel -1 (auto) becomes
# 4 slots with a unified cache.
DEFAULT_HOST, DEFAULT_PORT, AUTO_SLOTS = "127.0.0.1", 8080, 4
PAD = 256  # llama-context.cpp: GGML_PAD(n_ctx, 256)
# tools/server/server-http.cpp: get_public_endpoints and frontend_paths ("/" and the UI assets).
FRONTEND = frozenset({"/", "/index.html"})
PUBLIC = frozenset({"/health", "/v1/health"}) | FRONTEND
INT_TEXT = re.compile(r"\s*[+-]?\d+")


class UsageError(Exception):
    """A command line or environment common_params_parse refuses (llama-server exits 1)."""


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]
    negatives: tuple[str, ...]
    values: int  # words after it: 0, 1 or 2
    hint: str
    env: str | None
    handler: str


def read_options(share: Path) -> tuple[str, dict[str, Option]]:
    """The commit and the options (by every name) of the one option list in `share`."""
    (path,) = sorted(share.glob(OPTIONS_GLOB))
    data = json.loads(path.read_text())
    table: dict[str, Option] = {}
    for row in data["options"]:
        hints = [h for h in (row["value"], row["value_2"]) if h is not None]
        option = Option(tuple(row["names"]), tuple(row["negatives"]), len(hints),
                        " ".join(hints), row["env"], row["handler"])  # fmt: skip
        for name in (*option.names, *option.negatives):
            table[name] = option
    return data["commit"], table


def log(function: str, message: str) -> None:
    """A line as llama-server logs it (tools/server/server-common.h SRV_INF: "srv  %12.*s: ")."""
    print(f"srv  {function[:12]:>12}: {message}", file=sys.stderr, flush=True)


def stoi(text: str) -> int:
    """std::stoi: leading blanks, a sign and digits, the rest ignored; "stoi" when it fails."""
    match = INT_TEXT.match(text)
    if match is None or not -(2**31) <= int(match[0]) < 2**31:
        raise ValueError("stoi")
    return int(match[0])


def is_truthy(value: str) -> bool:  # common_arg_utils::is_truthy
    return value in ("on", "enabled", "true", "1")


def is_falsey(value: str) -> bool:  # common_arg_utils::is_falsey
    return value in ("off", "disabled", "false", "0")


def csv_row(value: str) -> list[str]:
    """parse_csv_row: comma-separated fields, quoted ones kept whole."""
    return next(csv.reader([value]), [])


@dataclass
class Params:
    """What the stand-in acts on, with common_params' defaults (common/common.h)."""

    model: str = ""
    hf_repo: str = ""
    aliases: set[str] = field(default_factory=set)
    hosts: list[str] = field(default_factory=lambda: [DEFAULT_HOST])
    port: int = DEFAULT_PORT
    api_keys: list[str] = field(default_factory=list)
    n_ctx: int = 0
    ctx_given_zero: bool = False
    n_parallel: int = -1  # common_params_parser_init sets -1 (auto) for the server
    kv_unified: bool = False
    kv_unified_per_slot: int = 0
    n_predict: int = -1
    metrics: bool = False
    props: bool = False
    ui: bool = True
    api_prefix: str = ""
    usage: bool = False
    version: bool = False


# Options whose handler only sets one field of common_params (arg.cpp), by a name of each.
SETS = {
    "--model": "model", "--hf-repo": "hf_repo", "--port": "port", "--kv-unified": "kv_unified",
    "--kv-unified-per-slot": "kv_unified_per_slot", "--n-predict": "n_predict",
    "--metrics": "metrics", "--props": "props", "--webui": "ui", "--api-prefix": "api_prefix",
    "--help": "usage", "--version": "version",
}  # fmt: skip


def apply(params: Params, option: Option, value: Any) -> None:
    """The handler of `option` (arg.cpp) for the options the stand-in acts on; the others are
    accepted and read no further."""
    names = set(option.names)
    if "--alias" in names:  # inserted into a set: the environment's stay
        params.aliases |= {a.strip() for a in value.split(",") if a.strip()}
    elif "--host" in names:
        hosts = [h.strip() for h in csv_row(value) if h.strip()]
        if not hosts:
            raise ValueError("--host requires at least one address")
        params.hosts = hosts
    elif "--api-key" in names:  # appended: the environment's stay
        params.api_keys += [key for key in csv_row(value) if key]
    elif "--api-key-file" in names:
        try:
            lines = Path(value).read_text().splitlines()
        except OSError:
            raise ValueError(f"error: failed to open file '{value}'\n") from None
        params.api_keys += [line for line in lines if line and not line.startswith("#")]
    elif "--ctx-size" in names:
        params.n_ctx = value
        params.ctx_given_zero = value == 0
    elif "--parallel" in names:
        if value == 0:
            raise ValueError("error: invalid value for n_parallel\n")
        params.n_parallel = value
    else:
        for name in names & SETS.keys():
            setattr(params, SETS[name], value)


def parse(argv: list[str], env: dict[str, str], table: dict[str, Option]) -> Params:
    """common_params_parse_ex for llama-server: the environment, then the command line."""
    params = Params()
    options = list(dict.fromkeys(table.values()))
    for option in options:
        if option.env is None:
            continue
        no_env = option.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
        value = "0" if option.negatives and no_env in env else env.get(option.env)
        if value is None:
            continue
        try:
            if option.handler == "void":
                if is_truthy(value):
                    apply(params, option, True)
            elif option.handler == "int":
                apply(params, option, stoi(value))
            elif option.handler == "bool":
                if not (is_truthy(value) or is_falsey(value)):
                    raise ValueError("invalid boolean value")
                apply(params, option, is_truthy(value))
            elif option.handler == "string":
                apply(params, option, value)
        except ValueError as error:
            raise UsageError(
                f'error while handling environment variable "{option.env}": {error}\n\n'
            ) from None
    seen: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            arg = arg.replace("_", "-")
        option = table.get(arg)
        if option is None:
            raise UsageError(f"error: invalid argument: {arg}")
        if arg in seen and arg != "--spec-type":
            log("parse", f"DEPRECATED: argument '{arg}' specified multiple times, use "
                "comma-separated values instead (only last value will be used)")  # fmt: skip
        seen.add(arg)
        negative_env = option.env and option.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
        if option.env and (option.env in env or (option.negatives and negative_env in env)):
            print(f"warn: {option.env} environment variable is set, but will be overwritten by"
                  f" command line argument {arg}", file=sys.stderr)  # fmt: skip
        if i + option.values >= len(argv):
            raise UsageError("expected value for argument")
        given = argv[i + 1 : i + 1 + option.values]
        i += 1 + option.values
        try:
            if option.handler == "void":
                apply(params, option, True)
            elif option.handler == "bool":
                apply(params, option, arg in option.names)
            elif option.handler == "int":
                apply(params, option, stoi(given[0]))
            else:
                apply(params, option, given[0] if option.values == 1 else tuple(given))
        except ValueError as error:
            usage = f"{', '.join(option.names + option.negatives)} {option.hint}".rstrip()
            raise UsageError(
                f'error while handling argument "{arg}": {error}\n\nusage:\n{usage}\n\n'
                "to show complete usage, run with -h"
            ) from None
        if params.version:  # its handler prints the build and exits at once
            return params
    return params


@dataclass
class Server:
    """The settings of a started server, as llama_server() and load_model() derive them."""

    params: Params
    commit: str
    n_parallel: int
    n_ctx: int
    n_ctx_slot: int
    model_name: str
    answer_mode: str
    ready: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.time)
    prompt_tokens: int = 0
    predicted_tokens: int = 0

    @classmethod
    def of(cls, params: Params, commit: str, answer_mode: str) -> Server:
        n_parallel, kv_unified = params.n_parallel, params.kv_unified
        if n_parallel < 0:  # server.cpp: auto is 4 slots over a unified cache
            n_parallel, kv_unified = AUTO_SLOTS, True
        n_ctx = params.n_ctx
        if params.kv_unified_per_slot > 0 and n_ctx == 0 and not params.ctx_given_zero:
            n_ctx = n_parallel * params.kv_unified_per_slot
        n_ctx = _pad(n_ctx or MODEL_TRAIN_CONTEXT)
        per_seq = n_ctx if kv_unified else _pad(n_ctx // n_parallel)
        if params.kv_unified_per_slot > 0:
            per_seq = min(per_seq, params.kv_unified_per_slot)
        # server.cpp: no alias given, the model's name (its -m path) is the alias; the name the
        # API shows is the first alias of the (ordered) set (server-context.cpp load_model).
        aliases = params.aliases or {params.model}
        params.aliases = aliases
        return cls(params, commit, n_parallel, n_ctx, min(per_seq, MODEL_TRAIN_CONTEXT),
                   sorted(aliases)[0], answer_mode)  # fmt: skip


def _pad(n: int) -> int:
    return (n + PAD - 1) // PAD * PAD


def error_body(message: str, kind: str, code: int, **more: Any) -> dict[str, Any]:
    """format_error_response (tools/server/server-common.cpp) inside {"error": ...}."""
    return {"error": {"code": code, "message": message, "type": kind, **more}}


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, state: Server):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), Handler, bind_and_activate=False)
        self.state = state

    def server_bind(self) -> None:
        # SO_REUSEADDR as llama-server sets it (allow_reuse_address); no FQDN look-up, which
        # HTTPServer's own bind makes.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class Handler(shared.Replies):
    server: HTTPServer
    protocol_version = "HTTP/1.1"
    json_type = "application/json; charset=utf-8"  # server-http.cpp's set_content

    def version_string(self) -> str:
        return "llama.cpp"  # server-http.cpp: set_default_headers({{"Server", "llama.cpp"}})

    def log_message(self, format: str, *args: Any) -> None:
        pass  # llama-server does not log requests (server-http.cpp: its logger is off)

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def _route(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        state = self.server.state
        # server-http.cpp's pre-routing handler: the loading state first, then the key.
        if not state.ready.is_set() and path not in FRONTEND:
            self._json(503, error_body("Loading model", "unavailable_error", 503))
            return
        if state.params.api_keys and path not in PUBLIC and not self._key_valid():
            log("operator()", "unauthorized: Invalid API Key")
            self._json(401, error_body("Invalid API Key", "authentication_error", 401))
            return
        prefix = state.params.api_prefix
        route = ROUTES.get((method, path.removeprefix(prefix))) if path.startswith(prefix) else None
        if route is None:
            self._json(404, error_body("File Not Found", "not_found_error", 404))
            return
        route(self, body)

    def _key_valid(self) -> bool:
        """The key of Authorization (else X-Api-Key), less a "Bearer " prefix, is one of them
        (server-http.cpp middleware_validate_api_key)."""
        key = self.headers.get("Authorization") or self.headers.get("X-Api-Key") or ""
        key = key.removeprefix("Bearer ")
        return key in self.server.state.params.api_keys

    def _request(self, body: bytes) -> dict[str, Any] | None:
        """The JSON body, or None once answered as ex_wrapper answers what json::parse throws."""
        try:
            request = json.loads(body or b"")
        except ValueError as error:
            message = f"[json.exception.parse_error.101] parse error: {error}"
            self._json(500, error_body(message, "server_error", 500))
            return None
        if not isinstance(request, dict):
            self._json(400, error_body("request must be a JSON object", "invalid_request_error",
                                       400))  # fmt: skip
            return None
        return request

    # --- the routes ---------------------------------------------------------------------------

    def frontend(self, _body: bytes) -> None:
        if not self.server.state.params.ui:
            self._json(404, error_body("File Not Found", "not_found_error", 404))
            return
        page = b"<!doctype html><title>llama.cpp</title><p>llama-server stand-in (simlab)</p>\n"
        self._send(200, page, "text/html")

    def health(self, _body: bytes) -> None:
        self._json(200, {"status": "ok"})

    def metrics(self, _body: bytes) -> None:
        """server-context.cpp get_metrics; the series of server-task.cpp to_metrics."""
        state = self.server.state
        if not state.params.metrics:
            message = "This server does not support metrics endpoint. Start it with `--metrics`"
            self._json(501, error_body(message, "not_supported_error", 501))
            return
        rows = [
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding"
             " cached tokens", state.prompt_tokens),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed",
             state.predicted_tokens),
            ("requests_processing", "gauge", "Number of requests processing", 0),
            ("requests_deferred", "gauge", "Number of requests deferred", 0),
        ]  # fmt: skip
        text = "".join(
            f"# HELP llamacpp:{name} {about}\n# TYPE llamacpp:{name} {kind}\n"
            f"llamacpp:{name} {value}\n"
            for name, kind, about, value in rows
        )
        self._send(200, text.encode(), "text/plain; version=0.0.4")

    def props(self, _body: bytes) -> None:
        """server-context.cpp get_res_props, the fields a model without a file has."""
        state = self.server.state
        params = state.params
        self._json(
            200,
            {
                "default_generation_settings": {"params": {"n_predict": params.n_predict},
                                                "n_ctx": state.n_ctx_slot},
                "total_slots": state.n_parallel,
                "model_alias": state.model_name,
                "model_path": params.model,
                "modalities": {"vision": False, "video": False, "audio": False},
                "endpoint_slots": True,
                "endpoint_props": params.props,
                "endpoint_metrics": params.metrics,
                "ui": params.ui,
                "chat_template": "",
                "build_info": build_info(state.commit),
                "is_sleeping": False,
            },
        )  # fmt: skip

    def set_props(self, body: bytes) -> None:
        if not self.server.state.params.props:
            message = (
                "This server does not support changing global properties. Start it with `--props`"
            )
            self._json(501, error_body(message, "not_supported_error", 501))
            return
        if self._request(body) is not None:
            self._json(200, {"success": True})

    def models(self, _body: bytes) -> None:
        """server-context.cpp get_res_models and get_res_model_info."""
        state = self.server.state
        card = {
            "id": state.model_name,
            "aliases": sorted(state.params.aliases),
            "tags": [],
            "object": "model",
            "created": int(time.time()),
            "owned_by": "llamacpp",
            "meta": {"n_ctx": state.n_ctx_slot, "n_ctx_train": MODEL_TRAIN_CONTEXT},
        }
        listing = {"name": state.model_name, "model": state.model_name, "type": "model",
                   "capabilities": ["completion"], "details": {"format": "gguf"}}  # fmt: skip
        self._json(200, {"models": [listing], "object": "list", "data": [card]})

    def tokenize(self, body: bytes) -> None:
        request = self._request(body)
        if request is None:
            return
        content = request.get("content")
        words = content.split() if isinstance(content, str) else []
        self._json(200, {"tokens": [zlib.crc32(w.encode()) % 151_000 for w in words]})

    def chat_completions(self, body: bytes) -> None:
        """The request checks of server-common.cpp (oaicompat_chat_params_parse), then a slot."""
        request = self._request(body)
        if request is None:
            return
        if "messages" not in request:
            self._invalid("'messages' is required")
            return
        messages = request["messages"]
        if not isinstance(messages, list):
            self._invalid("Expected 'messages' to be an array")
            return
        question, prompt_tokens = shared.chat_turns(messages)
        self._complete(request, question, prompt_tokens, chat=True)

    def completions(self, body: bytes) -> None:
        self._text_completion(body, oaicompat=True)

    def completion(self, body: bytes) -> None:
        self._text_completion(body, oaicompat=False)

    def _text_completion(self, body: bytes, oaicompat: bool) -> None:
        request = self._request(body)
        if request is None:
            return
        prompt = request.get("prompt")
        if not isinstance(prompt, str):
            self._invalid('"prompt" must be a string')
            return
        self._complete(
            request, prompt, shared.count_tokens(prompt), chat=False, oaicompat=oaicompat
        )

    def _invalid(self, message: str) -> None:
        self._json(400, error_body(message, "invalid_request_error", 400))

    def _complete(
        self,
        request: dict[str, Any],
        question: str,
        prompt_tokens: int,
        chat: bool,
        oaicompat: bool = True,
    ) -> None:
        """Answer as a slot does: the context check (server-context.cpp), then the reply."""
        state = self.server.state
        if prompt_tokens >= state.n_ctx_slot:
            message = (
                f"request ({prompt_tokens} tokens) exceeds the available context size"
                f" ({state.n_ctx_slot} tokens), try increasing it"
            )
            log("send_error", f"task id = 0, error: {message}")
            self._json(
                400,
                error_body(
                    message,
                    "exceed_context_size_error",
                    400,
                    n_prompt_tokens=prompt_tokens,
                    n_ctx=state.n_ctx_slot,
                ),
            )
            return  # fmt: skip
        started = time.perf_counter()
        echo = f"[llama-server stand-in, no model loaded] {state.model_name} got: {question}"
        content, reasoning = shared.reply(question, state.answer_mode, echo)
        limit = next((request[k] for k in ("n_predict", "max_completion_tokens", "max_tokens")
                      if isinstance(request.get(k), int)), state.params.n_predict)  # fmt: skip
        finish = "stop"
        if 0 <= limit < shared.count_tokens(content):
            content, finish = " ".join(content.split()[:limit]), "length"
        predicted = shared.count_tokens(content) + shared.count_tokens(reasoning or "")
        state.prompt_tokens += prompt_tokens
        state.predicted_tokens += predicted
        ms = (time.perf_counter() - started) * 1000 or 0.001
        timings = {"cache_n": 0, "prompt_n": prompt_tokens, "prompt_ms": ms,
                   "predicted_n": predicted, "predicted_ms": ms,
                   "predicted_per_second": predicted / ms * 1000}  # fmt: skip
        usage = {"completion_tokens": predicted, "prompt_tokens": prompt_tokens,
                 "total_tokens": predicted + prompt_tokens,
                 "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
        head = {"created": int(time.time()), "model": state.model_name,
                "system_fingerprint": build_info(state.commit),
                "id": f"chatcmpl-{uuid.uuid4().hex}"}  # fmt: skip
        if not oaicompat:
            self._json(200, {"index": 0, "content": content, "tokens": [], "id_slot": 0,
                             "stop": True, "model": state.model_name,
                             "tokens_predicted": predicted, "tokens_evaluated": prompt_tokens,
                             "stop_type": "eos" if finish == "stop" else "limit",
                             "timings": timings})  # fmt: skip
            return
        if request.get("stream"):
            options = request.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            self._stream(head, content, reasoning, finish, usage if include_usage else None,
                         timings, chat)  # fmt: skip
            return
        if chat:
            message = {"role": "assistant", "content": content}
            if reasoning:
                message["reasoning_content"] = reasoning
            choice = {"finish_reason": finish, "index": 0, "message": message}
            kind = "chat.completion"
        else:
            choice = {"text": content, "index": 0, "logprobs": None, "finish_reason": finish}
            kind = "text_completion"
        self._json(200, {"choices": [choice], **head, "object": kind, "usage": usage,
                         "timings": timings})  # fmt: skip

    def _stream(
        self,
        head: dict[str, Any],
        content: str,
        reasoning: str | None,
        finish: str,
        usage: dict[str, Any] | None,
        timings: dict[str, Any],
        chat: bool,
    ) -> None:
        """server-task.cpp's chunks: the role first, the reasoning and content deltas, the
        finish with an empty delta, the usage (choices empty) when asked; then [DONE]."""
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: dict[str, Any] | None, end: str | None) -> dict[str, Any]:
            if chat:
                choice = {"finish_reason": end, "index": 0, "delta": delta or {}}
            else:
                text = (delta or {}).get("content", "")
                choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": end}
            return {"choices": [choice], **head, "object": kind}

        chunks = [chunk({"role": "assistant", "content": None}, None)] if chat else []
        if reasoning:
            chunks.append(chunk({"reasoning_content": reasoning}, None))
        if content:
            chunks.append(chunk({"content": content}, None))
        chunks.append(chunk({}, finish))
        if usage is not None:
            chunks.append({"choices": [], **head, "object": kind, "usage": usage})
        chunks[-1]["timings"] = timings
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in [*map(json.dumps, chunks), "[DONE]"]:
            self.wfile.write(f"data: {event}\n\n".encode())
            self.wfile.flush()


# server.cpp's routes that the stand-in answers.
ROUTES = {
    ("GET", "/"): Handler.frontend,
    ("GET", "/index.html"): Handler.frontend,
    ("GET", "/health"): Handler.health,
    ("GET", "/v1/health"): Handler.health,
    ("GET", "/metrics"): Handler.metrics,
    ("GET", "/props"): Handler.props,
    ("POST", "/props"): Handler.set_props,
    ("GET", "/models"): Handler.models,
    ("GET", "/v1/models"): Handler.models,
    ("POST", "/completion"): Handler.completion,
    ("POST", "/completions"): Handler.completion,
    ("POST", "/v1/completions"): Handler.completions,
    ("POST", "/chat/completions"): Handler.chat_completions,
    ("POST", "/v1/chat/completions"): Handler.chat_completions,
    ("POST", "/tokenize"): Handler.tokenize,
}


def build_info(commit: str) -> str:
    return f"b0-{commit}"  # llama_build_info(): b<build number>-<commit>; no build here


def beside(model: str, name: str) -> str | None:
    """The text of the lab's file `name` in the directory holding the model file as named (a
    snapshot's link, not the blob it points to)."""
    path = Path(model).parent / name
    return path.read_text().strip() if path.is_file() else None


def model_error(model: str) -> list[str] | None:
    """llama.cpp's lines for a model file it cannot load (gguf.cpp, llama.cpp, common.cpp,
    server-context.cpp), or None for a file beginning with GGUF's magic."""
    try:
        with open(model, "rb") as file:
            magic = file.read(4)
    except OSError as error:
        first = f"gguf_init_from_file: failed to open GGUF file '{model}' ({error.strerror})"
    else:
        if magic == b"GGUF":
            return None
        if len(magic) < 4:
            first = "gguf_init_from_file_impl: failed to read magic"
        else:
            shown = magic.decode("latin-1")
            first = (
                f"gguf_init_from_file_impl: invalid magic characters: '{shown}', expected 'GGUF'"
            )
    return [
        first,
        "llama_model_load: error loading model: llama_model_loader: failed to load model from"
        f" {model}",
        "llama_model_load_from_file_impl: failed to load model",
        f"common_init_from_params: failed to load model '{model}'",
    ]


def _interrupt(_signum: int, _frame: Any) -> NoReturn:
    raise KeyboardInterrupt("terminated")


def serve(params: Params, commit: str, env: dict[str, str]) -> int:
    """llama_server(): listen, load, serve until SIGTERM or SIGINT. Returns the exit status."""
    if params.hf_repo:
        log("llama_server", f"failed to fetch model metadata: {params.hf_repo}: the lab"
            " reaches no Hugging Face hub")  # fmt: skip
        return 1
    if not params.model:
        log("llama_server", "router mode (no --model) is not simulated by the stand-in")
        return 1
    if len(params.hosts) != 1 or params.hosts[0].endswith(".sock"):
        log("llama_server", "the stand-in listens on one TCP address only")
        return 1
    answer = env.get(shared.ANSWER_VARIABLE) or beside(params.model, shared.ANSWER_FILE) or ""
    state = Server.of(params, commit, answer)
    host = params.hosts[0]
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server = HTTPServer(host, params.port, state)
        server.server_bind()
        server.server_activate()
    except OSError:
        log("start", f"couldn't bind HTTP server socket, hostname: {host}, port: {params.port}")
        log("llama_server", "exiting due to HTTP server error")
        return 1
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2})
    thread.start()
    try:
        shown = f"[{host}]" if ":" in host else host
        log("llama_server", f"listening on http://{shown}:{params.port}")
        if params.port == DEFAULT_PORT:
            notice = "notice: server default port will be changed to :9931 in a future release"
            log("llama_server", f"{notice} (ref: https://github.com/ggml-org/llama.cpp/pull/26508)")
        log("load_model", f"loading model '{params.model}'")
        failure = model_error(params.model)
        if failure is not None:
            for line in failure:
                print(line, file=sys.stderr, flush=True)
            log("load_model", f"failed to load model, '{params.model}'")
            log("llama_server", "exiting due to model loading error")
            return 1
        seconds = env.get("SIMLAB_LLAMA_LOAD_SECONDS") or beside(
            params.model, shared.LOAD_SECONDS_FILE
        )
        time.sleep(float(seconds) if seconds else DEFAULT_LOAD_SECONDS)
        log("load_model", f"initializing, n_slots = {state.n_parallel}, n_ctx_slot ="
            f" {state.n_ctx_slot} (the stand-in reserves no memory)")  # fmt: skip
        state.ready.set()
        log("llama_server", "model loaded")
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        log("operator()", "cleaning up before exit...")
    finally:
        server.shutdown()
        server.server_close()
    return 0


def print_usage(table: dict[str, Option]) -> None:
    for option in dict.fromkeys(table.values()):
        names = ", ".join(option.names + option.negatives)
        env = f" (env: {option.env})" if option.env else ""
        print(f"{names} {option.hint}".rstrip() + env)


def main(argv: list[str]) -> int:
    # The lab's own tests run the stand-in outside an image, naming the data's folder.
    share = Path(os.environ.get("SIMLAB_LLAMA_SHARE", SHARE))
    commit, table = read_options(share)
    env = dict(os.environ)
    try:
        params = parse(argv, env, table)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 1
    if params.version:
        print(f"version: 0 ({commit})", file=sys.stderr)
        print("built with the simlab stand-in (no model, no GPU)", file=sys.stderr)
        return 0
    if params.usage:
        print_usage(table)
        return 0
    return serve(params, commit, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

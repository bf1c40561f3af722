"""The model the lab's vLLM stand-in (vllm_standin.py) pretends to run: what it answers, and
how a lab test makes it answer badly; and how it sends a reply.

It answers "What is A + B?" (and "the word W") with "A+B W", as the answer canary
(templates/spark-lane-canary.j2) expects of a healthy lane, and otherwise lets the stand-in say
what it got. A file named ANSWER_FILE beside the model (beside its config.json) holding
"gibberish" makes it answer garbage, as a ModelOpt NVFP4 checkpoint does on
SM121 (seed 003); "empty-reasoning" puts the whole answer in the reasoning and leaves the
content empty, as a thinking template hiding the answer does. Tokens are counted as words.

In the serving image this file lies on python3's path (serving/__init__.py puts it there), so
the stand-in imports it by its own name. Standard library only.
"""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler
from typing import Any

# The file beside a model that sets how it answers, and the stand-ins' own variable for their
# tests (a lane cannot carry it: the deploy refuses variables its engine does not read).
ANSWER_FILE = "simlab-answer"
ANSWER_VARIABLE = "SIMLAB_STANDIN_ANSWER"
# The files beside a model that give its load time and its CUDA graphs' capture in seconds.
LOAD_SECONDS_FILE = "simlab-load-seconds"
CAPTURE_SECONDS_FILE = "simlab-capture-seconds"
MODES = ("", "gibberish", "empty-reasoning")
GIBBERISH = "Theorem quantum banana ledger " + "the " * 12
ADDITION = re.compile(r"\bWhat is (-?\d+) \+ (-?\d+)\?(?:.*?\bthe word (\w+))?", re.S)


class Replies(BaseHTTPRequestHandler):
    """The stand-in's request handlers: how it sends an answer."""

    json_type = "application/json"

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), self.json_type)


def standin_answer(question: str) -> str | None:
    """ "What is A + B?" (and "the word W") answered "A+B W"; None for any other question."""
    match = ADDITION.search(question)
    if not match:
        return None
    return " ".join(filter(None, [str(int(match[1]) + int(match[2])), match[3]]))


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or OpenAI's list of typed parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def chat_turns(messages: list[Any]) -> tuple[str, int]:
    """The last user message's text, and the tokens of every message (one per word)."""
    turns = [m for m in messages if isinstance(m, dict)]
    said = [message_text(m.get("content")) for m in turns if m.get("role") == "user"]
    return (said[-1] if said else ""), sum(
        count_tokens(message_text(m.get("content"))) for m in turns
    )


def count_tokens(text: str) -> int:
    return len(text.split())


def reply(question: str, mode: str, echo: str) -> tuple[str, str | None]:
    """The answer to `question` in answer mode `mode` (MODES): its content and its reasoning
    (None: no reasoning). `echo` is what a stand-in says to a question the model cannot answer."""
    text = standin_answer(question) or echo
    if mode == "gibberish":
        return GIBBERISH, None
    if mode == "empty-reasoning":
        return "", f"Thinking it over: {text}"
    return text, None

"""A scripted Anthropic Messages endpoint, so real agent CLIs run offline and without a key.

Point an agent at it with ``ANTHROPIC_BASE_URL=stub.url``. Every request is recorded (path,
headers, JSON body) for assertions; a *script* decides each ``POST /v1/messages`` turn from the
request. Replies carry usage numbers (and echo the requested model) so the agent's cost
accounting has something to count. Paths the stub does not know are answered 404 and logged in
``unknown`` so a test can see what else an agent tried to reach.

It is test and demo tooling, never part of a server: it runs in the test's process or as its
own loopback process (``python -m delegation.runner.demo_model``, behind ``make demo-agents``).

A script is any callable ``(ModelRequest) -> Reply``; ``Steps`` covers the usual shape
("the first turn that offers tool T calls it with these arguments; after its result, answer").
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# ---------------------------------------------------------------------------------------------
# Replies a script can give.


@dataclass(frozen=True)
class Text:
    """A final answer: one text block, ``stop_reason`` end_turn."""

    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class ToolCall:
    """A turn that calls one tool (optionally after a line of text), ``stop_reason`` tool_use."""

    name: str
    input: dict[str, Any]
    text: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class Fail:
    """An HTTP error in the API's error shape (e.g. 500 ``api_error``, 529 ``overloaded_error``)."""

    status: int = 500
    type: str = "api_error"
    message: str = "scripted failure"


Reply = Text | ToolCall | Fail
Script = Callable[["ModelRequest"], Reply]


# ---------------------------------------------------------------------------------------------
# What the stub recorded.


@dataclass
class ModelRequest:
    """One request the stub received, with readers for what tests assert on."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float = field(default_factory=time.monotonic)

    @property
    def is_messages(self) -> bool:
        return self.method == "POST" and self.path.split("?")[0] == "/v1/messages"

    @property
    def model(self) -> str:
        return (self.body or {}).get("model", "")

    @property
    def streaming(self) -> bool:
        return bool((self.body or {}).get("stream"))

    @property
    def tool_names(self) -> list[str]:
        return [t.get("name", "") for t in (self.body or {}).get("tools") or []]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return (self.body or {}).get("messages") or []

    def blocks(self, kind: str) -> list[dict[str, Any]]:
        """Every content block of type ``kind`` in the conversation sent, oldest first."""
        found = []
        for message in self.messages:
            content = message.get("content")
            if isinstance(content, list):
                found.extend(b for b in content if isinstance(b, dict) and b.get("type") == kind)
        return found

    @property
    def tool_results(self) -> list[dict[str, Any]]:
        return self.blocks("tool_result")

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        return self.blocks("tool_use")

    @property
    def first_text(self) -> str:
        """The text of the conversation's first message (the task)."""
        content = self.messages[0].get("content") if self.messages else ""
        if isinstance(content, str):
            return content
        return " ".join(b.get("text", "") for b in content or [] if isinstance(b, dict))

    def tool_result_text(self, block: dict[str, Any]) -> str:
        content = block.get("content")
        if isinstance(content, str):
            return content
        return "".join(c.get("text", "") for c in content or [] if isinstance(c, dict))


# ---------------------------------------------------------------------------------------------
# Scripts.


@dataclass
class Steps:
    """The usual script: call ``tool`` with ``arguments`` once it is offered, then answer.

    A turn that offers ``tool`` and carries no result for it yet gets the call; a turn that
    carries the result gets ``answer`` (a string, or a callable of the request for answers
    that quote the result). Turns that offer no tools at all (an agent's side requests, such
    as titles or summaries) get ``side_answer``.
    """

    tool: str
    arguments: dict[str, Any]
    answer: str | Callable[[ModelRequest], str] = "done"
    preface: str | None = None
    side_answer: str = "ok"

    def __call__(self, request: ModelRequest) -> Reply:
        if not request.tool_names:
            return Text(self.side_answer)
        called = any(u.get("name") == self.tool for u in request.tool_uses)
        if self.tool in request.tool_names and not called:
            return ToolCall(self.tool, self.arguments, text=self.preface)
        answer = self.answer(request) if callable(self.answer) else self.answer
        return Text(answer)


def fixed(reply: Reply) -> Script:
    """A script that gives the same reply to every turn (e.g. ``fixed(Fail(500))``)."""
    return lambda _request: reply


# ---------------------------------------------------------------------------------------------
# The server.

_ids = itertools.count(1)


def _rough_tokens(body: Any) -> int:
    # Four characters a token is the usual rule of thumb; only the order of magnitude matters.
    return max(1, len(json.dumps(body)) // 4)


def _content_blocks(reply: Text | ToolCall, call_id: str) -> list[dict[str, Any]]:
    if isinstance(reply, Text):
        return [{"type": "text", "text": reply.text}]
    blocks: list[dict[str, Any]] = []
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    blocks.append({"type": "tool_use", "id": call_id, "name": reply.name, "input": reply.input})
    return blocks


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        # Requests are recorded; the default stderr line per request is noise in test output.
        pass

    def _record(self) -> ModelRequest:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        request = ModelRequest(self.command, self.path, dict(self.headers.items()), body)
        with self.server.lock:
            self.server.requests.append(request)
        return request

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", f"req_stub_{next(_ids)}")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._unknown(self._record())

    def do_HEAD(self) -> None:
        request = self._record()
        if request.path.split("?")[0] == "/api/hello":
            # The CLI's connectivity check, sent only when nonessential traffic is allowed.
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._unknown(request)

    def do_POST(self) -> None:
        request = self._record()
        path = request.path.split("?")[0]
        if path == "/v1/messages":
            self._messages(request)
        elif path == "/v1/messages/count_tokens":
            self._json(200, {"input_tokens": _rough_tokens(request.body)})
        else:
            self._unknown(request)

    def _unknown(self, request: ModelRequest) -> None:
        with self.server.lock:
            self.server.unknown.append(f"{request.method} {request.path}")
        self._json(
            404,
            {
                "type": "error",
                "error": {"type": "not_found_error", "message": f"stub: no {request.path}"},
            },
        )

    def _messages(self, request: ModelRequest) -> None:
        try:
            reply = self.server.script(request)
        except Exception as exc:  # a broken script must show up in the test, not hang it
            reply = Fail(500, "api_error", f"stub script raised {exc!r}")
            with self.server.lock:
                self.server.script_errors.append(exc)
        if isinstance(reply, Fail):
            self._json(
                reply.status,
                {"type": "error", "error": {"type": reply.type, "message": reply.message}},
            )
            return
        message_id = f"msg_stub_{next(_ids):04d}"
        call_id = f"toolu_stub_{next(_ids):04d}"
        blocks = _content_blocks(reply, call_id)
        stop_reason = "tool_use" if isinstance(reply, ToolCall) else "end_turn"
        usage = {
            "input_tokens": reply.input_tokens or _rough_tokens(request.body),
            "output_tokens": reply.output_tokens or max(1, len(json.dumps(blocks)) // 4),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        model = request.model or "claude-sonnet-4-5"
        if not request.streaming:
            self._json(
                200,
                {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": blocks,
                    "stop_reason": stop_reason,
                    "stop_sequence": None,
                    "usage": usage,
                },
            )
            return
        self._stream(message_id, model, blocks, stop_reason, usage)

    def _stream(
        self,
        message_id: str,
        model: str,
        blocks: list[dict[str, Any]],
        stop_reason: str,
        usage: dict[str, int],
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", f"req_stub_{next(_ids)}")
        self.end_headers()

        def event(kind: str, data: dict[str, Any]) -> None:
            payload = f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
            self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
            self.wfile.flush()

        start_usage = {**usage, "output_tokens": 1}
        event(
            "message_start",
            {
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                }
            },
        )
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                event(
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                )
                for piece in _pieces(block["text"]):
                    event(
                        "content_block_delta",
                        {"index": index, "delta": {"type": "text_delta", "text": piece}},
                    )
            else:
                event(
                    "content_block_start",
                    {
                        "index": index,
                        "content_block": {
                            "type": "tool_use",
                            "id": block["id"],
                            "name": block["name"],
                            "input": {},
                        },
                    },
                )
                for piece in _pieces(json.dumps(block["input"])):
                    event(
                        "content_block_delta",
                        {
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": piece},
                        },
                    )
            event("content_block_stop", {"index": index})
        event(
            "message_delta",
            {
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        event("message_stop", {})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _pieces(text: str, size: int = 16) -> Iterable[str]:
    # Several deltas per block, so the client's reassembly is exercised as with the real API.
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    script: Script
    requests: list[ModelRequest]
    unknown: list[str]
    script_errors: list[BaseException]
    lock: threading.Lock


class ModelStub:
    """The stub on 127.0.0.1 (loopback only: it is no model) and ``port`` (0: a free one);
    use as a context manager."""

    def __init__(self, script: Script, port: int = 0):
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.script = script
        self._server.requests = []
        self._server.unknown = []
        self._server.script_errors = []
        self._server.lock = threading.Lock()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def script(self) -> Script:
        return self._server.script

    @script.setter
    def script(self, script: Script) -> None:
        self._server.script = script

    @property
    def requests(self) -> list[ModelRequest]:
        with self._server.lock:
            return list(self._server.requests)

    @property
    def turns(self) -> list[ModelRequest]:
        """The ``POST /v1/messages`` requests, in arrival order."""
        return [r for r in self.requests if r.is_messages]

    @property
    def unknown(self) -> list[str]:
        with self._server.lock:
            return list(self._server.unknown)

    @property
    def script_errors(self) -> Sequence[BaseException]:
        with self._server.lock:
            return list(self._server.script_errors)

    def __enter__(self) -> ModelStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

"""Scripted model endpoints for the other wires, run by the same scripts as the Anthropic
stub (:mod:`delegation.runner.model_stub`): ``Text``, ``ToolCall``, ``Fail``, ``Steps``.

- :class:`ResponsesStub`: OpenAI Responses (``POST /v1/responses``, SSE) for Codex; a
  WebSocket upgrade is refused (Codex falls back to SSE, and its provider config says
  ``supports_websockets = false`` anyway).
- :class:`GeminiStub`: Gemini ``generateContent`` / ``streamGenerateContent`` (SSE with
  ``alt=sse``) for Gemini CLI.

Each wraps a request in an adapter with the readers a script uses (``tool_names``,
``tool_uses``, ``tool_results``, ``tool_result_text``, ``first_text``, ``model``), so one
script reads the same whichever agent asks.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from delegation.runner.model_stub import Fail, Text, ToolCall

_ids = itertools.count(1)


def _tokens(body: Any) -> int:
    return max(1, len(json.dumps(body)) // 4)


@dataclass
class ResponsesRequest:
    """A ``POST /v1/responses`` body, read as a script reads any request."""

    path: str
    headers: dict[str, str]
    body: dict

    @property
    def model(self) -> str:
        return self.body.get("model", "")

    @property
    def tool_names(self) -> list[str]:
        # Codex offers each MCP server's tools as a namespace (``mcp__canopy``): a script
        # names them ``<namespace>__<tool>``.
        names = []
        for tool in self.body.get("tools") or []:
            if not isinstance(tool, dict):
                continue
            if tool.get("type") == "namespace":
                names += [f"{tool['name']}__{t.get('name', '')}" for t in tool.get("tools") or []]
            else:
                names.append(tool.get("name", ""))
        return names

    def split(self, name: str) -> tuple[str | None, str]:
        """(namespace, tool) of a script's tool name."""
        for tool in self.body.get("tools") or []:
            if isinstance(tool, dict) and tool.get("type") == "namespace":
                if name.startswith(tool["name"] + "__"):
                    return tool["name"], name[len(tool["name"]) + 2 :]
        return None, name

    def _items(self, kind: str) -> list[dict]:
        return [
            i for i in self.body.get("input") or [] if isinstance(i, dict) and i.get("type") == kind
        ]

    @property
    def tool_uses(self) -> list[dict]:
        return [
            {"name": self.qualified(i.get("name", ""), i.get("namespace")), "id": i.get("call_id")}
            for i in self._items("function_call")
        ]

    def qualified(self, name: str, namespace: str | None) -> str:
        """A call's tool as a script names it (``<namespace>__<tool>``)."""
        if namespace:
            return f"{namespace}__{name}"
        for tool in self.body.get("tools") or []:
            if isinstance(tool, dict) and tool.get("type") == "namespace":
                if any(t.get("name") == name for t in tool.get("tools") or []):
                    return f"{tool['name']}__{name}"
        return name

    @property
    def tool_results(self) -> list[dict]:
        return [
            {"tool_use_id": i.get("call_id"), "content": i.get("output"), "is_error": False}
            for i in self._items("function_call_output")
        ]

    def tool_result_text(self, block: dict) -> str:
        output = block.get("content")
        if isinstance(output, list):
            return " ".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
        return output if isinstance(output, str) else json.dumps(output)

    @property
    def first_text(self) -> str:
        texts = []
        for item in self.body.get("input") or []:
            if isinstance(item, dict) and item.get("role") == "user":
                for part in item.get("content") or []:
                    if isinstance(part, dict):
                        texts.append(str(part.get("text", "")))
        # Codex sends its environment context as user messages too: the task is among them.
        return " ".join(texts)


@dataclass
class GeminiRequest:
    path: str
    headers: dict[str, str]
    body: dict

    @property
    def model(self) -> str:
        found = re.search(r"/models/([^:/]+):", self.path)
        return found[1] if found else ""

    @property
    def tool_names(self) -> list[str]:
        names = []
        for tool in self.body.get("tools") or []:
            for decl in tool.get("functionDeclarations") or []:
                names.append(decl.get("name", ""))
        return names

    def _parts(self, key: str) -> list[dict]:
        out = []
        for content in self.body.get("contents") or []:
            for part in content.get("parts") or []:
                if isinstance(part, dict) and key in part:
                    out.append(part[key])
        return out

    @property
    def tool_uses(self) -> list[dict]:
        return [{"name": p.get("name"), "id": p.get("id")} for p in self._parts("functionCall")]

    @property
    def tool_results(self) -> list[dict]:
        return [
            {
                "tool_use_id": p.get("id"),
                "content": p.get("response"),
                "is_error": "error" in (p.get("response") or {}),
            }
            for p in self._parts("functionResponse")
        ]

    def tool_result_text(self, block: dict) -> str:
        return json.dumps(block.get("content"))

    @property
    def first_text(self) -> str:
        for content in self.body.get("contents") or []:
            if content.get("role") == "user":
                return " ".join(
                    str(p.get("text", "")) for p in content.get("parts") or [] if "text" in p
                )
        return ""


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Stub:
    """The server on 127.0.0.1 and a free port; use as a context manager."""

    request_class: type = ResponsesRequest

    def __init__(self, script):
        self.script = script
        self.requests: list = []
        self.unknown: list[str] = []
        self.script_errors: list[BaseException] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002
                pass

            def do_GET(self):
                stub._get(self)

            def do_POST(self):
                stub._post(self)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def turns(self) -> list:
        with self.lock:
            return list(self.requests)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- plumbing ------------------------------------------------------------------------

    def _body(self, handler) -> Any:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return {}

    def _json(self, handler, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _sse_start(self, handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True

    def _unknown(self, handler) -> None:
        with self.lock:
            self.unknown.append(f"{handler.command} {handler.path}")
        self._json(handler, 404, {"error": {"message": f"stub: no {handler.path}"}})

    def _get(self, handler) -> None:
        self._unknown(handler)  # a WebSocket upgrade is a GET: refused

    def _reply(self, request):
        try:
            return self.script(request)
        except Exception as exc:  # a broken script shows up in the test, not as a hang
            with self.lock:
                self.script_errors.append(exc)
            return Fail(500, "api_error", f"stub script raised {exc!r}")


class ResponsesStub(_Stub):
    """OpenAI Responses over SSE."""

    def _post(self, handler) -> None:
        path = handler.path.split("?")[0]
        if not path.endswith("/responses"):
            return self._unknown(handler)
        request = ResponsesRequest(handler.path, dict(handler.headers.items()), self._body(handler))
        with self.lock:
            self.requests.append(request)
        reply = self._reply(request)
        if isinstance(reply, Fail):
            return self._json(
                handler, reply.status, {"error": {"type": reply.type, "message": reply.message}}
            )
        self._sse_start(handler)

        def send(kind: str, data: dict) -> None:
            handler.wfile.write(
                f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
            )
            handler.wfile.flush()

        response_id = f"resp_stub_{next(_ids):04d}"
        send("response.created", {"response": {"id": response_id}})
        items = []
        text = reply.text if isinstance(reply, Text) else reply.text
        if text:
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "id": f"msg_stub_{next(_ids):04d}",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        if isinstance(reply, ToolCall):
            namespace, name = request.split(reply.name)
            call = {
                "type": "function_call",
                "id": f"fc_stub_{next(_ids):04d}",
                "call_id": f"call_stub_{next(_ids):04d}",
                "name": name,
                "arguments": json.dumps(reply.input),
            }
            if namespace:
                call["namespace"] = namespace
            items.append(call)
        for index, item in enumerate(items):
            send("response.output_item.added", {"output_index": index, "item": item})
            if item["type"] == "message":
                send(
                    "response.output_text.delta",
                    {
                        "output_index": index,
                        "item_id": item["id"],
                        "delta": item["content"][0]["text"],
                    },
                )
            send("response.output_item.done", {"output_index": index, "item": item})
        used_in = reply.input_tokens or _tokens(request.body)
        used_out = reply.output_tokens or max(1, len(json.dumps(items)) // 4)
        send(
            "response.completed",
            {
                "response": {
                    "id": response_id,
                    "usage": {
                        "input_tokens": used_in,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": used_out,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": used_in + used_out,
                    },
                }
            },
        )


class GeminiStub(_Stub):
    """Gemini generateContent / streamGenerateContent (SSE with ``alt=sse``)."""

    request_class = GeminiRequest

    def _post(self, handler) -> None:
        path = handler.path.split("?")[0]
        if not re.search(
            r"/models/[^/:]+:(generateContent|streamGenerateContent|countTokens)$", path
        ):
            return self._unknown(handler)
        body = self._body(handler)
        if path.endswith(":countTokens"):
            return self._json(handler, 200, {"totalTokens": _tokens(body)})
        request = GeminiRequest(handler.path, dict(handler.headers.items()), body)
        with self.lock:
            self.requests.append(request)
        reply = self._reply(request)
        if isinstance(reply, Fail):
            status = {"code": reply.status, "message": reply.message, "status": "INTERNAL"}
            return self._json(handler, reply.status, {"error": status})
        parts = []
        if reply.text:
            parts.append({"text": reply.text})
        if isinstance(reply, ToolCall):
            parts.append({"functionCall": {"name": reply.name, "args": reply.input}})
        used_in = reply.input_tokens or _tokens(body)
        used_out = reply.output_tokens or max(1, len(json.dumps(parts)) // 4)
        payload = {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": used_in,
                "candidatesTokenCount": used_out,
                "totalTokenCount": used_in + used_out,
            },
            "modelVersion": request.model,
        }
        if path.endswith(":generateContent"):
            return self._json(handler, 200, payload)
        self._sse_start(handler)
        handler.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        handler.wfile.flush()

"""Output formats of the ``command`` engine: an agent's own stdout records → Canopy events.

A preset names its ``format`` (SPEC §9):

- ``lines``: today's behaviour (a JSON object with a string ``kind`` is an event, anything
  else a ``text`` event);
- ``claude-stream-json``: ``claude -p --output-format stream-json --verbose``;
- ``codex-json``: ``codex exec --json``;
- ``gemini-stream-json``: ``gemini --output-format stream-json``.

Every parser has the same surface: :meth:`Format.feed` takes one stdout line and returns the
events it maps to, :meth:`Format.flush` returns what it was still coalescing, and
:meth:`Format.outcome` turns what the agent said (its final result record, or the lack of
one) and the exit status into the run's :class:`Outcome`.

Rules shared by all formats:

- a line that is not a JSON object, or a record whose shape the parser does not understand,
  becomes a ``text`` event holding the line: nothing the agent printed is lost;
- every string field is cut to 32 KiB and every structured field whose JSON is over 32 KiB
  is replaced by its cut JSON text (the server keeps no more than that anyway), so a huge
  line never becomes an event the SDK refuses;
- usage events carry in ``input`` exactly the SPEC §10 keys, from the agent's own figures;
- tool calls keep the agent's own ids in ``toolCallId``.

Claude Code's in-process subagents (records with ``parent_tool_use_id``) stay attached to the
tool call that started them: their text and thinking carry that call's id as ``toolCallId``,
and their own tool calls carry ``"<parent id>/<own id>"``, so a reader can nest them under the
parent call by prefix and still pair each nested use with its result.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from delegation.client import event
from delegation.runner.host import Outcome

FIELD_BYTES = 32 * 1024
# A line over this many bytes is not parsed at all: its head becomes a text event.
MAX_PARSE_BYTES = 1024 * 1024
TRUNCATED = " [truncated by the runner]"
# Coalesced streaming text is flushed as one event once it grows past this.
COALESCE_BYTES = 8 * 1024
USAGE_INT_KEYS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens")


# --- helpers ------------------------------------------------------------------------------


def cut(text: str, limit: int = FIELD_BYTES) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes (at a character boundary), marked when cut."""
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore") + TRUNCATED


def clip(ev: dict) -> dict:
    """Every field of ``ev`` within what the server stores (32 KiB each)."""
    out = {}
    for name, value in ev.items():
        if value is None:
            continue
        if name in ("kind", "success"):
            out[name] = value
        elif isinstance(value, str):
            out[name] = cut(value)
        else:
            text = json.dumps(value, ensure_ascii=False, default=str)
            out[name] = value if len(text.encode("utf-8")) <= FIELD_BYTES else cut(text)
    return out


def usage_event(
    input_tokens: Any,
    output_tokens: Any,
    *,
    cache_read: Any = None,
    cache_write: Any = None,
    cost_usd: Any = None,
    model: Any = None,
) -> dict | None:
    """A SPEC §10 ``usage`` event, or None when the agent's figures are not usable numbers."""
    figures = {"inputTokens": input_tokens, "outputTokens": output_tokens}
    if cache_read is not None:
        figures["cacheReadTokens"] = cache_read
    if cache_write is not None:
        figures["cacheWriteTokens"] = cache_write
    usage: dict[str, Any] = {}
    for key, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            if key in ("inputTokens", "outputTokens"):
                return None
            continue
        if not math.isfinite(value) or value < 0 or int(value) != value:
            if key in ("inputTokens", "outputTokens"):
                return None
            continue
        usage[key] = int(value)
    if (
        isinstance(cost_usd, int | float)
        and not isinstance(cost_usd, bool)
        and math.isfinite(cost_usd)
        and cost_usd >= 0
    ):
        usage["costUsd"] = float(cost_usd)
    if isinstance(model, str) and model:
        usage["model"] = model
    parts = [f"{usage['inputTokens']} in", f"{usage['outputTokens']} out"]
    if "costUsd" in usage:
        parts.append(f"${usage['costUsd']:.4f}")
    return event("usage", "tokens " + ", ".join(parts), input=usage)


def _text_of(content: Any) -> str:
    """Readable text of a tool result's ``content`` (a string or a list of blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, Mapping) and block.get("type") == "image":
                parts.append("[image]")
            elif isinstance(block, str):
                parts.append(block)
            else:
                parts.append(json.dumps(block, ensure_ascii=False, default=str))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


class Format:
    """One agent's output format. Subclasses handle parsed records in :meth:`record`."""

    name = ""

    def __init__(self) -> None:
        self.result_text: str | None = None  # the agent's own final answer, when it gives one
        self.failure: str | None = None  # the agent's own reason for failing
        self.last_text: str | None = None
        self.last_error: str | None = None
        self.turns_ended = 0  # the agent's end-of-turn records seen (Claude Code's ``result``)

    def feed(self, line: str | bytes) -> list[dict]:
        if isinstance(line, bytes | bytearray):
            if len(line) > MAX_PARSE_BYTES:
                return [self._oversized(len(line), bytes(line[:FIELD_BYTES]))]
            line = bytes(line).decode("utf-8", errors="replace")
        line = line.rstrip("\r\n")
        if not line.strip():
            return []
        if len(line) > MAX_PARSE_BYTES:
            return [self._oversized(len(line.encode("utf-8")), line[:FIELD_BYTES].encode())]
        stripped = line.strip()
        data = None
        if stripped.startswith("{"):
            try:
                data = json.loads(stripped)
            except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
                data = None
        events: list[dict] | None = None
        if isinstance(data, dict):
            try:
                events = self.record(data)
            except (KeyError, TypeError, ValueError, AttributeError):
                events = None  # a record of a shape this parser does not know: keep it as text
        if events is None:
            events = [*self.flush(), event("text", line)]
        return [clip(ev) for ev in events]

    def oversized(self, size: int, head: bytes) -> list[dict]:
        """A line too long to keep (``size`` bytes, of which ``head`` was kept)."""
        return [clip(self._oversized(size, head))]

    def _oversized(self, size: int, head: bytes) -> dict:
        text = head.decode("utf-8", errors="ignore")
        return event(
            "text", cut(text, FIELD_BYTES - 256) + f" [line of {size} bytes cut by the runner]"
        )

    def record(self, data: dict) -> list[dict] | None:
        """Events for one parsed JSON object; None keeps the line as a text event."""
        raise NotImplementedError

    def flush(self) -> list[dict]:
        return []

    def note_text(self, text: str) -> None:
        if text.strip():
            self.last_text = text

    def outcome(self, returncode: int, stderr_tail: str | None = None) -> Outcome:
        """The run's outcome once the agent exited with ``returncode``."""
        if self.failure is not None:
            return Outcome(error=self.failure)
        if returncode == 0:
            output = self.result_text if self.result_text is not None else self.last_text
            return Outcome(output=output or "")
        reason = (
            f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
        )
        detail = stderr_tail or self.last_error
        if detail:
            reason += f": {detail[:500]}"
        return Outcome(error=reason)


# --- lines --------------------------------------------------------------------------------


class LinesFormat(Format):
    """Today's behaviour: ``{"kind": ...}`` objects are events, other lines text."""

    name = "lines"

    def feed(self, line: str | bytes) -> list[dict]:
        from delegation.runner.command import fit, line_event

        if isinstance(line, bytes | bytearray):
            if len(line) > MAX_PARSE_BYTES:
                return [self._oversized(len(line), bytes(line[:FIELD_BYTES]))]
            line = bytes(line).decode("utf-8", errors="replace")
        line = line.rstrip("\r\n")
        if not line.strip():
            return []
        if len(line) > MAX_PARSE_BYTES:
            return [self._oversized(len(line.encode("utf-8")), line[:FIELD_BYTES].encode())]
        try:
            ev = fit(line_event(line))
        except RecursionError:  # JSON nested past the parser's depth: keep it as text
            ev = clip(event("text", line))
        if ev["kind"] == "result" and "text" in ev:
            self.result_text = ev["text"]
        elif ev["kind"] == "text" and "text" in ev:
            self.note_text(ev["text"])
        return [ev]


# --- Claude Code --------------------------------------------------------------------------


CLAUDE_FAILURES = {
    "error_max_turns": "the agent reached its turn limit",
    "error_during_execution": "the agent failed during execution",
    "error_max_budget_usd": "the agent reached its budget",
    "error_max_structured_output_retries": "the agent could not produce the structured output",
}


class ClaudeStreamJson(Format):
    """``claude -p --output-format stream-json --verbose``."""

    name = "claude-stream-json"

    def __init__(self) -> None:
        super().__init__()
        self.model = ""
        self.session_id = ""
        self.tool_names: dict[str, str] = {}
        # ``total_cost_usd`` is the session's running total: a conversation fed through
        # ``--input-format stream-json`` has one result per turn, each adding only its share.
        self.cost_seen = 0.0
        # User messages Claude Code took from stdin (``--replay-user-messages`` echoes each
        # one as it consumes it): the runner's count of prompts the agent has seen.
        self.prompts_seen = 0

    @staticmethod
    def _call_id(own: str, parent: str | None) -> str:
        return f"{parent}/{own}" if parent else own

    def record(self, data: dict) -> list[dict] | None:
        kind = data.get("type")
        parent = data.get("parent_tool_use_id") or None
        if parent is not None and not isinstance(parent, str):
            parent = str(parent)
        if kind == "system":
            return self._system(data)
        if kind == "assistant":
            return self._assistant(data["message"], parent)
        if kind == "user":
            if data.get("isReplay"):
                self.prompts_seen += 1
                return []  # the task and steers are already on the run (its message, steers)
            return self._user(data["message"], parent)
        if kind == "result":
            return self._result(data)
        if kind == "stream_event":
            return self._stream_event(data.get("event") or {}, parent)
        if kind == "tool_progress":
            return self._progress(data, parent)
        return None

    def _progress(self, data: dict, parent: str | None) -> list[dict]:
        """A long tool call's heartbeat, as an update of that call."""
        own = str(data["tool_use_id"])
        # Claude Code numbers its heartbeats "<call id>-heartbeat-<n>".
        base = own.rsplit("-heartbeat-", 1)[0]
        if base in self.tool_names:
            own = base
        seconds = data.get("elapsed_time_seconds")
        text = f"running for {seconds:g} s" if isinstance(seconds, int | float) else "running"
        name = data.get("tool_name") or self.tool_names.get(own)
        return [
            event(
                "tool-update",
                text,
                tool_name=str(name) if name else None,
                tool_call_id=self._call_id(own, parent),
            )
        ]

    def _system(self, data: dict) -> list[dict]:
        subtype = data.get("subtype") or ""
        if subtype == "init":
            self.session_id = str(data.get("session_id") or "")
            self.model = str(data.get("model") or "")
            servers = [
                {"name": s.get("name"), "status": s.get("status")}
                for s in data.get("mcp_servers") or []
                if isinstance(s, Mapping)
            ]
            info = {
                "sessionId": self.session_id,
                "model": self.model,
                "cwd": data.get("cwd"),
                "tools": data.get("tools") or [],
                "mcpServers": servers,
                "permissionMode": data.get("permissionMode"),
            }
            text = f"Claude Code session {self.session_id or '?'} started"
            if self.model:
                text += f" ({self.model})"
            return [event("session", text, input={k: v for k, v in info.items() if v})]
        if subtype == "permission_denied" and data.get("tool_use_id"):
            # Claude Code's own permission check refused a tool call (not on --allowedTools).
            return [
                event(
                    "permission",
                    f"denied: {data.get('message') or 'not permitted'}",
                    tool_name=str(data.get("tool_name") or "") or None,
                    tool_call_id=str(data["tool_use_id"]),
                    input={"decision": "denied"},
                    success=False,
                )
            ]
        extra = {k: v for k, v in data.items() if k not in ("type", "subtype", "uuid")}
        text = f"system: {subtype or 'message'}"
        if subtype == "api_retry":
            text = (
                f"model API retry {data.get('attempt')}/{data.get('max_retries')} after "
                f"{data.get('error_status') or data.get('error')}"
            )
        return [event("system", text, input=extra or None)]

    def _assistant(self, message: Mapping, parent: str | None) -> list[dict]:
        model = message.get("model")
        # "<synthetic>" marks a message Claude Code wrote itself (e.g. an API error).
        if isinstance(model, str) and model and not model.startswith("<") and not parent:
            self.model = model
        out = []
        for block in message["content"]:
            block_type = block.get("type")
            if block_type == "text":
                text = str(block.get("text", ""))
                if not parent:
                    self.note_text(text)
                out.append(event("text", text, tool_call_id=parent))
            elif block_type == "thinking":
                out.append(event("thinking", str(block.get("thinking", "")), tool_call_id=parent))
            elif block_type == "redacted_thinking":
                out.append(event("thinking", "[redacted thinking]", tool_call_id=parent))
            elif block_type in ("tool_use", "server_tool_use", "mcp_tool_use"):
                own = str(block["id"])
                name = str(block.get("name", ""))
                self.tool_names[own] = name
                out.append(
                    event(
                        "tool-use",
                        tool_name=name,
                        tool_call_id=self._call_id(own, parent),
                        input=block.get("input", {}),
                    )
                )
            else:
                out.append(
                    event(
                        "text",
                        json.dumps(block, ensure_ascii=False, default=str),
                        tool_call_id=parent,
                    )
                )
        return out

    def _user(self, message: Mapping, parent: str | None) -> list[dict]:
        content = message["content"]
        if isinstance(content, str):
            return [event("user", content, tool_call_id=parent)]
        out = []
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                own = str(block["tool_use_id"])
                failed = bool(block.get("is_error"))
                text = _text_of(block.get("content"))
                out.append(
                    event(
                        "tool-result",
                        tool_name=self.tool_names.get(own) or None,
                        tool_call_id=self._call_id(own, parent),
                        tool_output=text,
                        success=not failed,
                        error=(text or "tool error") if failed else None,
                    )
                )
            elif isinstance(block, Mapping) and block.get("type") == "text":
                out.append(event("user", str(block.get("text", "")), tool_call_id=parent))
            else:
                out.append(event("user", _text_of([block]), tool_call_id=parent))
        return out

    def _result(self, data: dict) -> list[dict]:
        out = []
        usage = data.get("usage") if isinstance(data.get("usage"), Mapping) else {}
        model = self.model
        model_usage = data.get("modelUsage")
        if not model and isinstance(model_usage, Mapping) and len(model_usage) == 1:
            model = next(iter(model_usage))
        self.turns_ended += 1
        cost = data.get("total_cost_usd")
        if isinstance(cost, int | float) and not isinstance(cost, bool) and math.isfinite(cost):
            cost, self.cost_seen = max(cost - self.cost_seen, 0.0), max(cost, self.cost_seen)
        used = usage_event(
            usage.get("input_tokens", 0),
            usage.get("output_tokens", 0),
            cache_read=usage.get("cache_read_input_tokens"),
            cache_write=usage.get("cache_creation_input_tokens"),
            cost_usd=cost,
            model=model,
        )
        if used is not None:
            out.append(used)
        subtype = data.get("subtype") or ""
        text = data.get("result")
        if data.get("is_error") or subtype != "success":
            reason = text if isinstance(text, str) and text.strip() else None
            errors = data.get("errors")
            if reason is None and isinstance(errors, list) and errors:
                reason = "; ".join(str(e) for e in errors)
            if reason is None:
                reason = CLAUDE_FAILURES.get(
                    subtype, f"the agent ended with {subtype or 'an error'}"
                )
            self.failure = reason
            out.append(event("error", error=reason))
        else:
            self.failure = None  # the last turn decides: a steer may have fixed a failed one
            self.result_text = text if isinstance(text, str) else ""
            out.append(event("result", self.result_text))
        return out

    def _stream_event(self, inner: Mapping, parent: str | None) -> list[dict]:
        # --include-partial-messages: only text deltas are worth showing live; the complete
        # message follows as an ``assistant`` record anyway.
        delta = inner.get("delta") if isinstance(inner, Mapping) else None
        if inner.get("type") == "content_block_delta" and isinstance(delta, Mapping):
            if delta.get("type") == "text_delta":
                return [event("text-delta", str(delta.get("text", "")), tool_call_id=parent)]
            if delta.get("type") == "thinking_delta":
                return [
                    event("thinking-delta", str(delta.get("thinking", "")), tool_call_id=parent)
                ]
        return []


# --- Codex --------------------------------------------------------------------------------


CODEX_TOOL_ITEMS = ("command_execution", "file_change", "mcp_tool_call", "web_search")


class CodexJson(Format):
    """``codex exec --json``: thread, turn and item events."""

    name = "codex-json"

    def __init__(self) -> None:
        super().__init__()
        self.started: set[str] = set()
        self.turn_failed = False

    def record(self, data: dict) -> list[dict] | None:
        kind = data.get("type")
        if kind == "thread.started":
            thread = str(data.get("thread_id") or "")
            return [event("session", f"Codex thread {thread} started", input={"threadId": thread})]
        if kind == "turn.started":
            self.turn_failed = False
            return [event("turn", "turn started")]
        if kind == "turn.completed":
            usage = data.get("usage") or {}
            used = usage_event(
                usage.get("input_tokens", 0),
                usage.get("output_tokens", 0),
                cache_read=usage.get("cached_input_tokens"),
            )
            return [used] if used is not None else []
        if kind == "turn.failed":
            error = data.get("error") or {}
            reason = str(error.get("message") if isinstance(error, Mapping) else error)
            self.failure = reason or "the turn failed"
            return [event("error", error=self.failure)]
        if kind == "error":
            message = str(data.get("message") or "error")
            self.last_error = message
            return [event("error", error=message)]
        if kind in ("item.started", "item.updated", "item.completed"):
            return self._item(kind.split(".", 1)[1], data["item"])
        return None

    def _item(self, phase: str, item: Mapping) -> list[dict] | None:
        item_type = item["type"]
        item_id = str(item.get("id") or "")
        if item_type == "agent_message":
            if phase != "completed":
                return []
            text = str(item.get("text", ""))
            self.note_text(text)
            self.result_text = text  # codex's answer is its last agent message
            return [event("text", text)]
        if item_type == "reasoning":
            return [event("thinking", str(item.get("text", "")))] if phase == "completed" else []
        if item_type == "todo_list":
            entries = [
                {"content": str(i.get("text", "")), "done": bool(i.get("completed"))}
                for i in item.get("items") or []
                if isinstance(i, Mapping)
            ]
            lines = [f"[{'x' if e['done'] else ' '}] {e['content']}" for e in entries]
            return [event("plan", "\n".join(lines), input={"entries": entries})]
        if item_type == "error":
            message = str(item.get("message", ""))
            self.last_error = message
            return [event("error", error=message)]
        if item_type in CODEX_TOOL_ITEMS:
            return self._tool(phase, item_id, item)
        return None

    def _tool(self, phase: str, item_id: str, item: Mapping) -> list[dict]:
        item_type = item["type"]
        status = item.get("status")
        if item_type == "command_execution":
            name, args = "shell", {"command": item.get("command", "")}
        elif item_type == "file_change":
            name, args = "file_change", {"changes": item.get("changes") or []}
        elif item_type == "mcp_tool_call":
            name = f"mcp__{item.get('server', '')}__{item.get('tool', '')}"
            args = item.get("arguments") if item.get("arguments") is not None else {}
        else:
            name, args = "web_search", {"query": item.get("query", "")}
        out = []
        if item_id not in self.started:
            self.started.add(item_id)
            out.append(event("tool-use", tool_name=name, tool_call_id=item_id, input=args))
        if phase == "updated":
            output = item.get("aggregated_output")
            out.append(
                event(
                    "tool-update",
                    str(status) if status else None,
                    tool_name=name,
                    tool_call_id=item_id,
                    tool_output=output if output else None,
                )
            )
        elif phase == "completed":
            out.append(self._tool_result(name, item_id, item))
        return out

    def _tool_result(self, name: str, item_id: str, item: Mapping) -> dict:
        item_type, status = item["type"], item.get("status")
        error = None
        if item_type == "command_execution":
            output: Any = item.get("aggregated_output", "")
            code = item.get("exit_code")
            ok = status != "failed" and code in (0, None)
            if not ok:
                error = f"exit code {code}" if code is not None else f"status {status}"
        elif item_type == "mcp_tool_call":
            output = item.get("result")
            err = item.get("error")
            ok = status != "failed" and not err
            if not ok:
                error = str(err.get("message") if isinstance(err, Mapping) else err or status)
        elif item_type == "file_change":
            output = {"changes": item.get("changes") or []}
            ok = status != "failed"
            error = None if ok else "the patch was not applied"
        else:
            output, ok = {"query": item.get("query", "")}, True
        return event(
            "tool-result",
            tool_name=name,
            tool_call_id=item_id,
            tool_output=output,
            success=ok,
            error=error,
        )


# --- Gemini CLI ---------------------------------------------------------------------------


class GeminiStreamJson(Format):
    """``gemini --output-format stream-json``: init, message, tool_use, tool_result, error,
    result. Streamed assistant deltas are coalesced into one readable text event."""

    name = "gemini-stream-json"

    def __init__(self) -> None:
        super().__init__()
        self.model = ""
        self.pending: list[str] = []
        self.pending_bytes = 0
        self.answer: list[str] = []
        self.tool_names: dict[str, str] = {}

    def flush(self) -> list[dict]:
        if not self.pending:
            return []
        text = "".join(self.pending)
        self.pending, self.pending_bytes = [], 0
        self.note_text(text)
        return [event("text", text)]

    def record(self, data: dict) -> list[dict] | None:
        kind = data.get("type")
        if kind == "message":
            return self._message(data)
        if kind not in ("init", "tool_use", "tool_result", "error", "result"):
            return None
        out = self.flush()
        if kind == "init":
            self.model = str(data.get("model") or "")
            session = str(data.get("session_id") or "")
            text = f"Gemini session {session} started" + (f" ({self.model})" if self.model else "")
            out.append(event("session", text, input={"sessionId": session, "model": self.model}))
        elif kind == "tool_use":
            call_id = str(data["tool_id"])
            name = str(data.get("tool_name", ""))
            self.tool_names[call_id] = name
            out.append(
                event(
                    "tool-use",
                    tool_name=name,
                    tool_call_id=call_id,
                    input=data.get("parameters") or {},
                )
            )
        elif kind == "tool_result":
            call_id = str(data["tool_id"])
            ok = data.get("status") == "success"
            err = data.get("error")
            error = None
            if not ok:
                error = str(err.get("message") if isinstance(err, Mapping) else err or "failed")
            out.append(
                event(
                    "tool-result",
                    tool_name=self.tool_names.get(call_id) or None,
                    tool_call_id=call_id,
                    tool_output=data.get("output"),
                    success=ok,
                    error=error,
                )
            )
        elif kind == "error":
            message = str(data.get("message") or "error")
            severity = data.get("severity")
            self.last_error = message
            out.append(
                event("error", severity if isinstance(severity, str) else None, error=message)
            )
        else:
            out.extend(self._result(data))
        return out

    def _message(self, data: dict) -> list[dict]:
        content = data.get("content")
        if not isinstance(content, str):
            raise TypeError("message content")
        if data.get("role") != "assistant":
            return [*self.flush(), event("user", content)]
        self.answer.append(content)
        if data.get("delta"):
            self.pending.append(content)
            self.pending_bytes += len(content.encode("utf-8"))
            return self.flush() if self.pending_bytes >= COALESCE_BYTES else []
        self.note_text(content)
        return [*self.flush(), event("text", content)]

    def _result(self, data: dict) -> list[dict]:
        out = []
        stats = data.get("stats") if isinstance(data.get("stats"), Mapping) else {}
        if stats:
            used = usage_event(
                stats.get("input_tokens", stats.get("input", 0)),
                stats.get("output_tokens", 0),
                cache_read=stats.get("cached"),
                model=self.model,
            )
            if used is not None:
                out.append(used)
        if data.get("status") == "success":
            self.result_text = "".join(self.answer)
            out.append(event("result", self.result_text))
        else:
            err = data.get("error")
            reason = err.get("message") if isinstance(err, Mapping) else err
            self.failure = str(reason or self.last_error or "the agent reported an error")
            out.append(event("error", error=self.failure))
        return out


FORMATS: dict[str, type[Format]] = {
    cls.name: cls for cls in (LinesFormat, ClaudeStreamJson, CodexJson, GeminiStreamJson)
}


def make_format(name: str) -> Format:
    try:
        return FORMATS[name]()
    except KeyError:
        raise ValueError(f"format {name!r} is not one of {', '.join(sorted(FORMATS))}") from None


async def read_lines(reader, max_line: int = MAX_PARSE_BYTES, chunk: int = 64 * 1024):
    """Yield ``(line, size)`` from an asyncio stream, never holding more than ``max_line``
    bytes of one line: a longer line yields its head and its full size, the rest is skipped.
    """
    buffer = bytearray()
    size = 0  # bytes of the current line seen so far (kept or not)
    while True:
        data = await reader.read(chunk)
        if not data:
            if size:
                yield bytes(buffer), size
            return
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            piece = data[start:end]
            room = max_line - len(buffer)
            if room > 0:
                buffer += piece[:room]
            size += len(piece)
            if newline < 0:
                break
            yield bytes(buffer), size
            buffer.clear()
            size = 0
            start = newline + 1

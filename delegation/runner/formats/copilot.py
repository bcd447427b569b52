"""The ``copilot-json`` format: ``copilot -p ... --output-format json`` (GitHub Copilot CLI).

Mapped from the CLI's real output (tests/support/agents/recorded/copilot-json). Each line is a
session event ``{"type", "data", "id", "ephemeral"?, ...}`` and the last one is
``{"type": "result", "exitCode", "sessionId", "usage"}``:

- ``user.message`` → ``user``; ``assistant.message`` → ``text`` (its ``content``) and one
  ``tool-use`` per ``toolRequests`` entry (the CLI's own ``toolCallId``);
  ``assistant.reasoning`` → ``thinking``; ``tool.execution_complete`` → ``tool-result``;
  ``session.error`` → ``error`` (and fails the run); ``result`` → ``result``;
- records marked ``ephemeral`` (deltas, ``tool.execution_progress``, MCP status, model call
  bookkeeping) are not stored: the complete records repeat what they carry. A failed MCP
  server is the exception (an ``error``), so a child that lost Canopy's tools says so;
- the CLI prints no token counts on stdout (its ``assistant.usage`` is filtered out of the
  JSON stream); it writes them with ``--usage-output-file``, which the preset points at
  ``{usageFile}``: :meth:`CopilotJson.usage_file` turns its ``modelMetrics`` into one ``usage``
  event per model (tokens and model, no cost: Copilot's ``cost`` is a request multiplier,
  not dollars, so the server prices them from its table).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from delegation.client import event
from delegation.runner.formats.base import Format, _text_of, usage_event


class CopilotJson(Format):
    name = "copilot-json"

    def __init__(self) -> None:
        super().__init__()
        self.tool_names: dict[str, str] = {}
        self.session_id = ""
        self.exit_code: int | None = None

    def record(self, data: dict) -> list[dict] | None:
        kind = data["type"]
        body = data.get("data") if isinstance(data.get("data"), Mapping) else {}
        if kind == "result":
            return self._result(data)
        if kind == "session.mcp_server_status_changed":
            if body.get("status") == "failed":
                message = f"MCP server {body.get('serverName')!r} failed: {body.get('error', '')}"
                return [event("error", error=message.rstrip(": "))]
            return []
        if kind == "assistant.usage":  # not printed by 1.0.102; kept if a later CLI does
            used = usage_event(
                body.get("inputTokens", 0),
                body.get("outputTokens", 0),
                cache_read=body.get("cacheReadTokens"),
                cache_write=body.get("cacheWriteTokens"),
                model=body.get("model"),
            )
            return [used] if used else []
        if data.get("ephemeral") is True:
            return []
        if kind == "user.message":
            return [event("user", str(body["content"]))]
        if kind == "assistant.message":
            return self._message(body)
        if kind == "assistant.reasoning":
            return [event("thinking", str(body.get("content", "")))]
        if kind == "tool.execution_start":
            return self._tool_use(body)
        if kind == "tool.execution_complete":
            return [self._tool_result(body)]
        if kind == "session.error":
            self.failure = str(body.get("message") or "the session failed")
            return [event("error", error=self.failure)]
        if kind == "abort":
            return [event("error", error=f"aborted: {body.get('reason', '')}".rstrip(": "))]
        if kind in ("assistant.turn_start", "assistant.turn_end"):
            return []  # turn bookkeeping: the messages and tool calls carry the content
        return None

    def _message(self, body: Mapping) -> list[dict]:
        out = []
        content = body.get("content")
        if isinstance(content, str) and content:
            self.note_text(content)
            out.append(event("text", content))
        for request in body.get("toolRequests") or []:
            out += self._tool_use(
                {"toolCallId": request["toolCallId"], "toolName": request.get("name"), **request}
            )
        return out

    def _tool_use(self, body: Mapping) -> list[dict]:
        call_id = str(body["toolCallId"])
        if call_id in self.tool_names:
            return []  # announced by its assistant.message already
        name = str(body.get("toolName") or body.get("name") or "")
        self.tool_names[call_id] = name
        args = body.get("arguments")
        return [
            event("tool-use", tool_name=name, tool_call_id=call_id, input=args or {}),
        ]

    def _tool_result(self, body: Mapping) -> dict:
        call_id = str(body["toolCallId"])
        ok = body.get("success") is True
        result = body.get("result") if isinstance(body.get("result"), Mapping) else {}
        err = body.get("error")
        error = None
        if not ok:
            error = str(err.get("message") if isinstance(err, Mapping) else err or "failed")
        output = result.get("content")
        if output is None and result.get("contents") is not None:
            output = _text_of(result.get("contents"))
        return event(
            "tool-result",
            tool_name=self.tool_names.get(call_id) or None,
            tool_call_id=call_id,
            tool_output=output if output is not None else error,
            success=ok,
            error=error,
        )

    def _result(self, data: dict) -> list[dict]:
        self.session_id = str(data.get("sessionId") or "")
        code = data.get("exitCode")
        self.exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        if self.failure is not None:
            return []
        if self.exit_code not in (0, None):
            self.failure = self.last_error or f"Copilot CLI exit code {self.exit_code}"
            return [event("error", error=self.failure)]
        self.result_text = self.last_text or ""
        return [event("result", self.result_text)]

    def usage_file(self, text: str) -> list[dict]:
        """``usage`` events from the ``--usage-output-file`` JSON (one per model)."""
        try:
            data = json.loads(text)
        except ValueError:
            return [event("error", error="copilot usage file is not JSON")]
        metrics = data.get("modelMetrics") if isinstance(data, Mapping) else None
        out = []
        for model, entry in (metrics or {}).items():
            usage = entry.get("usage") if isinstance(entry, Mapping) else None
            if not isinstance(usage, Mapping):
                continue
            used = usage_event(
                usage.get("inputTokens"),
                usage.get("outputTokens"),
                cache_read=usage.get("cacheReadTokens"),
                cache_write=usage.get("cacheWriteTokens"),
                model=str(model),
            )
            if used is not None:
                out.append(used)
        return out

"""The ``gemini-stream-json`` format: ``gemini --output-format stream-json``."""

from __future__ import annotations

from collections.abc import Mapping

from delegation.client import event
from delegation.runner.formats.base import COALESCE_BYTES, Format, usage_event


class GeminiStreamJson(Format):
    """``gemini --output-format stream-json``: init, message, tool_use, tool_result, error,
    result. Streamed assistant deltas are coalesced into one readable text event."""

    name = "gemini-stream-json"

    def __init__(self) -> None:
        super().__init__()
        self.session_id = ""  # what a fork loads (--session-file, SPEC §14)
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
            session = self.session_id = str(data.get("session_id") or "")
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

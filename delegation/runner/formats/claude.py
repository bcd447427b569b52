"""The ``claude-stream-json`` format: ``claude -p --output-format stream-json --verbose``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from delegation.client import event
from delegation.runner.formats.base import Format, _text_of, usage_event

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
        # The transcript entry (uuid) of the last main-chain record (fork from here, SPEC §14).
        self.anchor = ""

    @staticmethod
    def _call_id(own: str, parent: str | None) -> str:
        return f"{parent}/{own}" if parent else own

    def record(self, data: dict) -> list[dict] | None:
        events = self._record(data)
        own = data.get("uuid")
        if data.get("type") in ("assistant", "user") and not data.get("parent_tool_use_id"):
            if isinstance(own, str) and own and not data.get("isReplay"):
                self.anchor = own
        # The command engine's reader tags this record's events with it, so a fork can resume
        # right after any of them (delegation.runner.kept_sessions).
        return events

    def _record(self, data: dict) -> list[dict] | None:
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

"""The ``codex-json`` format: ``codex exec --json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delegation.client import event
from delegation.runner.formats.base import Format, usage_event

CODEX_TOOL_ITEMS = ("command_execution", "file_change", "mcp_tool_call", "web_search")


class CodexJson(Format):
    """``codex exec --json``: thread, turn and item events."""

    name = "codex-json"
    # codex exec says so whenever stdin is not a terminal, even a closed one: not a failure.
    informational_stderr = ("Reading additional input from stdin",)

    def __init__(self) -> None:
        super().__init__()
        self.started: set[str] = set()
        self.turn_failed = False
        self.session_id = ""  # the thread id: what ``codex exec fork`` forks (SPEC §14)

    def record(self, data: dict) -> list[dict] | None:
        kind = data.get("type")
        if kind == "thread.started":
            thread = self.session_id = str(data.get("thread_id") or "")
            started = {"threadId": thread, "sessionId": thread}
            return [event("session", f"Codex thread {thread} started", input=started)]
        if kind == "turn.started":
            self.turn_failed = False
            return [event("turn", "turn started")]
        if kind == "turn.completed":
            usage = data.get("usage") or {}
            used = usage_event(
                usage.get("input_tokens", 0),
                usage.get("output_tokens", 0),
                cache_read=usage.get("cached_input_tokens"),
                # its records name no model: the one its command line names prices it.
                model=self.model,
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

"""A scripted three-child fan-out for real Claude Code processes (issue 24).

One model stub serves every process of the tree. The parent (its task says ``FANOUT``)
delegates ``part 0``..``part 2`` with ``mcp__canopy__delegate``, then joins them:

- ``await`` mode: one ``await_children`` with ``quorum`` 2, then one with ``all``;
- ``poll`` mode: the same task joined by ``read_child`` calls (each waits up to 50 s for the
  child's next event or its end), round robin over the children not yet done.

Each child (``part N``) calls ``mcp__canopy__conclude`` and then answers. Part ``HELD`` waits
in its first turn until the parent has learned that two parts are done, so the quorum is met
by exactly parts 0 and 1. The parent's final answer ends with a ``canopy-conclusion`` block.
``spend`` reads the turns and tokens of the parent from the stub's request log.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from delegation.runner.model_stub import ModelRequest, Text, ToolCall

PARTS = 3
HELD = 2
TOOL = "mcp__canopy__"
DELEGATE, AWAIT, READ, CONCLUDE = (
    TOOL + name for name in ("delegate", "await_children", "read_child", "conclude")
)
PARENT_TASK = "FANOUT: split the work into three parts and join them."
PARENT_CONCLUSION = {"status": "done", "summary": "All three parts are done.", "confidence": 0.9}


def texts(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return " ".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


def is_parent(request: ModelRequest) -> bool:
    return bool(request.messages) and "FANOUT" in texts(request.messages[0])


def child_conclusion(part: int) -> dict:
    return {"status": "done", "summary": f"part {part} done", "confidence": 0.8}


@dataclass
class FanOutScript:
    mode: str = "await"
    released: threading.Event = field(default_factory=threading.Event)
    held: threading.Event = field(default_factory=threading.Event)
    # What the parent's join calls answered, in order (parsed tool results).
    joins: list[dict] = field(default_factory=list)

    def __call__(self, request: ModelRequest) -> Any:
        if not any(name.startswith(TOOL) for name in request.tool_names):
            return Text("ok")  # the CLI's side requests (titles, summaries)
        if is_parent(request):
            return self._parent(request)
        part = int(re.search(r"part (\d)", texts(request.messages[0]))[1])
        if not any(u.get("name") == CONCLUDE for u in request.tool_uses):
            if part == HELD:
                self.held.set()
                self.released.wait(120)
            return ToolCall(CONCLUDE, child_conclusion(part), text=f"Part {part} is done.")
        return Text(f"part {part} finished")

    @staticmethod
    def _calls(request: ModelRequest) -> list[tuple[str, dict, dict | None]]:
        """Every tool call of the conversation: (name, input, parsed result or None)."""
        results = {r.get("tool_use_id"): r for r in request.tool_results}
        calls = []
        for use in request.tool_uses:
            result = results.get(use.get("id"))
            parsed = None
            if result is not None:
                try:
                    parsed = json.loads(request.tool_result_text(result))
                except ValueError:
                    parsed = {"unparsed": request.tool_result_text(result)}
            calls.append((use.get("name"), use.get("input") or {}, parsed))
        return calls

    def _parent(self, request: ModelRequest) -> Any:
        calls = self._calls(request)
        delegated = [result for name, _input, result in calls if name == DELEGATE]
        if len(delegated) < PARTS:
            part = len(delegated)
            return ToolCall(
                DELEGATE,
                {"profile": "claude", "message": f"part {part}", "requestId": f"part-{part}"},
            )
        ids = [result["conversationId"] for result in delegated]
        if self.mode == "await":
            return self._await(calls, ids)
        return self._poll(calls, ids)

    def _finished(self, done_ids: set[str]) -> Any:
        if len(done_ids) >= PARTS - 1:
            self.released.set()
        if len(done_ids) == PARTS:
            block = json.dumps(PARENT_CONCLUSION)
            return Text(f"All parts joined.\n\n```canopy-conclusion\n{block}\n```")
        return None

    def _await(self, calls, ids) -> Any:
        joins = [result for name, _input, result in calls if name == AWAIT]
        self.joins = joins
        if not joins:
            arguments = {"childIds": ids, "mode": "quorum", "quorum": 2, "waitSeconds": 50}
            return ToolCall(AWAIT, arguments)
        done_ids = {r["conversationId"] for r in joins[-1]["results"] if r["done"]}
        final = self._finished(done_ids)
        if final is not None:
            return final
        return ToolCall(AWAIT, {"childIds": ids, "mode": "all", "waitSeconds": 50})

    def _poll(self, calls, ids) -> Any:
        done_ids: set[str] = set()
        after: dict[str, int] = {}
        for name, _arguments, result in calls:
            if name == READ and result is not None and "conversationId" in result:
                child = result["conversationId"]
                if result["done"]:
                    done_ids.add(child)
                for event in result.get("events") or []:
                    after[child] = max(after.get(child, 0), event["sequence"])
        final = self._finished(done_ids)
        if final is not None:
            return final
        last = next((a["childId"] for n, a, _r in reversed(calls) if n == READ), None)
        waiting = [child for child in ids if child not in done_ids]
        # Round robin: the next unfinished child after the one read last.
        following = [c for c in waiting if last is None or ids.index(c) > ids.index(last)]
        child = (following or waiting)[0]
        return ToolCall(READ, {"childId": child, "after": after.get(child, 0), "waitSeconds": 50})


def spend(turns: list[ModelRequest]) -> dict:
    """The parent's model turns and the tokens they sent, by the stub's rule (4 characters a
    token), from the stub's request log."""
    mine = [t for t in turns if t.tool_names and is_parent(t)]
    return {
        "turns": len(mine),
        "inputTokens": sum(max(1, len(json.dumps(t.body)) // 4) for t in mine),
    }

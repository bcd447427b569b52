"""One ACP session per child: the ACP *client* side that turns ``session/update``
notifications into Canopy events and answers permission requests by the preset's policy."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from acp import RequestError
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

from delegation.client import event
from delegation.runner.acp.presets import AcpPreset
from delegation.runner.formats import COALESCE_BYTES, clip, usage_event
from delegation.runner.host import RunContext

# The ACP tool kinds an approval rule's ``kind`` matches (SPEC §11); anything else is "other".
APPROVAL_KINDS = ("read", "edit", "delete", "move", "search", "execute", "think", "fetch")

# Coalesced chunks wait at most this long, so a slow message still shows up while it grows.
CHUNK_MAX_AGE = 0.5


def _content_text(content: Any) -> str:
    """Readable text of ACP content: a content block, or a list of tool call contents."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "\n".join(filter(None, (_content_text(c) for c in content)))
    kind = getattr(content, "type", None)
    if kind == "text":
        return content.text
    if kind == "content":  # a tool call's content wrapper
        return _content_text(content.content)
    if kind == "diff":
        return f"diff of {content.path}"
    if kind == "terminal":
        return f"terminal {content.terminal_id}"
    if kind == "resource_link":
        return content.uri
    if kind in ("image", "audio"):
        return f"[{kind}]"
    if kind == "resource":
        return getattr(content.resource, "text", None) or getattr(content.resource, "uri", "")
    return json.dumps(_dump(content), ensure_ascii=False, default=str)


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


def _edited(answer: dict, asked: Any) -> bool:
    """Whether an allow carries an input other than the one asked about."""
    if "updatedInput" not in answer:
        return False
    same = json.dumps(answer["updatedInput"], sort_keys=True, default=str)
    return same != json.dumps(asked, sort_keys=True, default=str)


class Session:
    """One child's ACP client side: session updates in, events out, permissions decided."""

    def __init__(self, ctx: RunContext, preset: AcpPreset, queue: asyncio.Queue):
        self.ctx = ctx
        self.preset = preset
        self.queue = queue
        self.session_id = ""
        self.replaying = False  # session/load replays history: not this run's events
        self.chunks: list[str] = []
        self.chunk_kind: str | None = None
        self.chunk_message: str | None = None
        self.chunk_bytes = 0
        self.chunk_since = 0.0
        # The agent's message text of the current turn, split where something else (a tool
        # call, a thought, a plan) or a new messageId came between: the last part is the
        # turn's answer.
        self.turn_parts: list[list[str]] = []
        self.part_open = False
        self.last_message_id: str | None = None
        self.tool_names: dict[str, str] = {}
        # The kind each tool call was announced with: a permission request may omit it.
        self.tool_kinds: dict[str, str] = {}
        self.cost_seen = 0.0
        self.cancelling = False

    # -- events ------------------------------------------------------------------------

    def put(self, *events: dict) -> None:
        for ev in events:
            self.queue.put_nowait(clip(ev))

    def flush(self) -> None:
        if not self.chunks:
            return
        text = "".join(self.chunks)
        kind = self.chunk_kind or "text"
        self.chunks, self.chunk_kind, self.chunk_message, self.chunk_bytes = [], None, None, 0
        self.put(event(kind, text))

    def flush_stale(self) -> None:
        if self.chunks and time.monotonic() - self.chunk_since >= CHUNK_MAX_AGE:
            self.flush()

    def _chunk(self, kind: str, text: str, message_id: str | None) -> None:
        if self.chunk_kind != kind or (message_id and message_id != self.chunk_message):
            self.flush()
        if not self.chunks:
            self.chunk_since = time.monotonic()
        self.chunk_kind = kind
        self.chunk_message = message_id or self.chunk_message
        self.chunks.append(text)
        self.chunk_bytes += len(text.encode("utf-8"))
        if message_id and message_id != self.last_message_id:
            self.part_open = False  # a new message starts a new part of the answer
        self.last_message_id = message_id or self.last_message_id
        if kind == "text":
            if not self.part_open:
                self.turn_parts.append([])
                self.part_open = True
            self.turn_parts[-1].append(text)
        else:
            self.part_open = False
        if self.chunk_bytes >= COALESCE_BYTES:
            self.flush()

    # -- the ACP Client interface ------------------------------------------------------

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        # Everything below is synchronous: notifications are handled in tasks started in
        # arrival order, so doing the work before any await keeps the events in order.
        if self.replaying:
            return
        kind = getattr(update, "session_update", None)
        if kind in ("agent_message_chunk", "agent_thought_chunk", "user_message_chunk"):
            event_kind = {
                "agent_message_chunk": "text",
                "agent_thought_chunk": "thinking",
                "user_message_chunk": "user",
            }[kind]
            self._chunk(event_kind, _content_text(update.content), update.message_id)
            return
        self.flush()
        self.part_open = False
        if kind == "tool_call":
            self._tool_call(update)
        elif kind == "tool_call_update":
            self._tool_update(update)
        elif kind == "plan":
            entries = [
                {"content": e.content, "priority": e.priority, "status": e.status}
                for e in update.entries
            ]
            marks = {"completed": "x", "in_progress": "~"}
            lines = [f"[{marks.get(e['status'], ' ')}] {e['content']}" for e in entries]
            self.put(event("plan", "\n".join(lines), input={"entries": entries}))
        elif kind == "usage_update":
            self._usage_update(update)
        elif kind == "current_mode_update":
            self.put(event("mode", update.current_mode_id))
        # available_commands_update, config_option_update, session_info_update: agent UI
        # state with nothing to show on a run's stream.

    def _tool_call(self, update: Any) -> None:
        call_id = update.tool_call_id
        if call_id in self.tool_names:
            # Some agents (claude-code-acp) announce a call again once its input is complete:
            # one tool-use per call, the rest are updates.
            self._tool_update(update)
            return
        self.tool_names[call_id] = update.title
        if update.kind:
            self.tool_kinds[call_id] = update.kind
        args = update.raw_input if update.raw_input is not None else {}
        self.put(
            event(
                "tool-use",
                update.kind or None,
                tool_name=update.title,
                tool_call_id=call_id,
                input=args,
            )
        )
        if update.status in ("completed", "failed"):
            self._tool_update(update)

    def _tool_update(self, update: Any) -> None:
        call_id = update.tool_call_id
        if update.title:
            self.tool_names[call_id] = update.title  # titles get more specific as input arrives
        name = self.tool_names.get(call_id) or update.title
        text = _content_text(update.content)
        output = update.raw_output if update.raw_output is not None else (text or None)
        if update.status == "completed":
            self.put(
                event(
                    "tool-result",
                    tool_name=name,
                    tool_call_id=call_id,
                    tool_output=output,
                    success=True,
                )
            )
        elif update.status == "failed":
            self.put(
                event(
                    "tool-result",
                    tool_name=name,
                    tool_call_id=call_id,
                    tool_output=output,
                    success=False,
                    error=text or "the tool call failed",
                )
            )
        elif update.status or output is not None or update.raw_input is not None or update.title:
            self.put(
                event(
                    "tool-update",
                    update.status,
                    tool_name=name,
                    tool_call_id=call_id,
                    input=update.raw_input,
                    tool_output=output,
                )
            )
        # An update with nothing in it (no status, input, output or title) shows nothing.

    def _usage_update(self, update: Any) -> None:
        # usage_update carries the context window and the session's cumulative cost; a usage
        # event adds to the run's totals, so only the cost spent since the last one counts.
        cost = update.cost
        delta = None
        if cost is not None and cost.currency.upper() == "USD" and cost.amount >= self.cost_seen:
            delta = cost.amount - self.cost_seen
            self.cost_seen = cost.amount
        if not delta:
            return  # only the context window moved: nothing to add to the run's totals
        used = usage_event(0, 0, cost_usd=delta)
        if used is not None:
            used["text"] = f"context {update.used}/{update.size} tokens" + (
                f", ${delta:.4f}" if delta else ""
            )
            self.put(used)

    def turn_usage(self, usage: Any) -> None:
        if usage is None:
            return
        used = usage_event(
            usage.input_tokens,
            usage.output_tokens,
            cache_read=usage.cached_read_tokens,
            cache_write=usage.cached_write_tokens,
        )
        if used is not None:
            self.put(used)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list, **kwargs: Any
    ) -> RequestPermissionResponse:
        self.flush()
        kind = tool_call.kind or self.tool_kinds.get(tool_call.tool_call_id) or "other"
        name = tool_call.title or self.tool_names.get(tool_call.tool_call_id) or ""
        allowed = kind in self.preset.allow_tool_kinds and not self.cancelling
        reason = ""
        if self.cancelling:
            reason = "the run is being cancelled"
        elif allowed:
            reason = f"tool kind {kind!r} is allowed by preset {self.preset.name!r}"
        elif self.preset.ask_canopy:
            allowed, reason = await self._ask_canopy(tool_call, kind, name)
        else:
            reason = f"tool kind {kind!r} is not on preset {self.preset.name!r}'s allow-list"
        wanted = ("allow_once", "allow_always") if allowed else ("reject_once", "reject_always")
        option = next((o for w in wanted for o in options if o.kind == w), None)
        if self.cancelling:
            option = None  # ACP: pending permission requests of a cancelled turn are cancelled
        decision = "allowed" if allowed and option is not None else "denied"
        self.put(
            event(
                "permission",
                f"{decision}: {reason}",
                tool_name=name or None,
                tool_call_id=tool_call.tool_call_id,
                input={
                    "toolKind": kind,
                    "decision": decision,
                    "option": option.option_id if option else None,
                    "options": [o.option_id for o in options],
                },
                success=decision == "allowed",
            )
        )
        if option is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option.option_id)
        )

    async def _ask_canopy(self, tool_call: Any, kind: str, name: str) -> tuple[bool, str]:
        """SPEC §11: Canopy's decision (policy at once, or an operator's, or a cancel)."""
        raw = _dump(tool_call.raw_input) if tool_call.raw_input is not None else {}
        answer = await self.ctx.ask_approval(
            tool_call.tool_call_id,
            # ACP names no tool, only a title (claude-code-acp: the command in backticks).
            name or self.tool_names.get(tool_call.tool_call_id) or kind,
            raw,
            kind=kind if kind in APPROVAL_KINDS else "other",
            title=name,
            # The agent takes an option id and nothing else: an edit could not run here.
            can_edit=False,
        )
        decision = answer.get("decision")
        if decision == "cancelled":
            self.cancelling = True
            return False, "the run is being cancelled"
        message = answer.get("message") or ""
        why = f"Canopy: {decision}" + (f" ({message})" if message else "")
        if decision == "allow" and _edited(answer, raw):
            # A server that ignored canEdit: running the original would not be what was
            # decided, so the tool does not run at all (fail closed).
            return False, f"{why}, but with an edited input this ACP agent cannot run"
        return decision == "allow", why

    # The runner offers the agent no file system and no terminal (it advertises neither),
    # so these are refused if an agent calls them anyway.
    async def read_text_file(self, *args: Any, **kwargs: Any):
        raise RequestError.method_not_found("fs/read_text_file")

    async def write_text_file(self, *args: Any, **kwargs: Any):
        raise RequestError.method_not_found("fs/write_text_file")

    async def create_terminal(self, *args: Any, **kwargs: Any):
        raise RequestError.method_not_found("terminal/create")

    async def ext_method(self, method: str, params: dict) -> dict:
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict) -> None:
        return None

    def on_connect(self, conn: Any) -> None:
        return None

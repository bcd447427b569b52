"""A deterministic ACP agent for the tests, written with the ``agent-client-protocol`` agent side.

What a turn does is read from the prompt's words:

- always: a thought in two chunks, a plan, a ``read`` tool call that completes, an answer in
  three chunks ("Echo: <prompt>"), a ``usage_update`` with a cumulative cost, and the turn's
  own token usage;
- ``permission:<kind>``: a tool call of that ACP kind that asks for permission first; it
  completes when allowed and fails when not;
- ``slow`` / ``slow:<seconds>``: the turn keeps working (a chunk every second) for 30 s or
  that long, ending early with ``cancelled`` on ``session/cancel``, or with ``end_turn`` once
  the file named by ``ACP_AGENT_RELEASE`` exists;
- ``stubborn``: like ``slow`` but ignores ``session/cancel``, a closed stdin and SIGTERM;
- ``refuse``: ends the turn with ``refusal``;
- ``terminal``: a tool call in claude-code-acp's shape (announced twice, an empty update);
- ``flood:<n>``: n tool calls, each started and completed at once, as fast as it can.

Sessions are kept as JSON files under ``ACP_AGENT_STATE`` (when set), so a new process can
``session/load`` one; ``ACP_AGENT_NO_LOAD=1`` makes the agent not offer ``session/load``; ``ACP_AGENT_CRASH=1``
makes it exit on ``session/new`` after a line on stderr.
Each process writes its pid, cwd, depth and the MCP servers it was given to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    plan_entry,
    run_agent,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentCapabilities,
    AgentMessageChunk,
    Cost,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ToolCallUpdate,
    Usage,
    UsageUpdate,
)

STATE = os.environ.get("ACP_AGENT_STATE")


class TestAgent:
    def __init__(self) -> None:
        self.client: Any = None
        self.history: dict[str, list[dict]] = {}
        self.cancelled: set[str] = set()
        self.cost = 0.0
        self.turns = 0
        self.stubborn = False

    def on_connect(self, conn: Any) -> None:
        self.client = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=os.environ.get("ACP_AGENT_NO_LOAD") != "1"
            ),
            agent_info=Implementation(name="test-acp-agent", version="1.0"),
        )

    async def new_session(self, cwd: str, mcp_servers: list | None = None, **kwargs: Any):
        if os.environ.get("ACP_AGENT_CRASH"):
            print("fatal: the model endpoint is unreachable", file=sys.stderr, flush=True)
            print("}", file=sys.stderr, flush=True)
            os._exit(3)
        session_id = f"sess-{uuid.uuid4().hex[:12]}"
        self.history[session_id] = []
        servers = [s.model_dump(mode="json", by_alias=True) for s in mcp_servers or []]
        info = {
            "pid": os.getpid(),
            "uid": os.getuid(),
            "cwd": cwd,
            "depth": os.environ.get("PANDO_DELEGATION_DEPTH"),
            "token": os.environ.get("CANOPY_RUNNER_TOKEN", "-"),
            "mcpServers": servers,
        }
        print("agent " + json.dumps(info), file=sys.stderr, flush=True)
        if STATE:
            Path(STATE, "started.jsonl").open("a").write(json.dumps(info) + "\n")
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any):
        path = Path(STATE or "/nonexistent", f"{session_id}.json")
        if not path.exists():
            from acp import RequestError

            raise RequestError.invalid_params({"sessionId": f"unknown session {session_id}"})
        self.history[session_id] = json.loads(path.read_text())
        self.cost = 0.25 * len(self.history[session_id])  # the session's cost so far
        # The protocol replays the conversation to the client before answering.
        for turn in self.history[session_id]:
            await self.client.session_update(session_id, update_user_message_text(turn["user"]))
            await self.client.session_update(session_id, update_agent_message_text(turn["agent"]))
        return LoadSessionResponse()

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self.cancelled.add(session_id)

    async def say(self, session_id: str, update: Any) -> None:
        await self.client.session_update(session_id, update)

    async def prompt(self, session_id: str, prompt: list, **kwargs: Any) -> PromptResponse:
        self.turns += 1
        text = " ".join(getattr(b, "text", "") for b in prompt).strip()
        sid = session_id
        self.cancelled.discard(sid)
        await self.say(sid, update_agent_thought_text("Thinking about "))
        await self.say(sid, update_agent_thought_text(f"turn {self.turns}."))
        await self.say(
            sid,
            update_plan(
                [
                    plan_entry("look around", status="completed"),
                    plan_entry("answer", status="in_progress"),
                ]
            ),
        )
        call = f"call-{self.turns}-read"
        await self.say(
            sid,
            start_tool_call(
                call, "Read notes.md", kind="read", status="pending", raw_input={"path": "notes.md"}
            ),
        )
        await self.say(sid, update_tool_call(call, status="in_progress"))
        await self.say(
            sid,
            update_tool_call(
                call,
                status="completed",
                content=[tool_content(text_block("notes: none"))],
                raw_output={"bytes": 11},
            ),
        )
        for word in text.split():
            if word.startswith("flood:"):
                # As fast as the agent can: tool calls that start and complete at once.
                for i in range(int(word.split(":", 1)[1])):
                    await self.say(sid, start_tool_call(f"f{i}", "Flood", kind="other"))
                    await self.say(sid, update_tool_call(f"f{i}", status="completed"))
            if word == "terminal":
                # claude-code-acp's shape: a call announced, announced again with its input
                # once complete, an empty update, then its result.
                await self.say(sid, start_tool_call("term-1", "Terminal", kind="execute"))
                await self.say(
                    sid,
                    start_tool_call("term-1", "`ls`", kind="execute", raw_input={"command": "ls"}),
                )
                await self.say(sid, update_tool_call("term-1"))
                await self.say(
                    sid,
                    update_tool_call(
                        "term-1", status="completed", content=[tool_content(text_block("a.py"))]
                    ),
                )
            if word.startswith("permission:"):
                await self.permission(sid, word.split(":", 1)[1])
        if "refuse" in text.split():
            return PromptResponse(stop_reason="refusal")
        words = text.split()
        slow = [w for w in words if w == "slow" or w.startswith("slow:") or w == "stubborn"]
        if slow:
            stubborn = "stubborn" in words
            seconds = float(slow[0].split(":", 1)[1]) if ":" in slow[0] else 30.0
            if stubborn:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                self.stubborn = True
            for tick in range(int(seconds * 10)):
                if sid in self.cancelled and not stubborn:
                    await self.say(sid, update_agent_message_text("Stopping as asked."))
                    return PromptResponse(stop_reason="cancelled")
                release = os.environ.get("ACP_AGENT_RELEASE")
                if release and Path(release).exists():
                    break
                if tick % 10 == 0:
                    progress = AgentMessageChunk(
                        session_update="agent_message_chunk",
                        content=text_block(f"[working {tick // 10}]"),
                        message_id=f"work-{self.turns}",
                    )
                    await self.say(sid, progress)
                await asyncio.sleep(0.1)
        answer = f"Echo: {text}"
        third = len(answer) // 3
        for piece in (answer[:third], answer[third : 2 * third], answer[2 * third :]):
            chunk = AgentMessageChunk(
                session_update="agent_message_chunk",
                content=text_block(piece),
                message_id=f"answer-{self.turns}",
            )
            await self.say(sid, chunk)
        self.cost += 0.25
        await self.say(
            sid,
            UsageUpdate(
                session_update="usage_update",
                used=1000 * self.turns,
                size=200_000,
                cost=Cost(amount=self.cost, currency="USD"),
            ),
        )
        self.history.setdefault(sid, []).append({"user": text, "agent": answer})
        if STATE:
            Path(STATE, f"{sid}.json").write_text(json.dumps(self.history[sid]))
        return PromptResponse(
            stop_reason="end_turn",
            usage=Usage(
                total_tokens=150,
                input_tokens=100,
                output_tokens=50,
                cached_read_tokens=30,
            ),
        )

    async def permission(self, sid: str, kind: str) -> None:
        call = f"call-{self.turns}-ask-{kind}"
        await self.say(
            sid,
            start_tool_call(
                call, f"Run a {kind} tool", kind=kind, status="pending", raw_input={"kind": kind}
            ),
        )
        answer = await self.client.request_permission(
            sid,
            ToolCallUpdate(tool_call_id=call, title=f"Run a {kind} tool", kind=kind),
            [
                PermissionOption(option_id="yes", name="Allow", kind="allow_once"),
                PermissionOption(option_id="always", name="Always allow", kind="allow_always"),
                PermissionOption(option_id="no", name="Reject", kind="reject_once"),
            ],
        )
        outcome = answer.outcome
        if getattr(outcome, "option_id", None) in ("yes", "always"):
            await self.say(
                sid,
                update_tool_call(
                    call, status="completed", content=[tool_content(text_block(f"{kind} done"))]
                ),
            )
        else:
            await self.say(
                sid,
                update_tool_call(
                    call,
                    status="failed",
                    content=[tool_content(text_block("permission denied by the client"))],
                ),
            )


async def main() -> None:
    agent = TestAgent()
    await run_agent(agent)
    if agent.stubborn:
        time.sleep(30)  # not even a closed stdin ends it: only SIGKILL does


if __name__ == "__main__":
    asyncio.run(main())

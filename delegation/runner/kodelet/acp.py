"""Canopy's ``kodelet``: answers ``kodelet acp [--profile=NAME]`` as an ACP v1 agent whose
sessions are child runs of the run that hosts the calling extension (SPEC §15).

It is what kodelet-subagent (through kodelet-sdk's ``Client``) starts for each background
agent. It speaks ACP v1, newline-delimited JSON-RPC on stdio, and answers ``initialize``
with the ``_meta`` capabilities kodelet's SDK checks (``steering``, ``conversationHierarchy``,
``sessionExtensions``). It holds no credential: every session's work is asked of the
runner through :mod:`.bridge`'s socket (``CANOPY_KODELET_SOCKET``).

| ACP | Canopy |
|---|---|
| ``session/new`` | a session record; the child starts with the first prompt |
| ``session/prompt`` | ``child.start`` (first turn) or a resume of the same child (later turns), then ``child.read`` streamed back as ``session/update`` until the child run ends |
| ``session/cancel`` | ``child.cancel``; the prompt ends with ``stopReason: cancelled`` |
| ``_session/steering`` | ``child.steer``: ``injected``, or ``promptRequired`` (``noRunningTurn``) |
| ``session/load`` | the session again; its next prompt resumes the child (a new run); a fork's session (``kodelet.conversation.fork``) starts its child with ``contextMode: "fork"`` |

A child's ``result`` (or, without one, its output) is the agent's message; its text and
thinking are thought chunks; tool use and results are ``tool_call`` / ``tool_call_update``.
A refused start (depth −32010, caps, budget) or a failed child is the prompt's JSON-RPC error,
with Canopy's code and message, which kodelet-subagent records as the agent's failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from typing import Any

SOCKET_ENV = "CANOPY_KODELET_SOCKET"
# child.read while a child runs: quick after an event, backing off to a second while quiet.
POLL_SECONDS, POLL_MAX_SECONDS = 0.1, 1.0
INIT_META = {
    "steering": {"supported": True},
    "conversationHierarchy": {"version": 1},
    "sessionExtensions": {"version": 1},
}


class BridgeError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


async def ask(op: str, **params: Any) -> Any:
    """One request to the runner's bridge (a connection each: a prompt's reads never wait
    behind a steer)."""
    reader, writer = await asyncio.open_unix_connection(os.environ[SOCKET_ENV])
    try:
        writer.write(json.dumps({"id": 1, "op": op, **params}).encode() + b"\n")
        await writer.drain()
        line = await reader.readline()
    finally:
        writer.close()
    if not line:
        raise BridgeError(-32603, "the Canopy runner closed the kodelet bridge")
    answer = json.loads(line)
    if "error" in answer:
        raise BridgeError(int(answer["error"]["code"]), str(answer["error"]["message"]))
    return answer["result"]


def text_of(prompt: Any) -> str:
    parts = []
    for block in prompt if isinstance(prompt, list) else []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "\n".join(parts)


def updates_for(event: dict) -> list[dict]:
    """The ``session/update`` payloads a child's event becomes (none for the rest)."""
    kind = event.get("kind")
    meta = {"canopy": {"sequence": event.get("sequence"), "kind": kind}}
    if kind == "result":
        content = {"type": "text", "text": event.get("text") or ""}
        return [{"sessionUpdate": "agent_message_chunk", "content": content, "_meta": meta}]
    if kind in ("text", "text-delta", "thinking", "steer"):
        content = {"type": "text", "text": event.get("text") or ""}
        return [{"sessionUpdate": "agent_thought_chunk", "content": content, "_meta": meta}]
    if kind == "tool-use":
        return [
            {
                "sessionUpdate": "tool_call",
                "toolCallId": event.get("toolCallId") or f"call-{event.get('sequence')}",
                "title": event.get("toolName") or "tool",
                "toolName": event.get("toolName") or "tool",
                "rawInput": event.get("input"),
                "status": "pending",
                "_meta": meta,
            }
        ]
    if kind == "tool-result":
        output = event.get("toolOutput")
        text = (
            event.get("text")
            or event.get("error")
            or (output if isinstance(output, str) else json.dumps(output))
        )
        return [
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": event.get("toolCallId") or f"call-{event.get('sequence')}",
                "status": "failed" if event.get("success") is False else "completed",
                "content": [{"type": "content", "content": {"type": "text", "text": text or ""}}],
                "_meta": meta,
            }
        ]
    return []


class Agent:
    def __init__(self, profile: str):
        self.profile = profile
        self.out = sys.stdout.buffer
        self.write_lock = asyncio.Lock()
        self.cancelled: set[str] = set()
        self.tasks: set[asyncio.Task] = set()

    async def send(self, message: dict) -> None:
        async with self.write_lock:
            self.out.write(json.dumps(message).encode() + b"\n")
            self.out.flush()

    async def notify(self, method: str, params: dict) -> None:
        await self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict) or not isinstance(message.get("method"), str):
                continue  # an answer to nothing we asked (we ask the client nothing)
            task = asyncio.create_task(self.handle(message))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        for task in list(self.tasks):
            task.cancel()

    async def handle(self, message: dict) -> None:
        method, params = message["method"], message.get("params") or {}
        request_id = message.get("id")
        handler = {
            "initialize": self.initialize,
            "session/new": self.new_session,
            "session/load": self.load_session,
            "session/prompt": self.prompt,
            "session/cancel": self.cancel,
            "_session/steering": self.steer,
        }.get(method)
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if handler is None:
            reply["error"] = {"code": -32601, "message": f"method not found: {method}"}
        else:
            try:
                reply["result"] = await handler(params)
            except BridgeError as exc:
                reply["error"] = {"code": exc.code, "message": exc.message}
            except Exception as exc:
                reply["error"] = {"code": -32603, "message": f"{type(exc).__name__}: {exc}"}
        if request_id is not None:
            await self.send(reply)

    async def initialize(self, params: dict) -> dict:
        return {
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": False},
                "mcpCapabilities": {"http": False, "sse": False},
            },
            "authMethods": [],
            "agentInfo": {"name": "canopy-kodelet", "title": "Canopy (kodelet acp)"},
            "_meta": INIT_META,
        }

    async def new_session(self, params: dict) -> dict:
        return await ask("new", profile=self.profile, cwd=params.get("cwd"))

    async def load_session(self, params: dict) -> dict:
        await ask("load", sessionId=str(params.get("sessionId", "")))
        return {}

    async def cancel(self, params: dict) -> None:
        session_id = str(params.get("sessionId", ""))
        self.cancelled.add(session_id)
        with contextlib.suppress(BridgeError):
            await ask("cancel", sessionId=session_id)

    async def steer(self, params: dict) -> dict:
        message = text_of(params.get("prompt")).strip()
        if not message:
            return {"outcome": "failed", "reason": "emptyMessage"}
        return await ask("steer", sessionId=str(params.get("sessionId", "")), message=message)

    async def prompt(self, params: dict) -> dict:
        session_id = str(params.get("sessionId", ""))
        self.cancelled.discard(session_id)
        await ask("prompt", sessionId=session_id, message=text_of(params.get("prompt")))
        after, answered, pause = 0, False, POLL_SECONDS
        while True:
            page = await ask("read", sessionId=session_id, after=after)
            for event in page["events"]:
                for update in updates_for(event):
                    answered = answered or update["sessionUpdate"] == "agent_message_chunk"
                    await self.notify("session/update", {"sessionId": session_id, "update": update})
            after = page["lastSequence"]
            if page["done"] and not page["events"]:
                break
            if page["events"]:
                pause = POLL_SECONDS
            else:
                await asyncio.sleep(pause)
                pause = min(pause * 2, POLL_MAX_SECONDS)
        if page["cancelled"] or session_id in self.cancelled:
            return {"stopReason": "cancelled"}
        if page["error"]:
            raise BridgeError(-32603, f"child run failed: {page['error']}")
        if not answered and page["output"]:
            content = {"type": "text", "text": page["output"]}
            update = {"sessionUpdate": "agent_message_chunk", "content": content}
            await self.notify("session/update", {"sessionId": session_id, "update": update})
        return {"stopReason": "end_turn"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kodelet", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    acp = sub.add_parser("acp", help="serve ACP v1 on stdio; each session a Canopy child run")
    acp.add_argument("--profile", default="", help="the Canopy preset the sessions run on")
    # kodelet's other flags (--server, --runner, --max-turns, ...) mean nothing here.
    args, _rest = parser.parse_known_args(argv)
    if not os.environ.get(SOCKET_ENV):
        print(
            f"kodelet (Canopy): {SOCKET_ENV} is not set; this kodelet only runs inside an "
            "extension a Canopy runner hosts",
            file=sys.stderr,
        )
        return 2
    asyncio.run(Agent(args.profile).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())

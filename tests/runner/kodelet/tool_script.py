"""A scripted agent that uses the tools of its run's hosted kodelet extensions.

Its message is a JSON list of steps: ``{"tool": name, "input": {...}}`` calls a tool (a string
``"$name"`` in the input is the id of the agent spawned under that name), ``{"sleep": s}``
waits, ``{"until": name, "status": s}`` polls ``list_agents`` until that agent's run has the
status, ``{"processes": "kodelet"}`` waits (up to 10 s) until no ``kodelet acp`` of this run's
extensions is left and records how many were still there. Every call is recorded (as tool-use / tool-result events and in ``results``) so a test
sees what kodelet-subagent answered.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from delegation.client import Preset, RpcError, event
from delegation.runner.host import Outcome, RunContext
from delegation.runner.kodelet.engine import extensions_of
from delegation.runner.kodelet.hosted import SOCKET_ENV
from delegation.runner.scripted import ScriptedConfig, ScriptedEngine


class ToolScriptEngine:
    """``boss`` runs a tool script; every other preset is the scripted engine's."""

    name = "tool-script"
    cancel_grace = 2.0

    def __init__(self, scripted: ScriptedEngine | None = None):
        self.scripted = scripted or ScriptedEngine(
            ScriptedConfig(
                pace=0.02, steps=1, fanout=0, depth=0, tool_fail_rate=0.0, long_seconds=20
            )
        )
        self.results: dict[str, list[dict]] = {}

    def presets(self) -> list[Preset]:
        return [Preset("boss", "Delegates through kodelet-subagent."), *self.scripted.presets()]

    def check(self, command, host) -> None:
        if command.preset.name != "boss":
            self.scripted.check(command, host)

    async def run(self, ctx: RunContext) -> Outcome:
        if ctx.profile != "boss":
            return await self.scripted.run(ctx)
        tools = extensions_of(ctx)
        if tools is None:
            raise RpcError(-32603, "boss needs hosted extensions")
        ids: dict[str, str] = {}
        record = self.results.setdefault(ctx.run_id, [])
        for index, step in enumerate(json.loads(ctx.message)):
            ctx.check_cancel()
            if "sleep" in step:
                await ctx.sleep(step["sleep"])
                continue
            if "until" in step:
                await self.until(ctx, tools, ids[step["until"]], step["status"])
                continue
            if "processes" in step:
                sockets = [ext.bridge.path for ext in tools.hosted]
                left = await processes_gone(ctx, sockets)
                record.append({"tool": "processes", "result": {"content": str(left)}})
                continue
            name, call_id = step["tool"], f"call-{index}"
            tool_input = substitute(step.get("input", {}), ids)
            await ctx.emit(
                event("tool-use", tool_name=name, tool_call_id=call_id, input=tool_input)
            )
            result = await tools.call(name, tool_input, call_id)
            record.append({"tool": name, "input": tool_input, "result": result})
            data = result.get("structuredContent") or {}
            if name == "spawn_agent" and not result.get("error"):
                ids[tool_input["name"]] = data["agent_id"]
            await ctx.emit(
                event(
                    "tool-result",
                    str(result.get("content", ""))[:2000],
                    tool_name=name,
                    tool_call_id=call_id,
                    success=not result.get("error"),
                )
            )
        return Outcome(output=f"ran {len(record)} tool calls")

    async def until(self, ctx: RunContext, tools, agent_id: str, status: str) -> None:
        async with asyncio.timeout(30):
            while True:
                listed = await tools.call("list_agents", {})
                agents = (listed.get("structuredContent") or {}).get("agents", [])
                if any(a["agent_id"] == agent_id and a["status"] == status for a in agents):
                    return
                await ctx.sleep(0.1)


async def processes_gone(ctx: RunContext, sockets: list[str]) -> int:
    """How many ``kodelet acp`` processes serving these bridge sockets are left (their
    environment names the socket: another test's are not counted), waiting up to 10 s."""
    left = 0
    for _ in range(100):
        left = len(kodelet_processes(sockets))
        if not left:
            return 0
        await ctx.sleep(0.1)
    return left


def kodelet_processes(sockets: list[str]) -> list[int]:
    wanted = {f"{SOCKET_ENV}={path}".encode() for path in sockets}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = set(f.read().split(b"\0"))
        except OSError:
            continue
        if b"delegation.runner.kodelet.acp" in cmdline and wanted & environ:
            found.append(int(pid))
    return found


def substitute(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str) and value.startswith("$") and value[1:] in ids:
        return ids[value[1:]]
    if isinstance(value, dict):
        return {k: substitute(v, ids) for k, v in value.items()}
    return value

"""Runs of a preset with ``extensions`` host them for as long as the run lives.

:class:`ExtensionHosting` wraps any engine: before the engine runs a run of such a preset it
starts that preset's extensions (:class:`~.hosted.HostedExtension`), and it stops them when
the run ends, whichever way. The run's agent reaches their tools through
:func:`extensions_of` (``ctx.data["kodelet"]``): :class:`ToolBox` names each tool once.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from delegation.client import event
from delegation.runner.host import Outcome, RunContext
from delegation.runner.kodelet.hosted import HostedExtension
from delegation.runner.kodelet.spec import ExtensionSpec

log = logging.getLogger("canopy.runner.kodelet")

TOOLS_KIND = "extension-tools"  # read by delegation/mcp/extension_tools.py
CALL_METHOD = "extension.tool.call"


class ToolBox:
    """The tools of a run's hosted extensions, by name (the first extension wins a clash)."""

    def __init__(self, hosted: list[HostedExtension]):
        self.hosted = hosted

    def names(self) -> list[str]:
        seen: list[str] = []
        for ext in self.hosted:
            seen.extend(n for n in ext.tool_names() if n not in seen)
        return seen

    def describe(self) -> list[dict]:
        out, seen = [], set()
        for ext in self.hosted:
            for tool in ext.tools:
                if tool.get("name") in ext.tool_names() and tool["name"] not in seen:
                    seen.add(tool["name"])
                    out.append(tool)
        return out

    async def call(self, name: str, input: Any, tool_call_id: str = "") -> dict:
        for ext in self.hosted:
            if name in ext.tool_names():
                return await ext.call_tool(name, input, tool_call_id)
        for ext in self.hosted:
            if not ext.ready.is_set():
                return await ext.call_tool(name, input, tool_call_id)  # says it is restarting
        message = f"no hosted extension offers {name!r}"
        return {"content": message, "error": message}


def tools_event(box: ToolBox) -> dict:
    """The ``extension-tools`` event: what ``/mcp`` lists for the run (SPEC §15)."""
    tools = [
        {
            "name": t["name"],
            "description": t.get("description", ""),
            "inputSchema": t.get("inputSchema"),
        }
        for t in box.describe()
    ]
    return event(
        TOOLS_KIND, f"hosted tools: {', '.join(t['name'] for t in tools)}", input={"tools": tools}
    )


def extensions_of(ctx: RunContext) -> ToolBox | None:
    return ctx.data.get("kodelet")


class ExtensionHosting:
    """An engine whose runs of the presets in ``extensions`` host those kodelet extensions."""

    def __init__(self, inner: Any, extensions: Mapping[str, tuple[ExtensionSpec, ...]]):
        self.inner = inner
        self.extensions = {name: specs for name, specs in extensions.items() if specs}
        self.name = inner.name
        self.cancel_grace = inner.cancel_grace + 5  # the extensions stop after the agent
        self.boxes: dict[str, ToolBox] = {}  # runId -> the tools its extensions host
        self._served: set[int] = set()  # the clients answering extension.tool.call

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # steer, sandboxed, ... as the wrapped engine has

    def presets(self):
        return self.inner.presets()

    async def offer(self, ctx: RunContext, box: ToolBox) -> None:
        """Tell the server the run's hosted tools, and answer its calls of them."""
        if id(ctx.client) not in self._served:
            self._served.add(id(ctx.client))
            ctx.client.on(CALL_METHOD, self._on_call)
        await ctx.emit(tools_event(box))

    async def _on_call(self, params: dict, client) -> dict:
        """``extension.tool.call`` (from /mcp): the hosted tool's result is the answer."""
        box = self.boxes.get(str(params.get("runId", "")))
        name = str(params.get("name", ""))
        if box is None:
            message = f"run {params.get('runId')!r} hosts no extensions here (ended?)"
            return {"content": message, "error": message}
        return await box.call(name, params.get("input") or {}, str(params.get("toolCallId", "")))

    def check(self, command, host) -> None:
        self.inner.check(command, host)

    async def run(self, ctx: RunContext) -> Outcome:
        specs = self.extensions.get(ctx.profile, ())
        if not specs:
            return await self.inner.run(ctx)
        # Short: a Unix socket path must fit in 108 bytes.
        workdir = Path(tempfile.mkdtemp(prefix="ck-"))
        hosted: list[HostedExtension] = []
        forkable = frozenset(p.name for p in self.inner.presets() if p.can_fork)
        try:
            for index, spec in enumerate(specs):
                cwd = getattr(self.inner, "workspace", None)
                ext = HostedExtension(spec, ctx, workdir / str(index), index, cwd, forkable)
                hosted.append(ext)
                await ext.start()
            box = ctx.data["kodelet"] = self.boxes[ctx.run_id] = ToolBox(hosted)
            await self.offer(ctx, box)
            return await self.inner.run(ctx)
        finally:
            self.boxes.pop(ctx.run_id, None)
            for ext in reversed(hosted):
                with contextlib.suppress(Exception):
                    await ext.stop()
            shutil.rmtree(workdir, ignore_errors=True)


def host_extensions(engine: Any) -> Any:
    """``engine`` wrapped in :class:`ExtensionHosting` when a preset of it lists extensions
    (a presets file's ``"extensions"``), else ``engine`` itself."""
    presets = getattr(engine, "presets_by_name", {}) or {}
    extensions = {name: tuple(getattr(p, "extensions", ())) for name, p in presets.items()}
    if not any(extensions.values()):
        return engine
    return ExtensionHosting(engine, extensions)

"""A kodelet extension written with kodelet's own SDK (kodelet-sdk from PyPI) that uses the
host methods kodelet-subagent does not: a tool update, a notification, a confirmation, a
choice, a line of text; a tool its ``agent.init`` handler disables; and one that dies, so its host's restart shows. Run as ``python kodelet_probe.py``."""

from __future__ import annotations

import hashlib
import os

from kodelet_sdk import BaseModel, Extension, ToolContext

ext = Extension(name="probe", version="1.0")


class AskInput(BaseModel):
    question: str


class NoInput(BaseModel):
    pass


@ext.tool("ask", description="Ask the operator a yes/no question", input_schema=AskInput)
async def ask(input: AskInput, ctx: ToolContext) -> str:
    await ctx.update("thinking about it")
    await ctx.ui.notify("asking the operator")
    confirmed = await ctx.ui.confirm({"title": input.question, "message": "Say yes or no"})
    return f"confirmed={confirmed}"


@ext.tool("pick", description="Ask the operator to pick a colour", input_schema=NoInput)
async def pick(_input: NoInput, ctx: ToolContext) -> str:
    value = await ctx.ui.select({"title": "Which colour?", "options": ["red", "green"]})
    return f"picked={value}"


class NameInput(BaseModel):
    title: str
    secret: bool = False


@ext.tool("name_it", description="Ask the operator for a line of text", input_schema=NameInput)
async def name_it(input: NameInput, ctx: ToolContext) -> str:
    asked = {"title": input.title, "message": "Name the release", "placeholder": "e.g. Aspen"}
    if input.secret:
        asked["secret"] = True  # kodelet's flag for a password-like answer
    value = await ctx.ui.input(asked)
    if input.secret:
        # Proves the extension got the answer without putting it in the run's events.
        return f"secret sha256={hashlib.sha256(str(value).encode()).hexdigest()}"
    return f"named={value}"


@ext.tool("hidden", description="Disabled by agent.init", input_schema=NoInput)
async def hidden(_input: NoInput, _ctx: ToolContext) -> str:
    return "hidden ran"


@ext.on("agent.init")
async def init(_event, _ctx) -> dict:
    return {"tools": {"disable": ["hidden"]}}


@ext.tool("pid", description="This process's id", input_schema=NoInput)
async def pid(_input: NoInput, _ctx: ToolContext) -> str:
    return str(os.getpid())


@ext.tool("die", description="Exit at once", input_schema=NoInput)
async def die(_input: NoInput, _ctx: ToolContext) -> str:
    os._exit(3)


if __name__ == "__main__":
    ext.run_sync()

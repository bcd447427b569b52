"""``contextMode: "fork"`` on an ACP agent (SPEC §14): the child's agent runs ``session/fork``
of its live parent's session. claude-agent-acp forks by resuming the parent's Claude Code
transcript (``~/.claude/projects/<cwd>/<session>.jsonl``, its ACP session id is Claude Code's)
as a new session, so a sandboxed child's private HOME first gets a copy of the parent's, as
the command engine does for Claude Code (:mod:`delegation.runner.fork`)."""

from __future__ import annotations

import asyncio

from delegation.runner import fork
from delegation.runner.acp.presets import AcpPreset, AcpRefused
from delegation.runner.host import RunContext
from delegation.runner.sandbox import account


async def prepare(ctx: RunContext, preset: AcpPreset, capabilities, cwd: str) -> str:
    """The parent's ACP session id, its transcript in this child's HOME; AcpRefused (the child
    fails saying why) when there is nothing to fork or the agent does not fork."""
    sessions = getattr(capabilities, "session_capabilities", None) if capabilities else None
    if not preset.can_fork or getattr(sessions, "fork", None) is None:
        raise AcpRefused(
            f"contextMode fork: preset {preset.name}'s ACP agent offers no session/fork"
        )
    parent_id = getattr(ctx.identity, "parent_run_id", "") or ""
    parent = ctx.host.runs.get(parent_id)
    live = parent.data.get("acp_session") if parent is not None and not parent.finished else None
    session = getattr(live, "session_id", "") or ""
    if not session:
        raise AcpRefused(f"contextMode fork: parent run {parent_id!r} has no live ACP session here")
    if not fork.SESSION_ID.fullmatch(session):
        raise AcpRefused(f"contextMode fork: parent run {parent_id}'s session id is malformed")
    home, parent_home = ctx.data.get("private_home"), parent.data.get("private_home")
    if home is not None and parent_home is not None:
        # The parent's agent may not have written its transcript yet (see fork.TRANSCRIPT_WAIT).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + fork.TRANSCRIPT_WAIT
        while not fork.copy_transcript(session, parent_home.path, home.path, cwd, account(preset)):
            if loop.time() >= deadline:
                raise AcpRefused(f"contextMode fork: no transcript of session {session}")
            await asyncio.sleep(0.1)
    return session

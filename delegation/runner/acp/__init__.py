"""The ``acp`` engine: every child is an Agent Client Protocol agent process (SPEC §9).

Per child the engine starts the preset's command (``claude-code-acp``, ``codex-acp``,
``gemini --experimental-acp``, ``goose acp``, ...) in its own process group, with the same
environment rules as the ``command`` engine, and drives it as the ACP *client* with the
``agent-client-protocol`` package:

- ``initialize``, then ``session/new`` with the child's cwd and, when the runner has them,
  Canopy's MCP server (http, the run token and ``X-Pando-Delegation-Depth`` as headers) in
  ``mcpServers``; ``session/prompt`` with the message;
- ``session/update`` notifications become events: message and thought chunks are coalesced
  into one ``text`` / ``thinking`` event per message, tool calls become ``tool-use`` and
  their updates ``tool-update`` / ``tool-result`` with the agent's ids and status, plans
  ``plan``, ``usage_update`` (and a turn's own usage) ``usage``;
- a steer during a turn is queued and sent as the next ``session/prompt`` when the turn ends
  (``injected``); once the session has ended it is ``promptRequired``;
- a cancel sends ``session/cancel``, waits the preset's grace for the turn to end, then stops
  the process (SIGTERM to its group, SIGKILL after the grace);
- permission requests are answered by the preset's policy: tool kinds on its allow-list are
  allowed once, everything else is rejected; each decision is a ``permission`` event;
- a resumed child (``request.resume``) is ``session/load``-ed when the agent offers it and this
  runner knows the agent's session id for that conversation; otherwise the run fails with a
  reason saying which of the two is missing.

The run token comes from the server (``run.mcpToken``); a server that gives none (an older
one, without ``/mcp``) leaves the agent without Canopy's tools, said in an ``error`` event. It
is asked for before the agent starts: a preset with ``mcpTokenVia: env`` sends the header as
``Bearer ${CANOPY_RUN_TOKEN}`` and gives the agent the token in its environment. The
``mcp`` argument replaces how the token is obtained (tests).
"""

from __future__ import annotations

from delegation.runner.acp.engine import STDERR_TAIL, STREAM_LIMIT, AcpEngine, McpProvider
from delegation.runner.acp.presets import TOOL_KINDS, AcpPreset, AcpRefused
from delegation.runner.acp.session import CHUNK_MAX_AGE, Session

__all__ = [
    "CHUNK_MAX_AGE",
    "STDERR_TAIL",
    "STREAM_LIMIT",
    "TOOL_KINDS",
    "AcpEngine",
    "AcpPreset",
    "AcpRefused",
    "McpProvider",
    "Session",
]

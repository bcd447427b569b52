"""The MCP front door (SPEC §9): ``/mcp``, streamable HTTP, served by the official ``mcp`` SDK.

A transport like the runner socket: each tool authenticates the run token, builds the caller
(the token's run as the parent, on its runner's current connection, ``via`` mcp), decodes its
arguments with the same strict schemas and calls the same typed child service as the §6
method it mirrors. A service refusal becomes an ``isError`` result whose
``structuredContent`` is ``{"code", "message"}`` with the §6 code.

Stateless streamable HTTP (no MCP session kept in the process), so any server process behind
the load balancer answers any call. ``waitSeconds`` waits on the run's doorbell on the
channel layer: no database connection and no thread is held while a call waits.

Split by reason to change:

- ``gate``: the ASGI door (routing ``/mcp``, the bearer check before the SDK sees a byte,
  the SDK session manager's lifespan);
- ``calls``: one tool call (the caller from its run token and declared depth, the service
  call on the database thread, the answer or the §9 refusal);
- ``tools``: the tools and the service each calls;
- ``waiting``: ``waitSeconds`` (doorbell waits, progress notifications).
"""

from delegation.mcp.gate import McpGate
from delegation.mcp.tools import build_server

__all__ = ["McpGate", "build_server"]

"""Children (SPEC §6): the caller's authority, start (caps, narrowing, resume), and the read,
cancel, steer and lease release of children a caller owns.

Typed on purpose: the runner socket (``delegation.runner_socket.methods``) and the MCP server
(``delegation.mcp``) call these with a ``Caller`` and validated ``Params``; nothing here knows
about JSON-RPC framing or MCP.

By job: ``authority`` (who may act on a child), ``start`` (``child.start``), ``owned`` (read,
cancel, steer and lease release). The names below are what the doors call.
"""

from delegation.services.children.authority import lease_of
from delegation.services.children.owned import (
    cancel_child,
    read_child,
    read_children,
    release_child_lease,
    steer_child,
)
from delegation.services.children.start import narrow_options, start_child

__all__ = [
    "cancel_child",
    "lease_of",
    "narrow_options",
    "read_child",
    "read_children",
    "release_child_lease",
    "start_child",
    "steer_child",
]

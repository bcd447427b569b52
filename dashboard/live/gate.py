"""Who may open the live socket: the Origin check and session auth for browsers, or a bearer
API token for scripts, and the role behind either."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator

from delegation import roles
from delegation.protocol import bearer_token
from delegation.services import tokens


class LiveGate:
    """Origin check and session auth for browsers; a bearer token stands on its own.

    A browser cannot put an ``Authorization`` header on a WebSocket handshake, so a handshake
    that carries one cannot be a cross-site hijack of a session; it still has its Origin
    checked when it sends one.
    """

    def __init__(self, inner):
        self.browser = AllowedHostsOriginValidator(AuthMiddlewareStack(inner))
        self.origin_checked = AllowedHostsOriginValidator(inner)
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if not bearer_token(scope.get("headers", [])):
            return await self.browser(scope, receive, send)
        scope = dict(scope, user=None)
        if any(key.lower() == b"origin" for key, _ in scope.get("headers", [])):
            return await self.origin_checked(scope, receive, send)
        return await self.inner(scope, receive, send)


def authorise(user, token: str):
    """The user behind the session or the bearer token, and their role (or None)."""
    if token:
        user = tokens.authenticate_api_token(token)
    if user is None or not getattr(user, "is_authenticated", False):
        return None, None
    return user, roles.role_of(user)


def can_act(user) -> bool:
    return roles.can_act(user)

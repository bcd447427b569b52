"""Who may open the live socket: the Origin check and session auth for browsers, or a bearer
API token for scripts, and the role behind either."""

from __future__ import annotations

from importlib import import_module
from urllib.parse import urlsplit

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.core.exceptions import ValidationError
from django.http.request import split_domain_port, validate_host
from django.utils.crypto import constant_time_compare

from dashboard import sso
from delegation import roles
from delegation.models import hash_token
from delegation.protocol import CLOSE_FORBIDDEN, CLOSE_UNAUTHORIZED, bearer_token
from delegation.selectors.credentials import active_user_pks, holding_token_hashes
from delegation.services import tokens

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _origin_key(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the scheme's default port filled in, or None if malformed."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def _own_scheme(scope) -> str:
    if scope.get("scheme") in ("wss", "https"):
        return "https"
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name = proxy[0].removeprefix("HTTP_").lower().replace("_", "-").encode("latin-1")
        forwarded = _header(scope, name)
        if forwarded is not None and forwarded.split(",")[0].strip() == proxy[1]:
            return "https"
    return "http"


def origin_allowed(scope) -> bool:
    """The exact origin check: the page's Origin must be this very server (same scheme,
    host and port as the request itself) or one of ``CSRF_TRUSTED_ORIGINS``.

    Comparing host names only would let a page on another port of the same host (any dev
    server an agent starts) ride the operator's cookies, which browsers share across ports.
    """
    origin = _header(scope, b"origin")
    if not origin:
        return False
    parts = urlsplit(origin)
    wanted = _origin_key(parts.scheme.lower(), parts.netloc)
    if wanted is None:
        return False
    host = _header(scope, b"host")
    if host:
        domain, _port = split_domain_port(host)
        allowed = settings.ALLOWED_HOSTS
        if settings.DEBUG and not allowed:
            allowed = [".localhost", "127.0.0.1", "[::1]"]
        if domain and validate_host(domain, allowed):
            if wanted == _origin_key(_own_scheme(scope), host):
                return True
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        trusted_parts = urlsplit(trusted)
        if wanted == _origin_key(trusted_parts.scheme.lower(), trusted_parts.netloc):
            return True
    return False


class ExactOriginValidator:
    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.inner(scope, receive, send)


class LiveGate:
    """Origin check and session auth for browsers; a bearer token stands on its own.

    A browser cannot put an ``Authorization`` header on a WebSocket handshake, so a handshake
    that carries one cannot be a cross-site hijack of a session; it still has its Origin
    checked when it sends one.
    """

    def __init__(self, inner):
        self.browser = ExactOriginValidator(AuthMiddlewareStack(inner))
        self.origin_checked = ExactOriginValidator(inner)
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


def recheck(user_pk: int, session_key: str | None, token: str) -> int | None:
    """Whether a live socket still holds its authority: None, or the close code that ends it.

    4401 when the credential no longer holds (a logout or expired session, a password
    change, a deactivated user, a revoked or expired API token); 4403 when the user is still
    who they were but no longer has the viewer role.
    """
    if token:
        user = tokens.active_api_token_user(token)
        if user is None or user.pk != user_pk:
            return CLOSE_UNAUTHORIZED
        if user.is_active:
            sso.recheck_user(user)  # a provider's user: the role its groups give now
    else:
        user = _session_user(session_key)
        if user is None or user.pk != user_pk:
            return CLOSE_UNAUTHORIZED
        # Signed in through the identity provider: its groups decide the role (issue 28).
        if user.is_active and sso.recheck_session(user, session_key) == "ended":
            return CLOSE_UNAUTHORIZED
    if not user.is_active:
        return CLOSE_UNAUTHORIZED
    if roles.role_of(user) is None:
        return CLOSE_FORBIDDEN
    return None


def lapsed(credentials: list[tuple[int, str]]) -> list[int]:
    """Of ``(user pk, API token or "")`` pairs, the indexes whose credential no longer holds
    by the cheap test: a token revoked, expired or of an inactive user; a session's user
    inactive. Two queries for any number of sockets (``credential_watch``'s tick); a session
    logged out, a changed password or a lost role wait for the heartbeat's full ``recheck``."""
    hashes = {hash_token(token) for _pk, token in credentials if token}
    held = holding_token_hashes(hashes) if hashes else set()
    session_users = {pk for pk, token in credentials if not token}
    active = active_user_pks(session_users) if session_users else set()
    return [
        index
        for index, (pk, token) in enumerate(credentials)
        if (token and hash_token(token) not in held) or (not token and pk not in active)
    ]


def _session_user(session_key: str | None):
    """The user a session still signs in, as ``django.contrib.auth.get_user`` decides it."""
    if not session_key:
        return None
    engine = import_module(settings.SESSION_ENGINE)
    session = engine.SessionStore(session_key)
    # load() answers {} for a deleted (logged out) or expired session.
    data = session.load()
    try:
        user_pk = get_user_model()._meta.pk.to_python(data[SESSION_KEY])
        backend_path = data[BACKEND_SESSION_KEY]
    except (KeyError, ValidationError):
        return None
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    user = load_backend(backend_path).get_user(user_pk)
    if user is None:
        return None
    # A password change rotates the session hash: sessions signed in before it end.
    stored = data.get(HASH_SESSION_KEY) or ""
    if not constant_time_compare(stored, user.get_session_auth_hash()):
        return None
    return user

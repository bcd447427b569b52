"""HTTP hardening the settings switch on: a Content-Security-Policy on every response, and
sign-in throttling (django-axes) that leaves sign-ins without a request alone and keys on the
client's address as the trusted proxies in front of the server saw it."""

from __future__ import annotations

import ipaddress

from axes.backends import AxesStandaloneBackend
from django.conf import settings


class ContentSecurityPolicyMiddleware:
    """No inline script or style anywhere (the pages need none): an injected ``<script>`` or
    ``on*=`` attribute does not run. Sockets may go to this host only, over ws or wss."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy(request.get_host())
        return response


def policy(host: str) -> str:
    directives = {
        "default-src": "'self'",
        "script-src": "'self'",
        "style-src": "'self'",
        "img-src": "'self' data:",
        "font-src": "'self'",
        "connect-src": f"'self' ws://{host} wss://{host}",
        "object-src": "'none'",
        "base-uri": "'self'",
        "form-action": "'self'",
        "frame-ancestors": "'none'",
    }
    if settings.SECURE_SSL_REDIRECT:
        directives["upgrade-insecure-requests"] = ""
    return "; ".join(f"{name} {value}".strip() for name, value in directives.items())


class SignInThrottle(AxesStandaloneBackend):
    """Axes refuses a sign-in without a request; those (management commands, code) are not a
    password-guessing surface, so they pass through to the next backend instead."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def client_address(request) -> str | None:
    """The address sign-in throttling keys on (``AXES_CLIENT_IP_CALLABLE``).

    With ``CANOPY_TRUSTED_PROXIES`` = 0 (no proxy) it is ``REMOTE_ADDR``; any
    ``X-Forwarded-For`` is the client's own text and is ignored. Behind N proxies, each
    appending the address it was connected from, the client is the N-th entry from the right:
    everything left of it came from the client and may be forged. A request with fewer
    entries (one that did not pass every proxy) or a malformed entry falls back to
    ``REMOTE_ADDR``, so a forged header never picks the key.
    """
    remote = request.META.get("REMOTE_ADDR") or None
    trusted = settings.CANOPY_TRUSTED_PROXIES
    if trusted <= 0:
        return remote
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    hops = [hop for hop in hops if hop]
    if len(hops) < trusted:
        return remote
    try:
        return str(ipaddress.ip_address(hops[-trusted]))
    except ValueError:
        return remote

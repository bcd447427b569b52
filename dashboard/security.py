"""HTTP hardening the settings switch on: a Content-Security-Policy on every response, and
sign-in throttling (django-axes) that leaves sign-ins without a request alone."""

from __future__ import annotations

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

"""``GET /metrics``: the Prometheus text format, for loopback scrapers and admin API tokens.

A scraper on the same machine (REMOTE_ADDR in 127.0.0.0/8 or ::1, and no proxy header saying
the request came from further away) needs nothing; anyone else sends an admin's API token,
``Authorization: Bearer <token>``. Everything else is 403.
"""

from __future__ import annotations

import ipaddress

from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from delegation import metrics, roles
from delegation.services import tokens

# A reverse proxy on this machine makes every client look local; one that says where the
# request came from (as the README's nginx example does) must not open /metrics to the world.
FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP", "HTTP_FORWARDED")


def _loopback(request) -> bool:
    if any(request.META.get(name) for name in FORWARDING_HEADERS):
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def _admin_token(request) -> bool:
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    user = tokens.authenticate_api_token(token.strip())
    return user is not None and roles.can_admin(user)


def _refuse(message: str) -> HttpResponse:
    return HttpResponse(message + "\n", status=403, content_type="text/plain; charset=utf-8")


@require_GET
def metrics_view(request):
    if not (_loopback(request) or _admin_token(request)):
        return _refuse(
            "forbidden: /metrics is open to loopback clients and to admin API tokens "
            "(Authorization: Bearer <token>)"
        )
    return HttpResponse(metrics.scrape(), content_type=CONTENT_TYPE_LATEST)

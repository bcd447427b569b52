"""What every page shares: the role gate, the page context, a refusal as a page, the run
lookups that answer 404 or 410, an action form's reason, and the filters' time windows."""

from __future__ import annotations

from datetime import timedelta
from functools import wraps

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse

from dashboard.views.form_errors import NUL_STATUS, nul_message
from delegation import roles, selectors
from delegation.errors import PermissionRefused, RpcError, http_status
from delegation.models import Run, RunStatus
from delegation.selectors.retention import purged_run
from delegation.services.run_actions import Actor

SINCE_CHOICES = (
    ("", "Any time"),
    ("15m", "Last 15 minutes"),
    ("1h", "Last hour"),
    ("24h", "Last 24 hours"),
    ("7d", "Last 7 days"),
    ("30d", "Last 30 days"),
)
SINCE_DELTAS = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
STATUS_ORDER = [s.value for s in RunStatus]


def refuse(request, message: str, status: int = 403):
    return render(
        request,
        "forbidden.html" if status == 403 else "error.html",
        page_context(request, message=message, status=status),
        status=status,
    )


def refused(request, exc: PermissionRefused | RpcError):
    """A service's refusal as a page, at the status the REST API gives the same refusal."""
    status, _code = http_status(exc)
    if isinstance(exc, PermissionRefused):
        return refuse(request, f"Refused: {exc}", status=status)
    return refuse(request, exc.message, status=status)


def viewer_required(view):
    """Signed in and holding at least the viewer role."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect(f"{reverse('login')}?next={request.get_full_path()}")
        if not roles.can_view(request.user):
            return refuse(
                request,
                f"{request.user.get_username()} has no role in Canopy. Ask an admin to grant "
                "you viewer, operator or admin.",
            )
        return view(request, *args, **kwargs)

    return wrapped


def page_context(request, **extra) -> dict:
    role = roles.role_of(request.user) if request.user.is_authenticated else None
    context = {
        "role": role or "",
        "can_act": roles.has_role(request.user, roles.OPERATOR) if role else False,
        "can_admin": roles.has_role(request.user, roles.ADMIN) if role else False,
    }
    context.update(extra)
    return context


millis = selectors.millis


def purged_page(request, run_id: str):
    """A run deleted by retention answers 410 with a page that says so (issue 28)."""
    tomb = purged_run(run_id)
    if tomb is None:
        return None
    return render(request, "purged.html", page_context(request, tomb=tomb), status=410)


def run_or_404(run_id: str) -> Run:
    run = selectors.get_run(run_id)
    if run is None:
        raise Http404(f"no run {run_id!r}")
    return run


def actor_of(request) -> Actor:
    return Actor.for_user(request.user, via="dashboard")


def redirect_done(request, run: Run, message: str, level=messages.SUCCESS):
    messages.add_message(request, level, message)
    return redirect("run", run.run_id)


REASON_MAX = 500


def form_reason(request, *, done: str):
    """``(reason, None)`` for an action form's optional ``reason`` (trimmed, at most
    ``REASON_MAX`` characters; empty: "<done> from the dashboard by <user>", so the audit says
    who), or ``("", refusal page)`` when it holds NUL, at the status REST refuses it with."""
    reason = request.POST.get("reason", "")
    if "\x00" in reason:  # REST refuses NUL (issue 38)
        return "", refuse(request, nul_message("reason"), status=NUL_STATUS)
    default = f"{done} from the dashboard by {request.user.get_username()}"
    return reason.strip()[:REASON_MAX] or default, None

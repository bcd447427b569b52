"""The leases page (issue 38): every lease, newest first, filtered by runner and state, with
the holder run named by its task and a *Release* button for operators on a live one. The
release posts to the same view as the run page's (``views.lease_release``), which goes
through the operator service (role check, audit) like REST and the admin."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from dashboard.views import _context, viewer_required
from delegation import selectors
from delegation.models import LeaseState, Runner

LEASES_PER_PAGE = 100
STATES = [("live", "Live")] + [(s.value, s.label) for s in LeaseState]


@require_GET
@viewer_required
def leases(request):
    runner = request.GET.get("runner", "").strip()
    state = request.GET.get("state", "").strip()
    now = timezone.now()
    rows = selectors.leases_matching(
        runner=runner or None,
        state=state if state in LeaseState.values else None,
        live=True if state == "live" else None,
        now=now,
    ).order_by("-created_at", "-pk")
    page = Paginator(rows, LEASES_PER_PAGE).get_page(request.GET.get("page"))
    items = []
    for row in page:
        live = row["state"] == LeaseState.ACTIVE and row["expiresAt"] > now
        items.append({**row, "live": live, "expires_ms": selectors.millis(row["expiresAt"])})
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "leases.html",
        _context(
            request,
            items=items,
            page=page,
            f={"runner": runner, "state": state},
            runners=list(Runner.objects.order_by("name").values_list("name", flat=True)),
            states=STATES,
            next_url=request.get_full_path(),
            query_string=query.urlencode(),
        ),
    )

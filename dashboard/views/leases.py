"""The leases page (issue 38): every lease, newest first, filtered by runner and state, with
the holder run named by its task and a *Release* button for operators on a live one. The run
page's release and this one post to ``lease_release`` below, which goes through the operator
service (role check, audit) like REST and the admin."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from dashboard.views.base import actor_of, page_context, refused, viewer_required
from delegation import selectors
from delegation.errors import PermissionRefused, RpcError
from delegation.models import LeaseState
from delegation.services.run_actions import release_lease

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
        page_context(
            request,
            items=items,
            page=page,
            f={"runner": runner, "state": state},
            runners=list(selectors.runner_names()),
            states=STATES,
            next_url=request.get_full_path(),
            query_string=query.urlencode(),
        ),
    )


@require_POST
@viewer_required
def lease_release(request, pk):
    lease = selectors.get_lease(pk)
    if lease is None:
        raise Http404(f"no lease {pk}")
    try:
        report = release_lease(actor_of(request), lease)
    except (PermissionRefused, RpcError) as exc:
        return refused(request, exc)
    pending = report["pending"]
    text = f"Lease {lease.lease_id} {report['state']}" + (
        f"; waiting for {len(pending)} child run(s) to stop" if pending else ""
    )
    messages.success(request, text)
    target = request.POST.get("next", "")
    if target.startswith("/") and not target.startswith("//"):
        return redirect(target)
    if lease.parent_run_id:
        return redirect("run", lease.parent_run.run_id)
    return redirect("trees")

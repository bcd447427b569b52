"""The runners page and the audit log."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from dashboard.views.base import (
    SINCE_CHOICES,
    SINCE_DELTAS,
    page_context,
    viewer_required,
)
from delegation import selectors
from delegation.models import AuditEntry

AUDIT_PER_PAGE = 100


@require_GET
@viewer_required
def runners(request):
    rows = selectors.runner_overview()
    return render(request, "runners.html", page_context(request, rows=rows))


@require_GET
@viewer_required
def audit(request):
    params = request.GET
    f = {
        key: params.get(key, "").strip()
        for key in ("actor", "action", "via", "target", "outcome", "since")
    }
    entries = selectors.audit_entries(
        actor=f["actor"],
        action=f["action"],
        via=f["via"],
        target_id=f["target"],
        outcome=f["outcome"],
        created_after=(
            timezone.now() - SINCE_DELTAS[f["since"]] if f["since"] in SINCE_DELTAS else None
        ),
    )
    page = Paginator(entries, AUDIT_PER_PAGE).get_page(params.get("page"))
    query_string = params.copy()
    query_string.pop("page", None)
    context = page_context(
        request,
        page=page,
        f=f,
        actions=selectors.audit_actions(),
        vias=[v.value for v in AuditEntry.Via],
        since_choices=SINCE_CHOICES,
        query_string=query_string.urlencode(),
    )
    return render(request, "audit.html", context)

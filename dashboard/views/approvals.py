"""The approvals inbox (SPEC §11): every pending approval across trees, oldest first.

The page renders what is pending now; ``inbox.js`` then re-reads ``/api/approvals`` whenever
the live socket's approvals doorbell rings (``dashboard.live.approvals``) and decides through ``POST /api/approvals/{approvalId}/decision`` (the session and its CSRF
token), the one service every door calls, so a decision here is audited like any other.
"""

from __future__ import annotations

from django.shortcuts import render
from django.views.decorators.http import require_GET

from dashboard.views.base import page_context, viewer_required
from delegation.selectors import approvals as reads


@require_GET
@viewer_required
def inbox(request):
    pending = [reads.approval_wire(a) for a in reads.pending_approvals()]
    return render(request, "approvals.html", page_context(request, pending=pending))

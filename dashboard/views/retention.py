"""The retention pages (issue 28): what the next pass deletes and the last passes (admins),
and the keep flag's form. (A purged run's page is ``base.purged_page``.)"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from dashboard.views.base import page_context, refuse, viewer_required
from delegation import roles
from delegation.errors import PermissionRefused
from delegation.models import AuditEntry
from delegation.selectors import retention as due
from delegation.services.identity import Actor
from delegation.services.retention import do_set_keep


@require_GET
@viewer_required
def retention(request):
    if not roles.can_admin(request.user):
        return refuse(request, "The retention page is for admins.")
    context = page_context(
        request,
        preview=due.preview(),
        passes=due.last_passes(),
        kept=due.kept_trees(),
        batch_size=settings.RETENTION_BATCH_SIZE,
        interval=settings.RETENTION_INTERVAL_SECONDS,
    )
    return render(request, "retention.html", context)


@require_POST
@viewer_required
def keep(request):
    run_id = request.POST.get("run_id", "").strip()
    wanted = request.POST.get("keep", "1") == "1"
    try:
        do_set_keep(
            actor=Actor.for_user(request.user, AuditEntry.Via.DASHBOARD), run_id=run_id, keep=wanted
        )
    except PermissionRefused as exc:
        return refuse(request, f"Refused: {exc}")
    messages.success(request, f"Tree {run_id} is {'kept' if wanted else 'no longer kept'}.")
    return redirect("retention")

"""A run's page (identity, usage and budget bars, leases, approvals) and its cancel form."""

from __future__ import annotations

import json
import uuid

from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from dashboard.views.base import (
    actor_of,
    form_reason,
    millis,
    page_context,
    purged_page,
    redirect_done,
    refused,
    run_or_404,
    viewer_required,
)
from delegation import selectors
from delegation.errors import PermissionRefused, RpcError
from delegation.models import Run
from delegation.services.run_actions import do_cancel_run


@require_GET
@viewer_required
def run_detail(request, run_id):
    if gone := purged_page(request, run_id):
        return gone
    return render(request, "run.html", run_context(request, run_or_404(run_id)))


_IDENTITY = (  # the wire Result's fields, in words (issue 38)
    ("runId", "run"),
    ("conversationId", "conversation"),
    ("runnerId", "runner"),
    ("hostInstanceId", "host instance"),
    ("parentRunId", "parent run"),
    ("parentConversationId", "parent conversation"),
    ("extensionId", "extension"),
    ("profile", "profile"),
    ("depth", "depth"),
    ("status", "status"),
    ("done", "done"),
    ("cancelled", "cancelled"),
)


def run_context(request, run: Run, **extra) -> dict:
    """The run page's context; a form that failed (``dashboard.views.run_forms``) adds what was
    typed and the error, so the page is shown again around it."""
    live = selectors.live_descendant_count(run)
    result = selectors.snapshot(run)
    del result["events"]
    held = selectors.leases_held_by(run)
    under = run.lease
    report, report_rows = selectors.cancel_report(run)
    root = run.root or run
    context = page_context(
        request,
        run=run,
        result=result,
        root=root,
        identity=[(key, label, result[key]) for key, label in _IDENTITY],
        live_descendants=live,
        links=selectors.relaunch_links(run),
        stop_subtree=live + (0 if run.is_terminal else 1),
        held_leases=[
            {"lease": lease, "expires_ms": millis(lease.expires_at), "live": lease.is_live()}
            for lease in held
        ],
        under_lease=under,
        under_lease_ms=millis(under.expires_at) if under else None,
        report=report,
        report_ms=millis(report.created_at) if report else None,
        report_rows=report_rows,
        steer_request_id=f"dash-{uuid.uuid4().hex[:16]}",
        created_ms=millis(run.created_at),
        finished_ms=millis(run.finished_at),
        children=selectors.child_counts(run),
        **_usage_context(run),
        started=selectors.run_request(run),
        pending_approvals=_pending_approvals(run),
        approval_policy_json=_policy_json(run),
    )
    context.update(extra)
    return context


def _policy_json(run: Run) -> str:

    from delegation.selectors import approvals

    policy = approvals.policy_of(run)
    return json.dumps(policy, indent=2) if policy is not None else ""


def _pending_approvals(run: Run) -> list[dict]:
    from delegation.selectors import approvals

    return [approvals.approval_wire(a) for a in approvals.pending_of_run(run)]


BUDGET_FIELDS = (
    ("maxRuns", "Runs started", "1"),
    ("maxLive", "Running at once", "1"),
    ("maxTokens", "Tokens (in + out)", "1"),
    ("maxCostUsd", "Cost (USD)", "0.01"),
    ("maxSeconds", "Seconds running", "1"),
)


def _usage_context(run: Run) -> dict:
    usage, budget = selectors.usage_of_run(run)
    bars = []
    if budget is not None:
        for name, label, _step in BUDGET_FIELDS:
            limit = budget["limits"].get(name)
            if limit is None:
                continue
            fraction = limit["fraction"]
            bars.append(
                {
                    "name": name,
                    "label": label,
                    "limit": limit["limit"],
                    "used": limit["used"],
                    "percent": min(100, round(fraction * 100)),
                    "level": "over" if fraction >= 1 else "warn" if fraction >= 0.8 else "ok",
                    "note": budget["costUnbounded"] if name == "maxCostUsd" else "",
                }
            )
    limits = budget["limits"] if budget else {}
    return {
        "usage": usage,
        "budget": budget,
        "budget_bars": bars,
        "budget_fields": [
            (name, label, step, limits[name]["limit"] if name in limits else "")
            for name, label, step in BUDGET_FIELDS
        ],
    }


@require_POST
@viewer_required
def run_cancel(request, run_id):
    run = run_or_404(run_id)
    cascade = request.POST.get("cascade") in ("1", "true", "on")
    reason, nul_page = form_reason(request, done="cancelled")
    if nul_page is not None:
        return nul_page
    try:
        report = do_cancel_run(actor_of(request), run, reason=reason, cascade=cascade)
    except (PermissionRefused, RpcError) as exc:
        return refused(request, exc)
    stopped = len(report["descendants"])
    text = f"Cancel {report['outcome']} for {run.run_id}" + (
        f" and {stopped} live descendant{'s' if stopped != 1 else ''}" if cascade else ""
    )
    return redirect_done(request, run, text)

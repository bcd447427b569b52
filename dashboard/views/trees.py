"""The trees overview (filters, headline numbers) and a tree's page."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from dashboard.views.base import (
    SINCE_CHOICES,
    SINCE_DELTAS,
    STATUS_ORDER,
    millis,
    page_context,
    purged_page,
    run_or_404,
    viewer_required,
)
from delegation import roles, selectors

TREES_PER_PAGE = 50


def _overview() -> dict:
    """The trees page's headline numbers, and the same as JSON for its charts."""
    numbers = selectors.overview_numbers()
    as_json = {
        **numbers,
        "at": millis(numbers["at"]),
        "costByHour": [
            {"hourStart": millis(h["hourStart"]), "costUsd": h["costUsd"]}
            for h in numbers["costByHour"]
        ],
    }
    return {"overview": numbers, "overview_json": as_json}


@require_GET
def home(request):
    """Open on a live tree: the newest tree that is still running, else the overview."""
    if request.user.is_authenticated and roles.can_view(request.user):
        live = selectors.newest_running_root_id()
        if live:
            return redirect("tree", live)
    return redirect("trees")


# --- Trees overview ----------------------------------------------------------------------------


@require_GET
@viewer_required
def trees(request):
    params = request.GET
    status = params.get("status", "")
    runner = params.get("runner", "")
    profile = params.get("profile", "")
    since = params.get("since", "")
    query = params.get("q", "").strip()
    roots = selectors.trees_matching(
        status=status if status in STATUS_ORDER else None,
        active=status == "active",
        runner=runner,
        profile=profile,
        created_after=timezone.now() - SINCE_DELTAS[since] if since in SINCE_DELTAS else None,
        q=query,
    )
    page = Paginator(roots, TREES_PER_PAGE).get_page(params.get("page"))
    summaries = selectors.tree_summaries([run.pk for run in page])
    rows = []
    for run in page:
        summary = summaries[run.pk]
        rows.append(
            {
                "run": run,
                "counts": [(s, summary["counts"].get(s, 0)) for s in STATUS_ORDER],
                "max_depth": summary["maxDepth"],
                "total": summary["runs"],
                "tokens": summary["tokens"],
                "cost": summary["costUsd"],
                "stopped": summary["budgetStopped"],
                "created_ms": millis(run.created_at),
                "finished_ms": millis(run.finished_at),
            }
        )
    filtered = any([status, runner, profile, since, query])
    query_string = params.copy()
    query_string.pop("page", None)
    context = page_context(
        request,
        rows=rows,
        page=page,
        filtered=filtered,
        statuses=STATUS_ORDER,
        runners=selectors.runner_names(),
        profiles=selectors.root_profiles(),
        since_choices=SINCE_CHOICES,
        f={"status": status, "runner": runner, "profile": profile, "since": since, "q": query},
        **_overview(),
        query_string=query_string.urlencode(),
        live_roots=[row["run"].run_id for row in rows],
    )
    return render(request, "trees.html", context)


# --- A tree ------------------------------------------------------------------------------------


@require_GET
@viewer_required
def tree(request, run_id):
    if gone := purged_page(request, run_id):
        return gone
    run = run_or_404(run_id)
    if run.root_id is not None:
        root_id = selectors.root_run_id(run)
        return redirect(f"{reverse('tree', args=[root_id])}?focus={run.run_id}")
    summary = selectors.tree_summaries([run.pk])[run.pk]
    context = page_context(
        request,
        run=run,
        summary=summary,
        counts=[(s, summary["counts"].get(s, 0)) for s in STATUS_ORDER if summary["counts"].get(s)],
        focus=request.GET.get("run") or request.GET.get("focus", ""),  # ?run=: the split pane
        created_ms=millis(run.created_at),
        statuses=STATUS_ORDER,
    )
    return render(request, "tree.html", context)

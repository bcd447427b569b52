"""The run page's forms: budget, relaunch, and compare with another run.

A refusal shows the run page again with what was typed and the error next to its field
(issue 38: an error card with only "Back to trees" lost the input), at the status REST gives
the same refusal. A refused role is still the 403 page: there is nothing to retype.
"""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from dashboard.views.base import (
    actor_of,
    page_context,
    redirect_done,
    refused,
    run_or_404,
    viewer_required,
)
from dashboard.views.form_errors import NUL_STATUS, nul_field, nul_message, refusal
from dashboard.views.runs import BUDGET_FIELDS, run_context
from delegation import selectors
from delegation.errors import PermissionRefused, RpcError
from delegation.services.budgets import do_set_budget
from delegation.services.launch import do_relaunch_run
from delegation.wire import BudgetLimits, parse_model

BUDGET_NAMES = tuple(name for name, _label, _step in BUDGET_FIELDS)


def _again(request, run, status: int, **form):
    return render(request, "run.html", run_context(request, run, **form), status=status)


def _budget_again(request, run, typed: dict, error: str, field: str, status: int):
    fields = [(name, label, step, typed.get(name, "")) for name, label, step in BUDGET_FIELDS]
    return _again(
        request,
        run,
        status,
        budget_fields=fields,
        budget_reason=typed.get("reason", ""),
        budget_error=error,
        budget_error_field=field,
        budget_on_limit=typed.get("onLimit", ""),
    )


@require_POST
@viewer_required
def run_budget(request, run_id):
    """The run page's budget form: exactly the limits filled in (an empty field: no limit)."""
    run = run_or_404(run_id)
    typed = {name: request.POST.get(name, "") for name in (*BUDGET_NAMES, "reason", "onLimit")}
    if bad := nul_field(typed):
        return _budget_again(request, run, typed, nul_message(bad), bad, NUL_STATUS)
    values = {}
    for name in BUDGET_NAMES:
        text = typed[name].strip()
        if not text:
            continue
        try:
            values[name] = float(text) if name == "maxCostUsd" else int(text)
        except ValueError:
            error = f"{name}: {text!r} is not a number"
            return _budget_again(request, run, typed, error, name, 400)
    if typed["onLimit"]:
        values["onLimit"] = typed["onLimit"]  # SPEC §14: "cancel" or "pause", checked below
    try:
        limits = parse_model(BudgetLimits, values, "budget")
        do_set_budget(actor_of(request), run, limits, replace=True, reason=typed["reason"].strip())
    except PermissionRefused as exc:
        return refused(request, exc)
    except RpcError as exc:
        form, status = refusal(exc, (*BUDGET_NAMES, "reason"))
        return _budget_again(request, run, typed, form["error"], form["field"], status)
    shown = ", ".join(f"{k} {v}" for k, v in values.items()) or "no limits"
    return redirect_done(request, run, f"Budget of {run.run_id} set: {shown}")


@require_POST
@viewer_required
def run_relaunch(request, run_id):
    """The run page's relaunch form: a new top-level run from this one, message editable.
    The form always sends the message (the original's is filled in): an empty one is a
    mistake to show, not a silent rerun of the original."""
    run = run_or_404(run_id)
    message = request.POST.get("message", "")
    error, status = "", 400
    if "\x00" in message:
        error, status = nul_message("message"), NUL_STATUS
    elif not message.strip():
        error = "message: write the task to run (the original's message was filled in)"
    if error:
        return _again(request, run, status, relaunch_message=message, relaunch_error=error)
    try:
        result = do_relaunch_run(actor_of(request), run, message=message)
    except PermissionRefused as exc:
        return refused(request, exc)
    except RpcError as exc:
        form, status = refusal(exc, ("message",))
        return _again(request, run, status, relaunch_message=message, relaunch_error=form["error"])
    messages.success(request, f"Relaunched {run.run_id} as {result['runId']}")
    return redirect("run", result["runId"])


@require_GET
@viewer_required
def run_compare(request, run_id):
    """Two runs side by side: ``/runs/<a>/compare/?with=<b>`` (the run page's "compare with").
    An unknown run shows the run page again with the error beside the box."""
    run = run_or_404(run_id)
    typed = request.GET.get("with", "")
    other = typed.strip()
    found = selectors.run_for_detail(other) if other and "\x00" not in other else None
    if found is None:
        error = "with: which run? Give a runId" if not other else f"with: no run {other!r}"
        return _again(request, run, 404 if other else 400, compare_with=typed, compare_error=error)
    cmp = selectors.compare_runs(run, found)
    deltas = cmp["deltas"]
    return render(
        request,
        "compare.html",
        page_context(
            request,
            cmp=cmp,
            sides=[{"key": "a", "run": cmp["a"]}, {"key": "b", "run": cmp["b"]}],
            cost_delta=f"{deltas['costUsd']:+.4f}",
            duration_delta=(
                f"{deltas['durationSeconds']:+.1f}" if deltas["durationSeconds"] is not None else ""
            ),
        ),
    )

"""The run page's fork-from-here form and its pause and resume buttons (SPEC §14), through the
same audited services as REST (``delegation.services.forks``, ``delegation.services.pause``).

A refused fork shows the run page again with what was typed and the error beside its field, at
the status REST gives the same refusal; a refused role is the 403 page.
"""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from dashboard.views.base import (
    actor_of,
    form_reason,
    redirect_done,
    refused,
    run_or_404,
    viewer_required,
)
from dashboard.views.form_errors import NUL_STATUS, nul_message, refusal
from dashboard.views.runs import run_context
from delegation.errors import PermissionRefused, RpcError
from delegation.services.forks import do_fork_run
from delegation.services.pause import do_pause_run, do_resume_run


def _again(request, run, status: int, **form):
    return render(request, "run.html", run_context(request, run, **form), status=status)


@require_POST
@viewer_required
def run_fork(request, run_id):
    """Fork this finished run at the step picked (empty: its end) with a new message."""
    run = run_or_404(run_id)
    message = request.POST.get("message", "")
    step = request.POST.get("sequence", "").strip()
    typed = {"fork_message": message, "fork_sequence": step}
    error, field, status = "", "message", 400
    if "\x00" in message or "\x00" in step:
        error, status = nul_message("message" if "\x00" in message else "sequence"), NUL_STATUS
    elif step and not step.isdigit():
        error, field = f"sequence: {step!r} is not an event number", "sequence"
    elif not message.strip():
        error = "message: write the new instruction the fork continues with"
    if error:
        return _again(request, run, status, fork_error=error, fork_field=field, **typed)
    try:
        result = do_fork_run(
            actor_of(request), run, message=message, sequence=int(step) if step else None
        )
    except PermissionRefused as exc:
        return refused(request, exc)
    except RpcError as exc:
        form, status = refusal(exc, ("message", "sequence"))
        return _again(
            request, run, status, fork_error=form["error"], fork_field=form["field"], **typed
        )
    at = f"step {step}" if step else "its end"
    messages.success(request, f"Forked {run.run_id} at {at} as {result['runId']}")
    return redirect("run", result["runId"])


def _pause_or_resume(request, run_id, verb: str):
    run = run_or_404(run_id)
    subtree = request.POST.get("subtree") in ("1", "true", "on")
    reason, nul_page = form_reason(request, done=f"{verb}d")
    if nul_page is not None:
        return nul_page
    act = do_pause_run if verb == "pause" else do_resume_run
    try:
        report = act(actor_of(request), run, reason=reason, subtree=subtree)
    except (PermissionRefused, RpcError) as exc:
        return refused(request, exc)
    more = len(report["descendants"])
    text = f"{verb.capitalize()}: {report['outcome']} for {run.run_id}" + (
        f" and {more} run{'s' if more != 1 else ''} below it" if subtree else ""
    )
    return redirect_done(request, run, text)


@require_POST
@viewer_required
def run_pause(request, run_id):
    return _pause_or_resume(request, run_id, "pause")


@require_POST
@viewer_required
def run_resume(request, run_id):
    return _pause_or_resume(request, run_id, "resume")

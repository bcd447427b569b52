"""The "New run" form."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render

from dashboard.views.base import (
    actor_of,
    page_context,
    refuse,
    refused,
    viewer_required,
)
from dashboard.views.form_errors import nul_field, nul_message
from delegation import roles, selectors
from delegation.errors import INVALID_PARAMS, PermissionRefused, RpcError, http_status
from delegation.services.launch import Launch, do_launch_run
from delegation.wire import BudgetLimits, parse_model


def _launch_budget(form: dict) -> BudgetLimits | None:
    """The form's optional budget fields (text) as the wire budget; None when both are empty."""
    raw = {}
    for name, kind in (("maxRuns", int), ("maxCostUsd", float)):
        text = form[name].strip()
        if not text:
            continue
        try:
            raw[name] = kind(text)
        except ValueError:
            raise RpcError(INVALID_PARAMS, f"budget.{name}: {text!r} is not a number") from None
    return parse_model(BudgetLimits, raw, "budget") if raw else None


@viewer_required
def launch(request):
    """The "New run" form: runner, preset, message. Only operators get the form; the service
    decides (and audits) every launch, so a forged POST from a viewer is refused there."""
    if request.method not in ("GET", "POST"):
        return refuse(request, "GET or POST only", status=405)
    form = {"runner": "", "preset": "", "message": "", "maxRuns": "", "maxCostUsd": ""}
    error = ""
    status = 200
    if request.method == "POST":
        form = {key: request.POST.get(key, "") for key in form}
        extension_id, _, profile = form["preset"].rpartition("/")
        try:
            if bad := nul_field(form):  # REST refuses NUL too (issue 38: it was stored)
                raise RpcError(INVALID_PARAMS, nul_message(bad))
            budget = _launch_budget(form)
            result = do_launch_run(
                actor_of(request),
                Launch(
                    runner=form["runner"],
                    profile=profile,
                    message=form["message"],
                    extension_id=extension_id or None,
                    budget=budget,
                ),
            )
        except PermissionRefused as exc:
            return refused(request, exc)
        except RpcError as exc:
            # The form is shown again with the service's message, at the refusal's status.
            error, status = exc.message, http_status(exc)[0]
        else:
            messages.success(request, f"Launched {result['runId']} on {form['runner']}")
            return redirect("tree", result["runId"])
    elif not roles.has_role(request.user, roles.OPERATOR):
        return refuse(request, "Launching a run needs the operator role.")
    context = page_context(request, choices=selectors.launch_choices(), form=form, error=error)
    return render(request, "launch.html", context, status=status)

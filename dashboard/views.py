"""The operator dashboard's pages and actions.

Pages render what the database holds at request time; the browser then subscribes to
``/ws/live/`` (see ``dashboard.live``) and applies changes as they commit. Reads go through
``delegation.selectors``. Cancel and release are plain form posts here; the run page's steer
box posts to the REST API (``/api/runs/{runId}/steer``), the one JSON action surface. Every
action goes through the engine's operator services (``do_cancel_run``, ``do_steer_run``,
``release_lease``), which check the role and write the audit entry, so a cancel from here is
the same cancel as one from the admin, the REST API or a runner. A refused action answers 403
with the service's message (and the refusal is audited by the service). A signed-in user
without a role is refused before anything is looked up, so the answer is the same whether
the run or lease exists.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import wraps

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from dashboard.form_errors import nul_field, nul_message
from delegation import roles, selectors
from delegation.errors import INVALID_PARAMS, PermissionRefused, RpcError, http_status
from delegation.models import (
    AuditEntry,
    Run,
    RunStatus,
)
from delegation.selectors.retention import purged_run
from delegation.services.launch import Launch, do_launch_run
from delegation.services.operator import Actor, do_cancel_run, release_lease
from delegation.wire import BudgetLimits, parse_model

SINCE_CHOICES = (
    ("", "Any time"),
    ("15m", "Last 15 minutes"),
    ("1h", "Last hour"),
    ("24h", "Last 24 hours"),
    ("7d", "Last 7 days"),
    ("30d", "Last 30 days"),
)
SINCE_DELTAS = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
STATUS_ORDER = [s.value for s in RunStatus]
TREES_PER_PAGE = 50
AUDIT_PER_PAGE = 100
SSO_MESSAGES = {
    "norole": "Your groups at the identity provider give you no role in Canopy. Ask an admin "
    "to add you to a Canopy group.",
    "failed": "Sign-in with the identity provider failed or was refused. Please try again.",
    "unavailable": "The identity provider cannot be reached right now.",
    "refused": "Sign-in with the identity provider was refused.",
}


class LoginView(auth_views.LoginView):
    template_name = "registration/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        # Single sign-on (issue 28): the provider's button, and why its last attempt failed.
        status = self.request.GET.get("sso", "")
        return super().get_context_data(
            sso_enabled=bool(settings.OIDC_ISSUER),
            sso_provider=getattr(settings, "OIDC_PROVIDER_NAME", ""),
            local_passwords=settings.OIDC_LOCAL_PASSWORDS,
            sso_status=status,
            sso_message=SSO_MESSAGES.get(status, ""),
            **kwargs,
        )

    def post(self, request, *args, **kwargs):
        if not settings.OIDC_LOCAL_PASSWORDS:
            return _refuse(request, "Password sign-in is off: sign in with the identity provider.")
        return super().post(request, *args, **kwargs)

    def get_default_redirect_url(self):
        return reverse("home")


class LogoutView(auth_views.LogoutView):
    pass


def _refuse(request, message: str, status: int = 403):
    return render(
        request,
        "forbidden.html" if status == 403 else "error.html",
        _context(request, message=message, status=status),
        status=status,
    )


def _refused(request, exc: PermissionRefused | RpcError):
    """A service's refusal as a page, at the status the REST API gives the same refusal."""
    status, _code = http_status(exc)
    if isinstance(exc, PermissionRefused):
        return _refuse(request, f"Refused: {exc}", status=status)
    return _refuse(request, exc.message, status=status)


def viewer_required(view):
    """Signed in and holding at least the viewer role."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect(f"{reverse('login')}?next={request.get_full_path()}")
        if not roles.can_view(request.user):
            return _refuse(
                request,
                f"{request.user.get_username()} has no role in Canopy. Ask an admin to grant "
                "you viewer, operator or admin.",
            )
        return view(request, *args, **kwargs)

    return wrapped


def _context(request, **extra) -> dict:
    role = roles.role_of(request.user) if request.user.is_authenticated else None
    context = {
        "role": role or "",
        "can_act": roles.has_role(request.user, roles.OPERATOR) if role else False,
        "can_admin": roles.has_role(request.user, roles.ADMIN) if role else False,
    }
    context.update(extra)
    return context


_ms = selectors.millis


def _overview() -> dict:
    """The trees page's headline numbers, and the same as JSON for its charts."""
    numbers = selectors.overview_numbers()
    as_json = {
        **numbers,
        "at": _ms(numbers["at"]),
        "costByHour": [
            {"hourStart": _ms(h["hourStart"]), "costUsd": h["costUsd"]}
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
                "created_ms": _ms(run.created_at),
                "finished_ms": _ms(run.finished_at),
            }
        )
    filtered = any([status, runner, profile, since, query])
    query_string = params.copy()
    query_string.pop("page", None)
    context = _context(
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


def _purged(request, run_id: str):
    """A run deleted by retention answers 410 with a page that says so (issue 28)."""
    tomb = purged_run(run_id)
    if tomb is None:
        return None
    return render(request, "purged.html", _context(request, tomb=tomb), status=410)


def _run_or_404(run_id: str) -> Run:
    run = selectors.get_run(run_id)
    if run is None:
        raise Http404(f"no run {run_id!r}")
    return run


@require_GET
@viewer_required
def tree(request, run_id):
    if gone := _purged(request, run_id):
        return gone
    run = _run_or_404(run_id)
    if run.root_id is not None:
        root_id = selectors.root_run_id(run)
        return redirect(f"{reverse('tree', args=[root_id])}?focus={run.run_id}")
    summary = selectors.tree_summaries([run.pk])[run.pk]
    context = _context(
        request,
        run=run,
        summary=summary,
        counts=[(s, summary["counts"].get(s, 0)) for s in STATUS_ORDER if summary["counts"].get(s)],
        focus=request.GET.get("run") or request.GET.get("focus", ""),  # ?run=: the split pane
        created_ms=_ms(run.created_at),
        statuses=STATUS_ORDER,
    )
    return render(request, "tree.html", context)


# --- A run -------------------------------------------------------------------------------------


@require_GET
@viewer_required
def run_detail(request, run_id):
    if gone := _purged(request, run_id):
        return gone
    return render(request, "run.html", run_context(request, _run_or_404(run_id)))


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
    """The run page's context; a form that failed (``dashboard.run_forms``) adds what was
    typed and the error, so the page is shown again around it."""
    live = selectors.live_descendant_count(run)
    result = selectors.snapshot(run)
    del result["events"]
    held = selectors.leases_held_by(run)
    under = run.lease
    report, report_rows = selectors.cancel_report(run)
    root = run.root or run
    context = _context(
        request,
        run=run,
        result=result,
        root=root,
        identity=[(key, label, result[key]) for key, label in _IDENTITY],
        live_descendants=live,
        links=selectors.relaunch_links(run),
        stop_subtree=live + (0 if run.is_terminal else 1),
        held_leases=[
            {"lease": lease, "expires_ms": _ms(lease.expires_at), "live": lease.is_live()}
            for lease in held
        ],
        under_lease=under,
        under_lease_ms=_ms(under.expires_at) if under else None,
        report=report,
        report_ms=_ms(report.created_at) if report else None,
        report_rows=report_rows,
        steer_request_id=f"dash-{uuid.uuid4().hex[:16]}",
        created_ms=_ms(run.created_at),
        finished_ms=_ms(run.finished_at),
        children=selectors.child_counts(run),
        **_usage_context(run),
        started=selectors.run_request(run),
        pending_approvals=_pending_approvals(run),
        approval_policy_json=_policy_json(run),
    )
    context.update(extra)
    return context


def _policy_json(run: Run) -> str:
    import json

    from delegation.selectors import approvals

    policy = approvals.policy_of(run)
    return json.dumps(policy, indent=2) if policy is not None else ""


def _pending_approvals(run: Run) -> list[dict]:
    from delegation.selectors import approvals

    return [approvals.approval_wire(a) for a in approvals.pending_of_run(run)]


_BUDGET_FIELDS = (
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
        for name, label, _step in _BUDGET_FIELDS:
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
            for name, label, step in _BUDGET_FIELDS
        ],
    }


def _actor(request) -> Actor:
    return Actor.for_user(request.user, via="dashboard")


def _done(request, run: Run, message: str, level=messages.SUCCESS):
    messages.add_message(request, level, message)
    return redirect("run", run.run_id)


@require_POST
@viewer_required
def run_cancel(request, run_id):
    run = _run_or_404(run_id)
    cascade = request.POST.get("cascade") in ("1", "true", "on")
    reason = request.POST.get("reason", "")
    if "\x00" in reason:  # REST refuses NUL (issue 38)
        return _refuse(request, nul_message("reason"), status=422)
    reason = reason.strip()[:500] or (
        f"cancelled from the dashboard by {request.user.get_username()}"
    )
    try:
        report = do_cancel_run(_actor(request), run, reason=reason, cascade=cascade)
    except (PermissionRefused, RpcError) as exc:
        return _refused(request, exc)
    stopped = len(report["descendants"])
    text = f"Cancel {report['outcome']} for {run.run_id}" + (
        f" and {stopped} live descendant{'s' if stopped != 1 else ''}" if cascade else ""
    )
    return _done(request, run, text)


@require_POST
@viewer_required
def lease_release(request, pk):
    lease = selectors.get_lease(pk)
    if lease is None:
        raise Http404(f"no lease {pk}")
    try:
        report = release_lease(_actor(request), lease)
    except (PermissionRefused, RpcError) as exc:
        return _refused(request, exc)
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


# --- Launch -------------------------------------------------------------------------------------


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
        return _refuse(request, "GET or POST only", status=405)
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
                _actor(request),
                Launch(
                    runner=form["runner"],
                    profile=profile,
                    message=form["message"],
                    extension_id=extension_id or None,
                    budget=budget,
                ),
            )
        except PermissionRefused as exc:
            return _refused(request, exc)
        except RpcError as exc:
            # The form is shown again with the service's message, at the refusal's status.
            error, status = exc.message, http_status(exc)[0]
        else:
            messages.success(request, f"Launched {result['runId']} on {form['runner']}")
            return redirect("tree", result["runId"])
    elif not roles.has_role(request.user, roles.OPERATOR):
        return _refuse(request, "Launching a run needs the operator role.")
    context = _context(request, choices=selectors.launch_choices(), form=form, error=error)
    return render(request, "launch.html", context, status=status)


# --- Runners and audit ---------------------------------------------------------------------------


@require_GET
@viewer_required
def runners(request):
    rows = selectors.runner_overview()
    return render(request, "runners.html", _context(request, rows=rows))


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
    context = _context(
        request,
        page=page,
        f=f,
        actions=selectors.audit_actions(),
        vias=[v.value for v in AuditEntry.Via],
        since_choices=SINCE_CHOICES,
        query_string=query_string.urlencode(),
    )
    return render(request, "audit.html", context)

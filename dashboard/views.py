"""The operator dashboard's pages and actions.

Pages render what the database holds at request time; the browser then subscribes to
``/ws/live/`` (see ``dashboard.live``) and applies changes as they commit. Every action goes
through the engine's operator services (``do_cancel_run``, ``do_steer_run``,
``do_release_lease``), which check the role and write the audit entry, so a cancel from here is
the same cancel as one from the admin, the REST API or a runner. A refused action answers 403
with the service's message (and the refusal is audited by the service).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import wraps

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.db.models.functions import Coalesce
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from delegation import roles, selectors
from delegation.errors import PermissionRefused, RpcError
from delegation.models import (
    AuditEntry,
    Event,
    Lease,
    LeaseState,
    Run,
    Runner,
    RunStatus,
)
from delegation.services.operator import Actor, do_cancel_run, do_release_lease, do_steer_run

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


class LoginView(auth_views.LoginView):
    template_name = "registration/login.html"
    redirect_authenticated_user = True

    def get_default_redirect_url(self):
        return reverse("home")


class LogoutView(auth_views.LogoutView):
    pass


def _wants_json(request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def _refuse(request, message: str, status: int = 403):
    if _wants_json(request):
        code = "forbidden" if status == 403 else "invalid"
        return JsonResponse({"error": {"code": code, "message": message}}, status=status)
    return render(
        request,
        "forbidden.html" if status == 403 else "error.html",
        _context(request, message=message, status=status),
        status=status,
    )


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


def signed_in(view):
    """Actions only need a signed-in user here: the service decides and audits refusals."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            if _wants_json(request):
                return JsonResponse(
                    {"error": {"code": "unauthenticated", "message": "sign in first"}}, status=401
                )
            return redirect(f"{reverse('login')}?next={request.get_full_path()}")
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


def _ms(value):
    return int(value.timestamp() * 1000) if value is not None else None


@require_GET
def home(request):
    """Open on a live tree: the newest tree that is still running, else the overview."""
    if request.user.is_authenticated and roles.can_view(request.user):
        live = (
            Run.objects.filter(root__isnull=True, status=RunStatus.RUNNING)
            .order_by("-created_at", "-id")
            .values_list("run_id", flat=True)
            .first()
        )
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
    roots = Run.objects.filter(root__isnull=True).select_related("runner", "session")
    if status in STATUS_ORDER:
        roots = roots.filter(status=status)
    elif status == "active":
        # Trees with any run still going, wherever it is in the tree.
        busy = Run.objects.filter(status=RunStatus.RUNNING).annotate(tree=Coalesce("root_id", "id"))
        roots = roots.filter(pk__in=busy.values("tree"))
    if runner:
        roots = roots.filter(runner__name=runner)
    if profile:
        roots = roots.filter(profile=profile)
    if since in SINCE_DELTAS:
        roots = roots.filter(created_at__gte=timezone.now() - SINCE_DELTAS[since])
    if query:
        matching = Run.objects.filter(
            Q(run_id__icontains=query)
            | Q(session__conversation_id__icontains=query)
            | Q(output__icontains=query)
            | Q(error__icontains=query)
            | Q(pk__in=Event.objects.filter(text__icontains=query).values("run_id")[:2000])
        ).annotate(tree=Coalesce("root_id", "id"))
        roots = roots.filter(pk__in=matching.values("tree"))
    roots = roots.order_by("-created_at", "-id")
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
        runners=Runner.objects.values_list("name", flat=True),
        profiles=Run.objects.filter(root__isnull=True)
        .exclude(profile="")
        .values_list("profile", flat=True)
        .distinct()
        .order_by("profile"),
        since_choices=SINCE_CHOICES,
        f={"status": status, "runner": runner, "profile": profile, "since": since, "q": query},
        query_string=query_string.urlencode(),
        live_roots=[row["run"].run_id for row in rows],
    )
    return render(request, "trees.html", context)


# --- A tree ------------------------------------------------------------------------------------


def _run_or_404(run_id: str) -> Run:
    run = selectors.get_run(run_id)
    if run is None:
        raise Http404(f"no run {run_id!r}")
    return run


@require_GET
@viewer_required
def tree(request, run_id):
    run = _run_or_404(run_id)
    if run.root_id is not None:
        root = Run.objects.get(pk=run.root_id)
        return redirect(f"{reverse('tree', args=[root.run_id])}?focus={run.run_id}")
    summary = selectors.tree_summaries([run.pk])[run.pk]
    context = _context(
        request,
        run=run,
        summary=summary,
        counts=[(s, summary["counts"].get(s, 0)) for s in STATUS_ORDER if summary["counts"].get(s)],
        focus=request.GET.get("focus", ""),
        created_ms=_ms(run.created_at),
    )
    return render(request, "tree.html", context)


# --- A run -------------------------------------------------------------------------------------


@require_GET
@viewer_required
def run_detail(request, run_id):
    run = _run_or_404(run_id)
    live = selectors.live_descendants(run)
    result = selectors.snapshot(run)
    del result["events"]
    held = list(Lease.objects.filter(parent_run=run).select_related("runner"))
    under = run.lease
    report = (
        AuditEntry.objects.filter(
            target_type="run", target_id=run.run_id, action__in=("cancel", "cancel-subtree")
        )
        .exclude(outcome__startswith="refused")
        .first()
    )
    report_rows = []
    if report is not None:
        detail = report.detail or {}
        ids = [detail.get("runId", run.run_id)] + [
            d["runId"] for d in detail.get("descendants", [])
        ]
        current = {
            r.run_id: r
            for r in Run.objects.filter(run_id__in=ids).only(
                "run_id", "status", "finished_at", "depth"
            )
        }
        requested = [(detail.get("runId", run.run_id), run.depth, detail.get("outcome", ""))] + [
            (d["runId"], d.get("depth", 0), d.get("outcome", ""))
            for d in detail.get("descendants", [])
        ]
        for target, depth, outcome in requested:
            found = current.get(target)
            report_rows.append(
                {
                    "run_id": target,
                    "depth": depth,
                    "outcome": outcome,
                    "status": found.status if found else "",
                    "finished_ms": _ms(found.finished_at) if found else None,
                }
            )
    root = run.root or run
    context = _context(
        request,
        run=run,
        result=result,
        root=root,
        identity=[
            (key, result[key])
            for key in (
                "runId",
                "conversationId",
                "runnerId",
                "hostInstanceId",
                "parentRunId",
                "parentConversationId",
                "extensionId",
                "profile",
                "depth",
                "status",
                "done",
                "cancelled",
            )
        ],
        live_descendants=len(live),
        stop_subtree=len(live) + (0 if run.is_terminal else 1),
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
        children=child_summary(run),
    )
    return render(request, "run.html", context)


def child_summary(run: Run):
    rows = Run.objects.filter(parent=run).values("status").annotate(n=Count("id"))
    return {row["status"]: row["n"] for row in rows}


def _actor(request) -> Actor:
    return Actor.for_user(request.user, via="dashboard")


def _done(request, run: Run, payload: dict, message: str, level=messages.SUCCESS):
    if _wants_json(request):
        return JsonResponse(payload)
    messages.add_message(request, level, message)
    return redirect("run", run.run_id)


@require_POST
@signed_in
def run_cancel(request, run_id):
    run = _run_or_404(run_id)
    cascade = request.POST.get("cascade") in ("1", "true", "on")
    reason = request.POST.get("reason", "").strip()[:500] or (
        f"cancelled from the dashboard by {request.user.get_username()}"
    )
    try:
        report = do_cancel_run(_actor(request), run, reason=reason, cascade=cascade)
    except PermissionRefused as exc:
        return _refuse(request, f"Refused: {exc}")
    except RpcError as exc:
        return _refuse(request, exc.message, status=400)
    stopped = len(report["descendants"])
    text = f"Cancel {report['outcome']} for {run.run_id}" + (
        f" and {stopped} live descendant{'s' if stopped != 1 else ''}" if cascade else ""
    )
    return _done(request, run, report, text)


@require_POST
@signed_in
def run_steer(request, run_id):
    run = _run_or_404(run_id)
    message = request.POST.get("message", "")
    request_id = request.POST.get("request_id", "") or f"dash-{uuid.uuid4().hex[:16]}"
    try:
        answer = do_steer_run(_actor(request), run, request_id=request_id, message=message)
    except PermissionRefused as exc:
        return _refuse(request, f"Refused: {exc}")
    except RpcError as exc:
        if _wants_json(request):
            return JsonResponse({"error": {"code": "invalid", "message": exc.message}}, status=400)
        messages.error(request, f"Steer refused: {exc.message}")
        return redirect("run", run.run_id)
    if answer["outcome"] == "injected":
        text = "Steer injected: the message was queued for the running turn."
        level = messages.SUCCESS
    else:
        text = f"Steer not delivered: {answer['outcome']} ({answer.get('reason', '')})."
        level = messages.WARNING
    return _done(request, run, answer, text, level)


@require_POST
@signed_in
def lease_release(request, pk):
    lease = get_object_or_404(Lease.objects.select_related("parent_run", "runner"), pk=pk)
    try:
        report = do_release_lease(_actor(request), lease)
    except PermissionRefused as exc:
        return _refuse(request, f"Refused: {exc}")
    except RpcError as exc:
        return _refuse(request, exc.message, status=400)
    pending = report["pending"]
    text = f"Lease {lease.lease_id} {report['state']}" + (
        f"; waiting for {len(pending)} child run(s) to stop" if pending else ""
    )
    if _wants_json(request):
        return JsonResponse(report)
    messages.success(request, text)
    target = request.POST.get("next", "")
    if target.startswith("/") and not target.startswith("//"):
        return redirect(target)
    if lease.parent_run_id:
        return redirect("run", lease.parent_run.run_id)
    return redirect("trees")


# --- Runners and audit ---------------------------------------------------------------------------


@require_GET
@viewer_required
def runners(request):
    rows = []
    running = dict(
        Run.objects.filter(status=RunStatus.RUNNING)
        .values("runner_id")
        .annotate(n=Count("id"))
        .values_list("runner_id", "n")
    )
    leases = dict(
        Lease.objects.filter(state=LeaseState.ACTIVE)
        .values("runner_id")
        .annotate(n=Count("id"))
        .values_list("runner_id", "n")
    )
    for runner in Runner.objects.prefetch_related("presets").order_by("name"):
        rows.append(
            {
                "runner": runner,
                "presets": list(runner.presets.all()),
                "running": running.get(runner.pk, 0),
                "leases": leases.get(runner.pk, 0),
                "last_seen_ms": _ms(runner.last_seen_at),
            }
        )
    return render(request, "runners.html", _context(request, rows=rows))


@require_GET
@viewer_required
def audit(request):
    params = request.GET
    entries = AuditEntry.objects.all()
    f = {
        key: params.get(key, "").strip()
        for key in ("actor", "action", "via", "target", "outcome", "since")
    }
    if f["actor"]:
        entries = entries.filter(actor__icontains=f["actor"])
    if f["action"]:
        entries = entries.filter(action=f["action"])
    if f["via"]:
        entries = entries.filter(via=f["via"])
    if f["target"]:
        entries = entries.filter(target_id__icontains=f["target"])
    if f["outcome"]:
        entries = entries.filter(outcome__icontains=f["outcome"])
    if f["since"] in SINCE_DELTAS:
        entries = entries.filter(created_at__gte=timezone.now() - SINCE_DELTAS[f["since"]])
    page = Paginator(entries.order_by("-created_at", "-id"), AUDIT_PER_PAGE).get_page(
        params.get("page")
    )
    query_string = params.copy()
    query_string.pop("page", None)
    context = _context(
        request,
        page=page,
        f=f,
        actions=AuditEntry.objects.values_list("action", flat=True).distinct().order_by("action"),
        vias=[v.value for v in AuditEntry.Via],
        since_choices=SINCE_CHOICES,
        query_string=query_string.urlencode(),
    )
    return render(request, "audit.html", context)

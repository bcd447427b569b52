"""Reads of runs and sessions: the SPEC ``Result``, run state, and the one set of run filters."""

from __future__ import annotations

from django.db.models import Count, Exists, F, OuterRef, Q, Subquery
from django.db.models.fields.json import KT

from delegation.models import Command, Event, Run, RunStatus, Session, SteerReceipt
from delegation.selectors.events import millis
from delegation.selectors.usage import tree_usage_values, usage_values

RESULT_RELATED = ("session", "session__parent", "runner", "parent")


def snapshot(run: Run, events=()) -> dict:
    """The ``Result`` of SPEC §6: every field always present."""
    from delegation.selectors.events import event_wire

    session = run.session
    parent_session = session.parent
    return {
        "runnerId": run.runner.name,
        "hostInstanceId": run.host_instance_id,
        "conversationId": session.conversation_id,
        "runId": run.run_id,
        "parentConversationId": parent_session.conversation_id if parent_session else "",
        "parentRunId": run.parent.run_id if run.parent_id else "",
        "extensionId": run.extension_id,
        "profile": run.profile,
        "done": run.done,
        "cancelled": run.cancelled,
        "error": run.error,
        "output": run.output,
        "events": [event_wire(event) for event in events],
        "depth": run.depth,
        "status": run.status,
        # SPEC §9 Conclusions: null until the run concludes.
        "conclusion": run.conclusion,
    }


def run_state(run: Run) -> dict:
    """A run's ``Result`` without events, plus its head, times, cancel and refused spawns."""
    state = snapshot(run)
    del state["events"]
    state.update(
        lastSequence=run.last_sequence,
        createdAt=millis(run.created_at),
        finishedAt=millis(run.finished_at),
        cancelRequestedAt=millis(run.cancel_requested_at),
        cancelReason=run.cancel_reason,
        refusedSpawns=run.refused_spawns,
    )
    return state


def get_run(run_id: str) -> Run | None:
    return Run.objects.select_related(*RESULT_RELATED).filter(run_id=run_id).first()


def run_for_detail(run_id: str) -> Run | None:
    """One run with everything its REST detail shows, in one query."""
    return (
        Run.objects.select_related(
            *RESULT_RELATED, "root", "lease", "lease__runner", "rollup", "budget"
        )
        .filter(run_id=run_id)
        .first()
    )


def child_counts(run: Run) -> dict[str, int]:
    rows = Run.objects.filter(parent=run).values("status").annotate(n=Count("id"))
    return {row["status"]: row["n"] for row in rows.order_by()}


def newest_running_root_id() -> str | None:
    return (
        Run.objects.filter(root__isnull=True, status=RunStatus.RUNNING)
        .order_by("-created_at", "-id")
        .values_list("run_id", flat=True)
        .first()
    )


def root_run_id(run: Run) -> str:
    return run.root.run_id if run.root_id else run.run_id


def root_profiles():
    """The profiles top-level runs use, for the overview's filter."""
    return (
        Run.objects.filter(root__isnull=True)
        .exclude(profile="")
        .values_list("profile", flat=True)
        .distinct()
        .order_by("profile")
    )


def text_matches(text: str) -> Q:
    """A run matches a text search when the text occurs, case-insensitively, in its runId, its
    conversationId, its output, its error or any of its events' text. The dashboard's search and
    the REST ``q`` filter both mean this."""
    return (
        Q(run_id__icontains=text)
        | Q(session__conversation_id__icontains=text)
        | Q(output__icontains=text)
        | Q(error__icontains=text)
        | Exists(Event.objects.filter(run_id=OuterRef("pk"), text__icontains=text))
    )


def runs_matching(
    *,
    statuses=None,
    depth=None,
    depth_min=None,
    depth_max=None,
    runner=None,
    profile=None,
    root=None,
    parent=None,
    conversation=None,
    created_after=None,
    created_before=None,
    q=None,
):
    """Runs matching the filters (all optional, combined with AND), as a queryset."""

    runs = Run.objects.all()
    if statuses:
        runs = runs.filter(status__in=list(statuses))
    if depth is not None:
        runs = runs.filter(depth=depth)
    if depth_min is not None:
        runs = runs.filter(depth__gte=depth_min)
    if depth_max is not None:
        runs = runs.filter(depth__lte=depth_max)
    if runner is not None:
        runs = runs.filter(runner__name=runner)
    if profile is not None:
        runs = runs.filter(profile=profile)
    if root is not None:
        # The root's pk comes from a scalar subquery so both arms of the OR are index lookups;
        # a runId that names no top-level run matches nothing.
        root_pk = Run.objects.filter(run_id=root, root__isnull=True).values("pk")[:1]
        runs = runs.in_tree(Subquery(root_pk))
    if parent is not None:
        runs = runs.filter(parent__run_id=parent)
    if conversation is not None:
        runs = runs.filter(session__conversation_id=conversation)
    if created_after is not None:
        runs = runs.filter(created_at__gte=created_after)
    if created_before is not None:
        runs = runs.filter(created_at__lt=created_before)
    if q:
        runs = runs.filter(text_matches(q))
    return runs


def _run_row_fields():
    return run_row_fields()


def run_row_fields():
    return {
        "runId": F("run_id"),
        "conversationId": F("session__conversation_id"),
        "runnerId": F("runner__name"),
        "hostInstanceId": F("host_instance_id"),
        "extensionId": F("extension_id"),
        "leaseId": F("lease__lease_id"),
        "lastSequence": F("last_sequence"),
        "refusedSpawns": F("refused_spawns"),
        "cancelRequestedAt": F("cancel_requested_at"),
        "createdAt": F("created_at"),
        "updatedAt": F("updated_at"),
        "finishedAt": F("finished_at"),
        # SPEC §9: the conclusion's status alone (a tree row's mark); the detail has it all.
        "conclusionStatus": KT("conclusion__status"),
    }


RUN_ROW_COLUMNS = _RUN_ROW_COLUMNS = (
    "pk",
    "depth",
    "status",
    "done",
    "cancelled",
    "profile",
    "error",
    "parent_id",
    "via",
    "task",
    "activity",
)


def subtree_row_values(runs, usage: bool = False):
    """Run rows for a subtree: only the joins a node cannot borrow from its parent.

    parentRunId, parentConversationId and rootRunId are filled in from the rows themselves
    by the caller, which saves three self-joins on a 10,000-run tree. ``usage`` adds each
    node's rollup and budget (two more joins: about a third more time on 10,000 runs).
    """
    extra = tree_usage_values() if usage else {}
    return runs.values(*_RUN_ROW_COLUMNS, **_run_row_fields(), **extra)


def run_rows(runs, *columns: str):
    """Compact run rows for lists, joined in the same query (one query per page); ``columns``
    adds more of the run's own (the children list adds output and conclusion)."""

    return runs.values(
        *_RUN_ROW_COLUMNS,
        *columns,
        "root_id",
        parentConversationId=F("session__parent__conversation_id"),
        parentRunId=F("parent__run_id"),
        rootRunId=F("root__run_id"),
        **_run_row_fields(),
        **usage_values(),
    )


def runs_of_session(session_pk: int):
    return run_rows(Run.objects.filter(session_id=session_pk).order_by("created_at", "id"))


def sessions_matching(
    *, runner=None, depth=None, parent=None, profile=None, created_after=None, created_before=None
):
    sessions = Session.objects.all()
    if runner is not None:
        sessions = sessions.filter(runner__name=runner)
    if depth is not None:
        sessions = sessions.filter(depth=depth)
    if parent is not None:
        sessions = sessions.filter(parent__conversation_id=parent)
    if profile is not None:
        sessions = sessions.filter(profile=profile)
    if created_after is not None:
        sessions = sessions.filter(created_at__gte=created_after)
    if created_before is not None:
        sessions = sessions.filter(created_at__lt=created_before)
    return sessions.values(
        "pk",
        "depth",
        "profile",
        conversationId=F("conversation_id"),
        runnerId=F("runner__name"),
        parentConversationId=F("parent__conversation_id"),
        extensionId=F("extension_id"),
        hostInstanceId=F("host_instance_id"),
        createdAt=F("created_at"),
    )


def relaunch_links(run: Run) -> dict:
    """Which run this one was relaunched from, and the runs relaunched from it."""
    return {
        "relaunchedFrom": run.relaunched_from.run_id if run.relaunched_from_id else None,
        "relaunches": list(
            Run.objects.filter(relaunched_from=run)
            .order_by("created_at", "id")
            .values_list("run_id", flat=True)
        ),
    }


def steer_receipts(run: Run) -> list:
    """Every steer of one run, oldest first, with how each one turned out (``accepted``: the
    runner answered its ``run.steer`` with ``injected``)."""
    accepted = Command.objects.filter(
        steer=OuterRef("pk"), answered_at__isnull=False, result__outcome="injected"
    )
    receipts = SteerReceipt.objects.filter(run=run).annotate(accepted=Exists(accepted))
    return list(receipts.order_by("created_at", "id"))


def run_request(run: Run) -> dict:
    """The full request a run was started with, and who started it, from what the run records.

    A child has the request its parent sent (``child.start``, or the MCP ``delegate`` tool when
    the run says so); a top-level run either came from an operator's launch (it then records a
    request) or was opened by its runner with ``run.open`` (no message).
    """
    from delegation.models import AuditEntry

    request = run.request if isinstance(run.request, dict) else {}
    via = getattr(run, "via", "") or ""
    if run.parent_id:
        how = "mcp" if via == "mcp" else "runner"
        by = f"{'MCP delegate' if how == 'mcp' else 'child.start'} from run {run.parent.run_id}"
    elif request and via == "launch":
        how = "launch"
        entry = (
            AuditEntry.objects.filter(target_id=run.run_id, action__icontains="launch")
            .order_by("created_at")
            .values_list("actor", flat=True)
            .first()
        )
        by = f"operator launch{f' by {entry}' if entry else ''}"
    else:
        how = "runner"
        by = f"run.open by runner {run.runner.name}"
    return {
        "message": request.get("message", "") if isinstance(request.get("message"), str) else "",
        "profile": run.profile,
        "options": run.options or {},
        "cwd": run.cwd,
        "contextMode": run.context_mode or request.get("contextMode", "") or "",
        "requestId": run.request_id,
        "toolCallId": run.tool_call_id,
        "startedVia": how,
        "startedBy": by,
    }

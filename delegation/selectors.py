"""Reads: snapshots, event pages and trees, shaped as the wire shows them (SPEC §6 Result)."""

from __future__ import annotations

from django.db.models import Count, Q

from delegation.models import TERMINAL_STATUSES, Event, Run

RESULT_RELATED = ("session", "session__parent", "runner", "parent")

EVENT_FIELDS = (
    ("text", "text"),
    ("toolName", "tool_name"),
    ("toolCallId", "tool_call_id"),
    ("input", "input"),
    ("toolOutput", "tool_output"),
    ("success", "success"),
    ("error", "error"),
)


def event_wire(event: Event) -> dict:
    """An event as every reader sees it: sequence, kind, and the fields that are present."""
    wire = {"sequence": event.sequence, "kind": event.kind}
    for alias, attr in EVENT_FIELDS:
        value = getattr(event, attr)
        if value is not None:
            wire[alias] = value
    return wire


def events_after(run: Run, after: int = 0, limit: int | None = None, kinds=None):
    events = Event.objects.filter(run=run, sequence__gt=after).order_by("sequence")
    if kinds:
        events = events.filter(kind__in=kinds)
    if limit is not None:
        events = events[:limit]
    return list(events)


def snapshot(run: Run, events=()) -> dict:
    """The ``Result`` of SPEC §6: every field always present."""
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
    }


def get_run(run_id: str) -> Run | None:
    return Run.objects.select_related(*RESULT_RELATED).filter(run_id=run_id).first()


def subtree_runs(run: Run) -> list[Run]:
    """``run`` and every descendant, in one query through the denormalised root."""
    root_pk = run.root_id or run.pk
    if run.root_id is None:
        candidates = Run.objects.filter(Q(pk=root_pk) | Q(root_id=root_pk))
    else:
        candidates = Run.objects.filter(root_id=root_pk, depth__gte=run.depth)
    candidates = list(candidates.select_related("session", "runner").order_by("depth", "id"))
    if run.root_id is None:
        return candidates
    # Keep only the branch under ``run``: parents precede children in depth order.
    keep = {run.pk}
    branch = []
    for candidate in candidates:
        if candidate.pk == run.pk or candidate.parent_id in keep:
            keep.add(candidate.pk)
            branch.append(candidate)
    return branch


def live_descendants(run: Run) -> list[Run]:
    """Non-terminal runs below ``run`` (for cancel-subtree and its confirmation count)."""
    return [r for r in subtree_runs(run) if r.pk != run.pk and r.status not in TERMINAL_STATUSES]


def child_counts(run: Run) -> dict[str, int]:
    rows = Run.objects.filter(parent=run).values("status").annotate(n=Count("id"))
    return {row["status"]: row["n"] for row in rows}

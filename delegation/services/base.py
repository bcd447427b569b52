"""Row-level steps every domain shares: locking a run, a server event, a run's task and activity."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from delegation import metrics, notify
from delegation.models import ACTIVITY_CHARS, TASK_CHARS, Event, Run

# Re-exported: the MCP server has always found the connection here, the services lock_run.
from delegation.services.identity import Connection  # noqa: F401
from delegation.services.locks import lock_run  # noqa: F401


def store_server_event(run: Run, kind: str, *, actor: str = "", **fields) -> Event:
    """Append one server event under the run's lock; the caller holds ``run`` locked."""
    run.last_sequence += 1
    event = Event.objects.create(
        run=run, sequence=run.last_sequence, kind=kind, actor=actor, **fields
    )
    run.updated_at = timezone.now()
    run.save(update_fields=["last_sequence", "updated_at"])
    notify.run_changed(run)
    transaction.on_commit(_server_event_stored)
    return event


def _server_event_stored():
    metrics.events_stored(1, origin="server")


def first_line(text, limit: int) -> str:
    """The first non-blank line of ``text``, cut to ``limit`` characters ("" for none)."""
    if not isinstance(text, str):
        return ""
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def task_of(request) -> str:
    """A run's task as its tree row shows it: the first line of its request message."""
    message = request.get("message") if isinstance(request, dict) else None
    return first_line(message, TASK_CHARS)


# Kinds whose events say what an agent is doing right now; usage, results of tools and the
# server's own events do not.
ACTIVITY_KINDS = frozenset({"text", "text-delta", "thinking", "tool-use", "result"})


def activity_of(rows) -> str | None:
    """The latest activity among stored event rows (newest last): the last text's first line
    or the last tool call as ``name: input``; None when none of them says anything."""
    for row in reversed(rows):
        kind = row["kind"]
        if kind not in ACTIVITY_KINDS:
            continue
        if kind == "tool-use":
            name = row.get("tool_name") or "tool"
            detail = row.get("input")
            if isinstance(detail, dict):
                detail = next((v for v in detail.values() if isinstance(v, str) and v), "")
            line = first_line(detail, ACTIVITY_CHARS) if isinstance(detail, str) else ""
            return first_line(f"{name}: {line}" if line else name, ACTIVITY_CHARS)
        line = first_line(row.get("text"), ACTIVITY_CHARS)
        if line:
            return line
    return None

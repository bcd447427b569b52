"""Runs as the API shows them in lists, sessions and runners, and finding one by runId."""

from django.http import Http404
from django.utils import timezone

from dashboard.api.core import has_nul
from delegation import selectors
from delegation.models import RunStatus


def find_run(run_id: str):
    run = None if has_nul(run_id) else selectors.run_for_detail(run_id)
    if run is None:
        raise Http404(f"runId: no run {run_id!r}")
    return run


STATUS_VALUES = tuple(status.value for status in RunStatus)


def counts_out(counts: dict[str, int]) -> dict:
    out = {status: counts.get(status, 0) for status in STATUS_VALUES}
    out["total"] = sum(counts.values())
    return out


def with_usage(item: dict, now) -> dict:
    """Replace a row's joined rollup and budget columns with ``usage`` and ``budget``."""
    item["usage"], item["budget"] = selectors.pop_usage(
        item, item["createdAt"], item["finishedAt"], item["status"], now
    )
    return item


def run_item(row: dict, now=None) -> dict:
    """A row of ``selectors.run_rows`` as the API shows it: "" for absent references."""
    item = with_usage(dict(row), now or timezone.now())
    for key in ("parentRunId", "parentConversationId", "leaseId"):
        if item[key] is None:
            item[key] = ""
    if item["rootRunId"] is None:
        item["rootRunId"] = item["runId"]
    return item

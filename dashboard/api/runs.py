"""Reading runs: lists and filters, a run, its subtree, its events (paged and NDJSON export)
and its steer receipts."""

import itertools
import json
from typing import Annotated, Literal

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.http import StreamingHttpResponse
from django.utils import timezone
from ninja import Query, Router, Schema
from pydantic import Field
from pydantic import Field as PydanticField

from dashboard.api import export
from dashboard.api.core import (
    DEFAULT_LIMIT,
    LIST,
    READ,
    ErrorOut,
    NoParams,
    decode_cursor,
    encode_cursor,
    has_nul,
    keyset_page,
    strict_query,
)
from dashboard.api.rows import counts_out, find_run, run_item
from dashboard.api.schemas.common import (
    BIGINT_MAX,
    DepthParam,
    LimitParam,
    QueryBool,
    QueryTime,
    SequenceParam,
    cursor_param,
)
from dashboard.api.schemas.runs import EventPage, RunDetail, RunPage, SteerReceiptList, TreeNode
from delegation import selectors
from delegation.models import RunStatus
from delegation.selectors.forks import run_links

router = Router(tags=["runs"])


# A cursor of the default order is the run's key; of a usage order, the value and the key.
RunCursor = Annotated[
    str,
    PydanticField(
        pattern=r"^(r[0-9a-f]{1,16}|[ct][0-9a-f]{1,16}\.[0-9a-f]{1,16})$",
        description="Opaque position from a previous page's `next`; pass it back unchanged "
        "with the same `order`.",
    ),
]


class RunFilters(Schema):
    status: list[RunStatus] = Field(
        default=None, description="Repeat for several: ?status=running&status=failed"
    )
    depth: DepthParam = Field(default=None, description="Exactly this depth")
    depth_min: DepthParam = Field(default=None, description="Depth at least")
    depth_max: DepthParam = Field(default=None, description="Depth at most")
    runner: str = Field(default=None, description="runnerId")
    profile: str = Field(default=None, description="Profile (preset) name")
    root: str = Field(
        default=None,
        description="runId of a top-level run: that run and every run of its tree",
    )
    parent: str = Field(default=None, description="runId of the parent: its direct children")
    conversation: str = Field(default=None, description="conversationId of the session")
    created_after: QueryTime = Field(default=None, description="Created at or after")
    created_before: QueryTime = Field(default=None, description="Created strictly before")
    q: str = Field(
        default=None,
        description="Case-insensitive substring of the run's runId, conversationId, output, "
        "error or any of its event texts",
    )
    order: Literal["-created", "-subtreeCost", "-subtreeTokens"] = Field(
        default="-created",
        description="Newest first (default), or by the subtree's cost or tokens (in + out), "
        "highest first, ties newest first",
    )
    cursor: RunCursor = None
    limit: LimitParam = DEFAULT_LIMIT


_USAGE_ORDERS = {
    "-subtreeCost": ("c", Coalesce(F("rollup__sub_cost_nanos"), 0)),
    "-subtreeTokens": (
        "t",
        Coalesce(F("rollup__sub_tokens_in"), 0) + Coalesce(F("rollup__sub_tokens_out"), 0),
    ),
}


_CURSOR_ORDERS = {kind: order for order, (kind, _expr) in _USAGE_ORDERS.items()}


def usage_page(rows, order: str, cursor: str | None, limit: int) -> dict:
    """Keyset page by (usage value, pk), both descending: one indexed-order scan, no OFFSET.

    The value moves as usage commits; a run whose figure rises after it was served may show
    up again on a later page, but none is skipped that kept its figure.
    """
    kind, expression = _USAGE_ORDERS[order]
    rows = rows.annotate(sort_key=expression).order_by("-sort_key", "-pk")
    if cursor is not None:
        value_hex, key_hex = cursor[1:].split(".", 1)
        value = min(int(value_hex, 16), BIGINT_MAX)
        key = min(int(key_hex, 16), BIGINT_MAX)
        rows = rows.filter(Q(sort_key__lt=value) | Q(sort_key=value, pk__lt=key))
    items = list(rows[: limit + 1])
    following = None
    if len(items) > limit:
        items = items[:limit]
        last = items[-1]
        following = f"{kind}{last['sort_key']:x}.{last['pk']:x}"
    for item in items:
        item.pop("sort_key", None)
    return {"items": items, "next": following}


@router.get(
    "/runs",
    response={200: RunPage, **LIST},
    summary="List runs, newest first (or by subtree cost)",
    description="Filters combine with AND. Keyset-paginated on the run's primary key "
    "(newest first): a page never shifts when runs are added meanwhile. With "
    "`order=-subtreeCost` (or `-subtreeTokens`) the runs whose subtrees cost most come first, "
    "keyset-paginated on (that figure, key).",
)
@strict_query(RunFilters, lists=("status",))
def list_runs(request, filters: Query[RunFilters]):
    strings = (filters.runner, filters.profile, filters.root, filters.parent)
    if has_nul(*strings, filters.conversation, filters.q):
        return {"items": [], "next": None}
    runs = selectors.runs_matching(
        statuses=filters.status,
        depth=filters.depth,
        depth_min=filters.depth_min,
        depth_max=filters.depth_max,
        runner=filters.runner,
        profile=filters.profile,
        root=filters.root,
        parent=filters.parent,
        conversation=filters.conversation,
        created_after=filters.created_after,
        created_before=filters.created_before,
        q=filters.q,
    )
    order = filters.order
    if filters.cursor is not None:
        # A cursor carries the order it was made for, so the pages of one listing agree.
        order = _CURSOR_ORDERS.get(filters.cursor[0], "-created")
    if order in _USAGE_ORDERS:
        page = usage_page(selectors.run_rows(runs), order, filters.cursor, filters.limit)
    else:
        page = keyset_page(selectors.run_rows(runs), "r", filters.cursor, filters.limit)
    now = timezone.now()
    page["items"] = [run_item(row, now) for row in page["items"]]
    return page


@router.get(
    "/runs/{runId}",
    response={200: RunDetail, **READ},
    summary="A run: its Result, depth, status, child counts and lease",
)
@strict_query(NoParams)
def get_run(request, runId: str):  # noqa: N803
    run = find_run(runId)
    result = selectors.snapshot(run)
    lease = run.lease
    now = timezone.now()
    result.update(
        task=run.task,
        rootRunId=run.root.run_id if run.root_id else run.run_id,
        childCounts=counts_out(selectors.child_counts(run)),
        lease=(
            {
                "id": lease.pk,
                "leaseId": lease.lease_id,
                "runnerId": lease.runner.name,
                "state": lease.state,
                "live": lease.is_live(now),
                "expiresAt": lease.expires_at,
            }
            if lease is not None
            else None
        ),
        lastSequence=run.last_sequence,
        refusedSpawns=run.refused_spawns,
        via=run.via,
        cancelRequestedAt=run.cancel_requested_at,
        cancelReason=run.cancel_reason,
        agentSessionId=run.agent_session_id,
        pausedAt=run.paused_at,
        pauseReason=run.pause_reason,
        pausedSeconds=run.paused_for(now),
        createdAt=run.created_at,
        updatedAt=run.updated_at,
        finishedAt=run.finished_at,
        **run_links(run),
    )
    result["usage"], result["budget"] = selectors.usage_of_run(run)
    return result


class TreeQuery(Schema):
    levels: DepthParam = Field(
        default=None,
        description="How many levels below the run to include (0: the run alone). "
        "Default: all. Nodes on the boundary carry childCounts and childrenIncluded=false.",
    )
    usage: QueryBool = Field(
        default=False,
        description="Also each node's rollup (own and subtree tokens and cost, runs, live "
        "runs) and budget (limits, stop reason); the run's detail has all of it",
    )


@router.get(
    "/runs/{runId}/tree",
    response={200: TreeNode, **READ},
    summary="A run and its subtree, nested",
    description="Streamed. A few queries for the run and the shape of its subtree (ids "
    "only, through the tree's root), then one per 5,000 runs for their rows.",
)
@strict_query(TreeQuery)
def get_tree(request, runId: str, params: Query[TreeQuery]):  # noqa: N803
    run = find_run(runId)
    parent_run_id = run.parent.run_id if run.parent_id else ""
    parent_session = run.session.parent
    top_parent = (parent_run_id, parent_session.conversation_id if parent_session else "")
    root_run_id = run.root.run_id if run.root_id else run.run_id
    # Streamed: the shape of the tree is read first (a few ints per run), then the rows a
    # batch at a time in depth-first order, written out as they come; a 100k-run subtree is
    # never held as one document. Rendered here rather than validated node by node: the rows
    # come from our own query in the TreeNode shape.
    chunks = _tree_json(run, params.levels, top_parent, root_run_id, params.usage)
    if isinstance(request, ASGIRequest):
        # Under ASGI a sync iterator would be drained whole before sending; this one is read
        # a chunk at a time, in the thread that holds the request's database connection.
        chunks = _in_thread(chunks)
    return StreamingHttpResponse(chunks, content_type="application/json")


async def _in_thread(chunks):
    end = object()
    step = sync_to_async(next, thread_sensitive=True)
    while (chunk := await step(chunks, end)) is not end:
        yield chunk


# Rows read and written a batch at a time: few queries for a 10,000-run tree, bounded
# memory for 100,000.
TREE_BATCH = 5000


def _tree_json(run, levels, top_parent, root_run_id, usage=False):
    children, counts = selectors.subtree_skeleton(run, levels)
    boundary = run.depth + levels if levels is not None else None
    nodes = selectors.preorder(run.pk, children)
    # Each open node: its (runId, conversationId) for its children, and children still due.
    stack: list[list] = []
    while True:
        batch = list(itertools.islice(nodes, TREE_BATCH))
        if not batch:
            break
        rows = selectors.subtree_rows_by_pk((pk for pk, _n in batch), usage)
        out = []
        for pk, kids in batch:
            row = rows[pk]
            del row["pk"], row["parent_id"]
            if usage:
                selectors.pop_tree_usage(row)
            if stack:
                row["parentRunId"], row["parentConversationId"] = stack[-1][0]
                stack[-1][1] -= 1
                out.append("," if stack[-1][2] else "")
                stack[-1][2] = True
            else:
                row["parentRunId"], row["parentConversationId"] = top_parent
            row["rootRunId"] = root_run_id
            if row["leaseId"] is None:
                row["leaseId"] = ""
            row["childCounts"] = counts_out(counts.get(pk, {}))
            row["childrenIncluded"] = boundary is None or row["depth"] < boundary
            text = json.dumps(row, cls=DjangoJSONEncoder)
            out.append(text[:-1] + ', "children": [')
            stack.append([(row["runId"], row["conversationId"]), kids, False])
            while stack and stack[-1][1] == 0:
                stack.pop()
                out.append("]}")
        yield "".join(out)


class EventParams(Schema):
    after: SequenceParam = Field(
        default=None,
        description="Return events with sequence > after (default 0). With `cursor` too, "
        "the later position wins.",
    )
    kind: list[str] = Field(default=None, description="Only these kinds (repeatable)")
    cursor: cursor_param("e") = None
    limit: LimitParam = DEFAULT_LIMIT


@router.get(
    "/runs/{runId}/events",
    response={200: EventPage, **READ},
    exclude_unset=True,
    summary="A run's events in sequence order",
    description="Page with `after` (a sequence number) or with the `next` cursor of the "
    "previous page; at most `limit` (≤ 1000) events per page.",
)
@strict_query(EventParams, lists=("kind",))
def get_events(request, runId: str, params: Query[EventParams]):  # noqa: N803
    run = find_run(runId)
    # Both given: the later position wins (each alone is a valid starting point).
    after = max(params.after or 0, decode_cursor("e", params.cursor) or 0)
    if has_nul(params.kind):
        return {"items": [], "next": None, "lastSequence": run.last_sequence}
    events = selectors.events_after(run, after, params.limit + 1, params.kind)
    following = None
    if len(events) > params.limit:
        events = events[: params.limit]
        following = encode_cursor("e", events[-1].sequence)
    return {
        "items": [selectors.event_wire(event) for event in events],
        "next": following,
        "lastSequence": run.last_sequence,
    }


class ExportParams(Schema):
    subtree: QueryBool = Field(
        default=False, description="Also every run below it (each line names its runId)"
    )
    usage: QueryBool = Field(
        default=False,
        description="After the events, one line per run with its rollup and budget: "
        '`{"runId", "record": "usage", "usage": {own, subtree}, "budget": {...} | null}`',
    )


@router.get(
    "/runs/{runId}/export",
    response={**READ, 429: ErrorOut},
    summary="Export events as NDJSON (streamed)",
    description="One JSON object per line: `runId` plus the event as /events shows it. Runs "
    "in primary-key order, each run's events in sequence order. Streamed page by page (keyset "
    "on the (run, sequence) index), so memory stays flat however many events there are; a "
    "client that stops reading pauses the export (nothing more is read from the database "
    "until it takes what was sent). At most `EXPORT_MAX_CONCURRENT_PER_USER` exports per user "
    "stream at once (default 2); another answers 429.",
    openapi_extra={
        "responses": {
            "200": {
                "description": "NDJSON stream",
                "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            }
        }
    },
)
@strict_query(ExportParams)
def export_events(request, runId: str, params: Query[ExportParams]):  # noqa: N803
    run = find_run(runId)
    runs = selectors.subtree_run_ids(run) if params.subtree else {run.pk: run.run_id}
    return export.ndjson_response(request, runs, filename=f"{run.pk}.ndjson", usage=params.usage)


@router.get(
    "/runs/{runId}/steers",
    response={200: SteerReceiptList, **READ},
    summary="A run's steers and how each turned out",
    description="One receipt per requestId, oldest first. A steer answered `injected` is "
    "queued for the runner and turns `delivered` once the runner accepts it; if the runner "
    "refuses it instead (its turn ended first, say) the "
    "receipt turns `undelivered` with the runner's outcome and reason, and the run's stream "
    "gets a `steer-undelivered` event.",
)
@strict_query(NoParams)
def list_steers(request, runId: str):  # noqa: N803
    run = find_run(runId)
    return {
        "items": [
            {
                "requestId": receipt.request_id,
                "message": receipt.message,
                "actor": receipt.actor,
                "createdAt": receipt.created_at,
                "outcome": receipt.outcome,
                "reason": receipt.reason,
                "delivery": receipt.delivery,
                "runnerOutcome": receipt.runner_outcome,
                "runnerReason": receipt.runner_reason,
                "undeliveredAt": receipt.undelivered_at,
            }
            for receipt in selectors.steer_receipts(run)
        ]
    }

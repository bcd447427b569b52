"""Sessions (conversations): list and one with its runs."""

from django.http import Http404
from ninja import Query, Router, Schema
from pydantic import Field

from dashboard.api.core import (
    DEFAULT_LIMIT,
    LIST,
    READ,
    NoParams,
    has_nul,
    keyset_page,
    strict_query,
)
from dashboard.api.rows import run_item
from dashboard.api.schemas.common import DepthParam, LimitParam, QueryTime, cursor_param
from dashboard.api.schemas.sessions import SessionDetail, SessionPage
from delegation import selectors

router = Router()


class SessionFilters(Schema):
    runner: str = Field(default=None, description="runnerId")
    depth: DepthParam = Field(default=None, description="Exactly this depth")
    parent: str = Field(default=None, description="conversationId of the parent session")
    profile: str = None
    created_after: QueryTime = Field(default=None, description="Created at or after")
    created_before: QueryTime = Field(default=None, description="Created strictly before")
    cursor: cursor_param("s") = None
    limit: LimitParam = DEFAULT_LIMIT


def session_item(row: dict) -> dict:
    item = dict(row)
    if item["parentConversationId"] is None:
        item["parentConversationId"] = ""
    return item


@router.get(
    "/sessions",
    response={200: SessionPage, **LIST},
    tags=["sessions"],
    summary="List sessions (conversations), newest first",
)
@strict_query(SessionFilters)
def list_sessions(request, filters: Query[SessionFilters]):
    if has_nul(filters.runner, filters.parent, filters.profile):
        return {"items": [], "next": None}
    rows = selectors.sessions_matching(
        runner=filters.runner,
        depth=filters.depth,
        parent=filters.parent,
        profile=filters.profile,
        created_after=filters.created_after,
        created_before=filters.created_before,
    )
    page = keyset_page(rows, "s", filters.cursor, filters.limit)
    page["items"] = [session_item(row) for row in page["items"]]
    return page


@router.get(
    "/sessions/{conversationId}",
    response={200: SessionDetail, **READ},
    tags=["sessions"],
    summary="A session and its runs",
)
@strict_query(NoParams)
def get_session(request, conversationId: str):  # noqa: N803
    row = None
    if not has_nul(conversationId):
        row = selectors.sessions_matching().filter(conversation_id=conversationId).first()
    if row is None:
        raise Http404(f"conversationId: no session {conversationId!r}")
    item = session_item(row)
    item["runs"] = [run_item(r) for r in selectors.runs_of_session(row["pk"])]
    return item

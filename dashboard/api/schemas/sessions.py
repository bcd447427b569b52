"""Sessions (conversations) and their runs."""

from __future__ import annotations

from datetime import datetime

from ninja import Schema
from pydantic import Field

from dashboard.api.schemas.runs import RunItem


class SessionItem(Schema):
    conversationId: str
    runnerId: str
    depth: int
    parentConversationId: str
    extensionId: str
    profile: str
    hostInstanceId: str
    createdAt: datetime


class SessionPage(Schema):
    items: list[SessionItem]
    next: str | None


class SessionDetail(SessionItem):
    runs: list[RunItem] = Field(description="Its runs, oldest first (a resume adds one)")

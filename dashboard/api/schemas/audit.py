"""The audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import Field


class AuditItem(Schema):
    id: int
    actor: str = Field(description='"user:alice", "runner:ci-1" or "system:..."')
    user: str = Field(description='Username behind the actor, "" if none')
    via: str
    action: str
    targetType: str
    targetId: str
    reason: str
    outcome: str
    detail: dict[str, Any]
    createdAt: datetime


class AuditPage(Schema):
    items: list[AuditItem]
    next: str | None

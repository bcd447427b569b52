"""Runners and their presets."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import Field

from dashboard.api.schemas.common import ChildCounts


class RunnerItem(Schema):
    runnerId: str
    state: str = Field(description="connected | disconnected | lost | revoked")
    connected: bool
    connectionGeneration: int
    hostInstanceId: str
    workspace: str
    declaredDepth: int | None
    createdAt: datetime
    revokedAt: datetime | None
    lastSeenAt: datetime | None
    disconnectedAt: datetime | None
    lostAt: datetime | None


class RunnerPage(Schema):
    items: list[RunnerItem]
    next: str | None


class PresetOut(Schema):
    extensionId: str
    generation: int
    name: str
    options: dict[str, Any]
    systemPrompt: str


class RunnerDetail(RunnerItem):
    presets: list[PresetOut]
    runCounts: ChildCounts = Field(description="Its runs by status")

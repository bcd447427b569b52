"""Conclusions (SPEC §9) as the API shows them: the stored shape of
``delegation.wire.conclusions``, on a run's detail, its Result and the children list."""

from __future__ import annotations

from typing import Literal

from ninja import Schema
from pydantic import Field


class ArtifactOut(Schema):
    path: str = Field(default=None, description="A file in the run's workspace")
    url: str = Field(default=None, description="An http(s) address")
    description: str


class ConclusionOut(Schema):
    """What the run says it achieved (the ``conclude`` tool or a ``canopy-conclusion``
    block); ``confidence`` only when the run gave one."""

    status: Literal["done", "partial", "blocked", "failed"]
    summary: str
    artifacts: list[ArtifactOut]
    followUp: list[str]
    confidence: float = Field(default=None, description="0 to 1")

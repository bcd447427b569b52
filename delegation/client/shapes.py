"""Typed shapes of what the runner sends and the server answers (presets, results, tokens,
commands)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from delegation import errors as codes
from delegation.errors import RpcError


@dataclass(frozen=True)
class Preset:
    """An execution profile an extension offers (prompt content, never a path)."""

    name: str
    system_prompt: str = ""
    options: Mapping[str, Any] | None = None
    approvals: Mapping[str, Any] | None = None  # SPEC §11: the policy its runs start with
    can_fork: bool = False  # SPEC §14: its engine can start a child as a fork of its parent

    def wire(self) -> dict:
        out: dict[str, Any] = {"name": self.name}
        if self.system_prompt:
            out["systemPrompt"] = self.system_prompt
        if self.options:
            out["options"] = dict(self.options)
        if self.approvals is not None:
            out["approvals"] = dict(self.approvals)
        if self.can_fork:
            out["canFork"] = True
        return out


@dataclass(frozen=True)
class Extension:
    extension_id: str
    generation: int
    presets: tuple[Preset, ...] | list[Preset] = ()

    def wire(self) -> dict:
        return {
            "extensionId": self.extension_id,
            "generation": self.generation,
            "presets": [p.wire() for p in self.presets],
        }


@dataclass(frozen=True)
class Registration:
    runner_id: str
    connection_generation: int


@dataclass(frozen=True)
class EmitAck:
    emitted: int
    sequence: int


@dataclass(frozen=True)
class Event:
    """A stored event as readers see it, numbered by the server."""

    sequence: int
    kind: str
    text: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    input: Any = None
    tool_output: Any = None
    success: bool | None = None
    error: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Event:
        return cls(
            sequence=int(data.get("sequence", 0)),
            kind=str(data.get("kind", "")),
            text=data.get("text"),
            tool_name=data.get("toolName"),
            tool_call_id=data.get("toolCallId"),
            input=data.get("input"),
            tool_output=data.get("toolOutput"),
            success=data.get("success"),
            error=data.get("error"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Result:
    """A run snapshot (SPEC §6 ``Result``); ``child_id`` is the child's conversationId."""

    runner_id: str
    host_instance_id: str
    conversation_id: str
    run_id: str
    parent_conversation_id: str
    parent_run_id: str
    extension_id: str
    profile: str
    done: bool
    cancelled: bool
    error: str
    output: str
    events: list[Event]
    depth: int
    status: str
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # SPEC §9 Conclusions: what the run says it achieved; None until it concludes.
    conclusion: Mapping[str, Any] | None = None

    @property
    def child_id(self) -> str:
        return self.conversation_id

    @property
    def last_sequence(self) -> int:
        return self.events[-1].sequence if self.events else 0

    @classmethod
    def from_wire(cls, data: Any) -> Result:
        if not isinstance(data, Mapping):
            raise RpcError(codes.INTERNAL_ERROR, f"expected a Result object, got {data!r}")
        return cls(
            runner_id=data.get("runnerId", ""),
            host_instance_id=data.get("hostInstanceId", ""),
            conversation_id=data.get("conversationId", ""),
            run_id=data.get("runId", ""),
            parent_conversation_id=data.get("parentConversationId", ""),
            parent_run_id=data.get("parentRunId", ""),
            extension_id=data.get("extensionId", ""),
            profile=data.get("profile", ""),
            done=bool(data.get("done", False)),
            cancelled=bool(data.get("cancelled", False)),
            error=data.get("error", "") or "",
            output=data.get("output", "") or "",
            events=[Event.from_wire(e) for e in data.get("events") or []],
            depth=int(data.get("depth", 0) or 0),
            status=data.get("status", ""),
            raw=dict(data),
            conclusion=data.get("conclusion"),
        )


@dataclass(frozen=True)
class McpToken:
    """A run token for Canopy's MCP server (SPEC §9 ``run.mcpToken``).

    Hand ``token`` to the agent only inside its MCP configuration (a header), never on argv
    or in a log: it acts as the run. ``repr`` leaves it out for that reason.
    """

    url: str
    token: str = field(repr=False)
    expires_at: str = ""

    @classmethod
    def from_wire(cls, data: Any) -> McpToken:
        if not isinstance(data, Mapping):
            raise RpcError(codes.INTERNAL_ERROR, "run.mcpToken answered a non-object")
        url, token = data.get("url"), data.get("token")
        if not isinstance(url, str) or not url:
            raise RpcError(codes.INTERNAL_ERROR, "run.mcpToken answered without a 'url'")
        if not isinstance(token, str) or not token:
            raise RpcError(codes.INTERNAL_ERROR, "run.mcpToken answered without a 'token'")
        expires = data.get("expiresAt")
        return cls(url=url, token=token, expires_at=expires if isinstance(expires, str) else "")


@dataclass(frozen=True)
class SteerOutcome:
    outcome: str
    reason: str = ""

    @property
    def injected(self) -> bool:
        return self.outcome == "injected"


@dataclass(frozen=True)
class Identity:
    """Who a child is (the ``identity`` of ``child.execute``)."""

    runner_id: str
    host_instance_id: str
    conversation_id: str
    run_id: str
    parent_conversation_id: str
    parent_run_id: str
    extension_id: str
    profile: str

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Identity:
        return cls(
            runner_id=data.get("runnerId", ""),
            host_instance_id=data.get("hostInstanceId", ""),
            conversation_id=data.get("conversationId", ""),
            run_id=data.get("runId", ""),
            parent_conversation_id=data.get("parentConversationId", ""),
            parent_run_id=data.get("parentRunId", ""),
            extension_id=data.get("extensionId", ""),
            profile=data.get("profile", ""),
        )


@dataclass(frozen=True)
class ExecuteCommand:
    """A ``child.execute`` command: run this child at ``depth`` with the frozen preset.

    ``run.execute`` (a top-level run an operator launched, depth 0) has the same params and
    parses into the same command: handle both with one handler.
    """

    identity: Identity
    request: Mapping[str, Any]
    preset: Preset
    depth: int
    lease_id: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def run_id(self) -> str:
        return self.identity.run_id

    @property
    def message(self) -> str:
        return self.request.get("message", "")

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> ExecuteCommand:
        preset = params.get("preset") or {}
        return cls(
            identity=Identity.from_wire(params.get("identity") or {}),
            request=dict(params.get("request") or {}),
            preset=Preset(
                name=preset.get("name", ""),
                system_prompt=preset.get("systemPrompt", "") or "",
                options=preset.get("options"),
            ),
            depth=int(params.get("depth", 0)),
            lease_id=params.get("leaseId"),
            raw=dict(params),
        )

"""An ``acp`` preset from the runner's config, and the ACP tool kinds its permission
policy (``allowToolKinds``) may name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delegation.runner.presets import AgentPreset, check_fields

TOOL_KINDS = (
    "read",
    "edit",
    "delete",
    "move",
    "search",
    "execute",
    "think",
    "fetch",
    "switch_mode",
    "other",
)

MCP_TOKEN_VIA = ("header", "env")


class AcpRefused(Exception):
    """The agent cannot do what the run needs (e.g. no ``session/load`` for a resume)."""


@dataclass
class AcpPreset(AgentPreset):
    allow_tool_kinds: tuple[str, ...] = ()
    # SPEC §11: ask Canopy (policy, else an operator) for what the allow-list does not allow.
    ask_canopy: bool = False
    # How the run token reaches the agent's MCP client: in session/new's ``Authorization``
    # header ("header"), or as ``Bearer ${CANOPY_RUN_TOKEN}`` there with the token in the
    # agent's environment ("env") for an agent that expands variables in MCP headers and
    # would otherwise put the header on a process's argv (claude-agent-acp: SPEC §9).
    mcp_token_via: str = "header"
    # SPEC §14: the operator says the agent forks a session (ACP ``session/fork``, which
    # claude-agent-acp offers): the preset registers with ``canFork``, and a fork child runs
    # ``session/fork`` of its parent's session; an agent that turns out not to offer it fails
    # the child by name.
    can_fork: bool = False

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> AcpPreset:
        fields = check_fields(
            raw,
            label="acp preset",
            extra=("allowToolKinds", "askCanopy", "mcpTokenVia", "canFork"),
        )
        label = f"acp preset {fields['name']!r}"
        kinds = raw.get("allowToolKinds", [])
        if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            raise ValueError(f"{label}: 'allowToolKinds' must be a list of strings")
        bad = [k for k in kinds if k not in TOOL_KINDS]
        if bad:
            raise ValueError(
                f"{label}: 'allowToolKinds' has unknown kind(s) {', '.join(bad)} "
                f"(ACP tool kinds: {', '.join(TOOL_KINDS)})"
            )
        ask = raw.get("askCanopy", False)
        if not isinstance(ask, bool):
            raise ValueError(f"{label}: 'askCanopy' must be true or false")
        via = raw.get("mcpTokenVia", "header")
        if via not in MCP_TOKEN_VIA:
            raise ValueError(
                f"{label}: 'mcpTokenVia' must be one of {', '.join(MCP_TOKEN_VIA)}, not {via!r}"
            )
        forks = raw.get("canFork", False)
        if not isinstance(forks, bool):
            raise ValueError(f"{label}: 'canFork' must be true or false")
        return cls(
            **fields,
            allow_tool_kinds=tuple(kinds),
            ask_canopy=ask,
            mcp_token_via=via,
            can_fork=forks,
        )

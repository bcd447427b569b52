"""An ``acp`` preset from the runner's config, and the ACP tool kinds its permission
policy (``allowToolKinds``) may name."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


class AcpRefused(Exception):
    """The agent cannot do what the run needs (e.g. no ``session/load`` for a resume)."""


@dataclass
class AcpPreset:
    name: str
    command: list[str]
    system_prompt: str = ""
    options: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    cancel_grace: float = 5.0
    allow_tool_kinds: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> AcpPreset:
        known = {
            "name",
            "command",
            "systemPrompt",
            "options",
            "env",
            "cwd",
            "cancelGraceSeconds",
            "allowToolKinds",
        }
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"acp preset: unknown field(s) {', '.join(sorted(unknown))}")
        name = raw.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError("acp preset: 'name' must be a non-blank string")
        command = raw.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(a, str) for a in command)
        ):
            raise ValueError(f"acp preset {name!r}: 'command' must be a non-empty list of strings")
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"acp preset {name!r}: 'env' must map names to strings")
        grace = raw.get("cancelGraceSeconds", 5.0)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
            raise ValueError(f"acp preset {name!r}: 'cancelGraceSeconds' must be a number >= 0")
        kinds = raw.get("allowToolKinds", [])
        if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            raise ValueError(f"acp preset {name!r}: 'allowToolKinds' must be a list of strings")
        bad = [k for k in kinds if k not in TOOL_KINDS]
        if bad:
            raise ValueError(
                f"acp preset {name!r}: 'allowToolKinds' has unknown kind(s) {', '.join(bad)} "
                f"(ACP tool kinds: {', '.join(TOOL_KINDS)})"
            )
        return cls(
            name=name,
            command=command,
            system_prompt=raw.get("systemPrompt", "") or "",
            options=raw.get("options"),
            env=env,
            cwd=raw.get("cwd"),
            cancel_grace=float(grace),
            allow_tool_kinds=tuple(kinds),
        )

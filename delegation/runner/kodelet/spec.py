"""A preset's ``extensions``: the kodelet extensions its runs host (SPEC §15).

``"extensions": [{"command": [...], "config": {...}, "childProfile"?: "name"}]``. ``config``
is handed to the extension in ``extension.initialize``; ``childProfile`` is the preset a
``kodelet acp`` started without ``--profile`` runs its sessions on (default: the calling
run's own preset).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FIELDS = frozenset({"command", "config", "childProfile"})


@dataclass(frozen=True)
class ExtensionSpec:
    command: tuple[str, ...]
    config: Mapping[str, Any] = field(default_factory=dict)
    child_profile: str = ""

    @property
    def extension_id(self) -> str:
        """The name kodelet would give it: the executable's base name."""
        return self.command[0].rsplit("/", 1)[-1] or "extension"


def check_extensions(raw: Any, *, label: str) -> tuple[ExtensionSpec, ...]:
    """The ``extensions`` of one preset, refused with a message naming the field."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{label}: 'extensions' must be a list of {{command, config}}")
    out = []
    for index, entry in enumerate(raw):
        where = f"{label}: extensions[{index}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be an object {{command, config}}")
        unknown = set(entry) - FIELDS
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        command = entry.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(arg, str) and arg for arg in command)
        ):
            raise ValueError(f"{where}: 'command' must be a non-empty list of strings")
        config = entry.get("config", {})
        if not isinstance(config, Mapping):
            raise ValueError(f"{where}: 'config' must be an object")
        child_profile = entry.get("childProfile", "")
        if not isinstance(child_profile, str):
            raise ValueError(f"{where}: 'childProfile' must be a preset name")
        out.append(ExtensionSpec(tuple(command), dict(config), child_profile.strip()))
    return tuple(out)

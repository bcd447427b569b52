"""The presets a caller may start children with (SPEC §9 ``list_profiles``).

One decision, read in one place: a caller at ``level`` may start a child iff the depth rule
lets that level spawn (``depth.may_spawn``); then every preset its runner registered under
the caller's extension is startable, otherwise none is. Doors show this list; the child
service enforces the same rule when a child is actually started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

from delegation import depth as depthlib
from delegation.models import ExtensionPreset


@dataclass(frozen=True)
class StartableProfiles:
    extension_id: str
    level: int
    max_depth: int
    may_spawn: bool
    profiles: list[dict] = field(default_factory=list)

    def wire(self) -> dict:
        return {
            "extensionId": self.extension_id,
            "depth": self.level,
            "maxDepth": self.max_depth,
            "maySpawn": self.may_spawn,
            "profiles": self.profiles,
        }


def profiles_caller_may_start(
    *, runner_pk: int, extension_id: str, level: int
) -> StartableProfiles:
    """The presets of ``runner_pk``'s ``extension_id`` a caller at ``level`` may start."""
    max_depth = settings.DELEGATION_MAX_DEPTH
    may_spawn = depthlib.may_spawn(level, max_depth)
    profiles = []
    if may_spawn:
        presets = ExtensionPreset.objects.filter(
            runner_id=runner_pk, extension_id=extension_id
        ).order_by("name")
        profiles = [
            {"name": p.name, "systemPrompt": p.system_prompt, "options": p.options or {}}
            for p in presets
        ]
    return StartableProfiles(
        extension_id=extension_id,
        level=level,
        max_depth=max_depth,
        may_spawn=may_spawn,
        profiles=profiles,
    )

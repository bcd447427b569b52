"""SPEC §11: both engines' presets carry an optional approval policy, checked at load."""

from __future__ import annotations

import pytest

from delegation.runner.acp.presets import AcpPreset
from delegation.runner.command import CommandPreset

POLICY = {"rules": [{"match": {"tool": "Bash", "input": "rm *"}, "decision": "deny"}]}


@pytest.mark.parametrize("cls", [CommandPreset, AcpPreset])
def test_it_accepts_a_policy_and_sends_it_when_registering(cls):
    preset = cls.from_config({"name": "p", "command": ["true"], "approvals": POLICY})
    assert preset.approvals == {**POLICY, "default": "ask"}
    assert cls.from_config({"name": "q", "command": ["true"]}).approvals is None


@pytest.mark.parametrize("cls", [CommandPreset, AcpPreset])
@pytest.mark.parametrize(
    "bad, named",
    [
        ({"rules": [{"match": {"tool": "Bash"}, "decision": "maybe"}]}, "rules.0.decision"),
        ({"rules": [{"match": {"kind": "nope"}, "decision": "allow"}]}, "rules.0.match.kind"),
        ({"default": "ask", "extra": 1}, "extra"),
        ("allow", "(policy)"),
    ],
)
def test_it_refuses_a_bad_policy_naming_the_preset_and_field(cls, bad, named):
    with pytest.raises(ValueError) as exc:
        cls.from_config({"name": "strict", "command": ["true"], "approvals": bad})
    assert "'strict'" in str(exc.value)
    assert "'approvals'" in str(exc.value)
    assert named in str(exc.value)

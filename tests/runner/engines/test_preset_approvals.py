"""SPEC §11: both engines' presets carry an optional approval policy, checked at load."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from delegation.runner.acp.presets import AcpPreset
from delegation.runner.command import CommandPreset
from delegation.services.approval_policy import effective
from delegation.wire.approvals import SHIPPED_POLICIES

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
        (["allow"], "(policy)"),
    ],
)
def test_it_refuses_a_bad_policy_naming_the_preset_and_field(cls, bad, named):
    with pytest.raises(ValueError) as exc:
        cls.from_config({"name": "strict", "command": ["true"], "approvals": bad})
    assert "'strict'" in str(exc.value)
    assert "'approvals'" in str(exc.value)
    assert named in str(exc.value)


HOW_TO = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "approve-what-agents-do.md"
MARKER = "<!-- approvals-claude-preset -->"


def _documented_claude_preset() -> dict:
    after = HOW_TO.read_text(encoding="utf-8").split(MARKER, 1)[1]
    block = re.match(r"\s*```json\n(.*?)\n```", after, re.S)
    assert block, f"no ```json block right after {MARKER} in {HOW_TO}"
    return json.loads(block.group(1))


def test_it_loads_the_documented_claude_preset_with_the_shipped_read_policy(settings):
    preset = CommandPreset.from_config(_documented_claude_preset())
    flag = preset.command.index("--permission-prompt-tool")
    assert preset.command[flag + 1] == "mcp__canopy__approve"
    # The CLI's per-call wait (ms) must outlast the server's decision timeout (s).
    assert int(preset.env["MCP_TOOL_TIMEOUT"]) > settings.APPROVAL_TIMEOUT_SECONDS * 1000
    assert preset.approvals == SHIPPED_POLICIES["allow-reads"]
    chain = [(preset.approvals, True)]
    assert effective(chain, tool="Read", kind="", input={"file_path": "/w/a.py"}) == "allow"
    assert effective(chain, tool="Grep", kind="", input={"pattern": "x"}) == "allow"
    assert effective(chain, tool="Bash", kind="", input={"command": "touch /w/x"}) == "ask"
    assert effective(chain, tool="", kind="search", input={}) == "allow"
    assert effective(chain, tool="", kind="execute", input={"command": "ls"}) == "ask"


def test_it_refuses_a_shipped_policy_name_it_does_not_ship():
    with pytest.raises(ValueError, match=r"'x'.*'approvals' names no shipped policy 'all'"):
        CommandPreset.from_config({"name": "x", "command": ["true"], "approvals": "all"})

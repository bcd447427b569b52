"""The README's ready-made real-agent presets, made runnable offline for the tests.

``readme_presets()`` is the JSON block after ``<!-- real-agent-presets -->`` in README.md, so
the tests run exactly what the README tells operators to run; ``offline_claude_preset`` points
its ``claude`` at the pinned CLI and the scripted model endpoint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.agents.claude_cli import allow_model, claude_bin, offline_env

README = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "connect-claude-codex-gemini.md"
MARKER = "<!-- real-agent-presets -->"


def readme_presets() -> dict:
    text = README.read_text(encoding="utf-8")
    after = text.split(MARKER, 1)[1]
    block = re.match(r"\s*```json\n(.*?)\n```", after, re.S)
    assert block, f"no ```json block right after {MARKER} in {README}"
    return json.loads(block.group(1))


def offline_claude_preset(model_url: str, home: Path, **changes) -> dict:
    """The README's ``claude`` preset on the pinned CLI, the stub model, a private HOME."""
    preset = next(p for p in readme_presets()["presets"] if p["name"] == "claude")
    preset = json.loads(json.dumps(preset))
    preset["command"][0] = claude_bin()
    env = offline_env(model_url, home)
    env.pop("PATH")  # the engine passes the runner's own PATH
    env.pop("ENABLE_TOOL_SEARCH")  # the README's preset sets it
    preset["env"] = {**env, **preset.get("env", {})}
    preset["allowHosts"] = allow_model(model_url)
    preset.update(changes)
    return preset

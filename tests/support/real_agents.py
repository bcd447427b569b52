"""The README's ready-made real-agent presets, made runnable offline for the tests.

``readme_presets()`` is the JSON block after ``<!-- real-agent-presets -->`` in README.md, so
the tests run exactly what the README tells operators to run; ``offline_claude_preset`` points
its ``claude`` at the pinned CLI and the scripted model endpoint; ``claude_over_rest`` runs
it on a runner host beside an operator's REST client.
"""

from __future__ import annotations

import json
import re
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from asgiref.sync import sync_to_async

from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.runner.model_stub import ModelStub
from delegation.services import tokens
from tests.support.agents.claude_cli import allow_model, claude_bin, offline_env
from tests.support.personas import api_token
from tests.support.runners import FAST

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


@asynccontextmanager
async def claude_over_rest(
    script, *, server, tmp_path: Path, operator, name: str, session_store: str | None = None
):
    """``(host, http)``: a runner host running ``offline_claude_preset`` (HOME under
    ``tmp_path``) against the scripted model ``script``, registered as runner ``name``, and
    an httpx client holding ``operator``'s API token for ``server``'s REST; both closed, and
    the model stopped, when the block ends. The tests that act on a real agent over REST
    (pause, budgets, fork from here) differ only in their script and what they ask."""
    _runner, token = await sync_to_async(tokens.create_runner)(name)
    bearer = await sync_to_async(api_token)(operator)
    with ModelStub(script) as stub:
        preset = offline_claude_preset(stub.url, tmp_path / "home")
        engine = CommandEngine([CommandPreset.from_config(preset)], str(tmp_path))
        engine.session_store = session_store
        host = RunnerHost(server.ws_url, token, engine, extension_id=name, client_options=FAST)
        headers = {"Authorization": f"Bearer {bearer}"}
        async with (
            host,
            httpx.AsyncClient(base_url=server.http_url, headers=headers, timeout=30) as http,
        ):
            yield host, http

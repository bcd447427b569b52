"""The runner's fork guards (SPEC §14), reached before any agent starts, so no server and no
real CLI: the engines' ``run`` with a run context as ``run.execute`` / ``child.start`` make it.

- Fork from here (``forkFrom``; REST ``POST /api/runs/{id}/fork``) resumes a transcript the
  runner kept of a Claude Code run at a step. A Codex or ACP preset can fork a live parent
  (``canFork``), so the server lets such a fork through; the runner fails it by name, never
  starting that agent with Claude Code's options or fresh as if it were a fork.
- Gemini CLI's ``contextMode: "fork"`` is a copy of the parent's session in the child's private
  HOME: an unsandboxed preset has none, so the child fails saying it forks only sandboxed.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from delegation.runner.acp import AcpEngine, AcpPreset
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunContext
from tests.support.paths import AGENTS

SESSION = "0b5e7a52-1111-4c2d-9d1e-3f0a6b7c8d9e"
# Would the guard let the run through, this "agent" starts and says nothing.
SILENT = [sys.executable, "-c", "pass", "{message}"]


def context(*, profile: str, host=None, depth: int = 0, **fields) -> RunContext:
    return RunContext(
        host=host or SimpleNamespace(runs={}),
        run_id="fork-1",
        conversation_id="conv-1",
        depth=depth,
        message="continue from there",
        profile=profile,
        **fields,
    )


def kept_transcript(tmp_path) -> str:
    """A store holding a kept transcript of ``SESSION``: only the guard stands in the way."""
    store = tmp_path / "kept"
    store.mkdir()
    (store / f"{SESSION}.jsonl").write_text('{"uuid": "u1"}\n')
    return str(store)


FORK_FROM = {"runId": "orig-1", "sessionId": SESSION, "runnerIndex": None, "sequence": None}


async def test_it_fails_a_fork_from_here_on_a_codex_preset_by_name(tmp_path):
    home = tmp_path / "home"  # where the guard-less fork would place the transcript
    preset = CommandPreset.from_config(
        {
            "name": "codex",
            "command": SILENT,
            "format": "codex-json",
            "sandbox": "none",
            "env": {"HOME": str(home)},
        }
    )
    engine = CommandEngine([preset], str(tmp_path))
    engine.session_store = kept_transcript(tmp_path)

    outcome = await engine.run(context(profile="codex", fork_from=FORK_FROM))

    assert outcome.error == "fork from here: preset codex is not Claude Code"
    assert not home.exists()  # nothing placed for an agent that would not read it


async def test_it_fails_a_fork_from_here_on_an_acp_preset_by_name(tmp_path):
    preset = AcpPreset(
        "acp", [sys.executable, str(AGENTS / "acp_agent.py")], can_fork=True, sandbox="none"
    )
    engine = AcpEngine([preset], str(tmp_path))

    outcome = await engine.run(context(profile="acp", fork_from=FORK_FROM))

    assert outcome.error == "fork from here: preset acp is not Claude Code"


async def test_it_fails_a_gemini_fork_child_on_an_unsandboxed_preset(tmp_path):
    preset = CommandPreset.from_config(
        {"name": "gemini", "command": SILENT, "format": "gemini-stream-json", "sandbox": "none"}
    )
    engine = CommandEngine([preset], str(tmp_path))
    # The live parent on this runner, with the agent session it reported.
    parent = SimpleNamespace(
        finished=False,
        data={"format": SimpleNamespace(session_id=SESSION), "private_home": None, "cwd": ""},
    )
    ctx = context(
        profile="gemini",
        host=SimpleNamespace(runs={"parent-1": parent}),
        request={"contextMode": "fork"},
        identity=SimpleNamespace(parent_run_id="parent-1"),
        depth=1,
    )

    outcome = await engine.run(ctx)

    assert outcome.error == "contextMode fork: preset gemini forks only sandboxed"

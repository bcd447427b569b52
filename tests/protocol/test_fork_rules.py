"""Fork rules on the runner socket (SPEC §14): a preset that cannot fork refuses a
``contextMode: "fork"`` start with −32012 before anything is stored; one that can is admitted;
a run records its agent's session id from the runner's ``session`` event."""

import pytest
from channels.db import database_sync_to_async

from delegation.models import Event, Run
from delegation.runner.command import CommandEngine, CommandPreset
from tests.support.rpc import DEFAULT_EXTENSION

pytestmark = pytest.mark.django_db(transaction=True)

FORKING = {
    **DEFAULT_EXTENSION,
    "presets": [*DEFAULT_EXTENSION["presets"], {"name": "claude", "canFork": True}],
}


def stored():
    return Run.objects.count(), Event.objects.count()


async def test_it_refuses_a_fork_of_a_preset_that_cannot_fork_before_storing_anything(
    runner_token, make_client
):
    runner = await make_client(runner_token, extensions=[FORKING])
    await runner.open("root-1")
    before = await database_sync_to_async(stored)()
    frame = await runner.call("child.start", runner.child_params(contextMode="fork"))
    assert frame["error"]["code"] == -32012
    assert frame["error"]["message"] == "preset worker cannot fork"
    assert await database_sync_to_async(stored)() == before

    fresh = await runner.start(request_id="fresh", contextMode="fresh")
    forked = await runner.start(request_id="forked", profile="claude", contextMode="fork")
    assert fresh["status"] == forked["status"] == "running"
    run = await database_sync_to_async(Run.objects.get)(run_id=forked["runId"])
    assert run.context_mode == "fork"


async def test_it_records_the_agent_session_id_the_runner_reports(runner):
    await runner.open("root-1")
    await runner.emit(
        "root-1",
        [
            {"kind": "session", "text": "started", "input": {"sessionId": "5f0c-aa"}},
            {"kind": "session", "text": "odd", "input": {"sessionId": "../etc"}},
            "hello",
        ],
    )
    run = await database_sync_to_async(Run.objects.get)(run_id="root-1")
    assert run.agent_session_id == "5f0c-aa"  # a session id that is no ValidID is ignored


def test_it_offers_fork_only_for_claude_code_presets(tmp_path):
    engine = CommandEngine(
        [
            CommandPreset.from_config(
                {"name": "claude", "command": ["claude"], "format": "claude-stream-json"}
            ),
            CommandPreset.from_config({"name": "plain", "command": ["true"]}),
        ],
        str(tmp_path),
    )
    wire = {p.name: p.wire() for p in engine.presets()}
    assert wire["claude"]["canFork"] is True
    assert "canFork" not in wire["plain"]

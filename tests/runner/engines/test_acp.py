"""The ``acp`` engine end to end: a real daphne server, the reference runner host, and a real
ACP agent process per child (``tests/support/agents/acp_agent.py``, written with the package's agent
side), speaking the protocol over stdio.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event, Run
from delegation.runner.acp import AcpEngine, AcpPreset
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.support.paths import AGENTS, PROJECT
from tests.support.runners import FAST, pid_alive

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
]

AGENT = [sys.executable, str(AGENTS / "acp_agent.py")]


class Harness:
    """A runner host with the acp engine, a root run at level 1, and helpers to drive it."""

    def __init__(self, host: RunnerHost, state: Path):
        self.host, self.state = host, state
        self.c = host.client
        self.ext, self.gen = host.extension_id, host.generation
        self.numbers = iter(range(1, 1000))

    async def start(self, message, profile="acp", **request):
        request = {
            "requestId": f"req-{next(self.numbers)}",
            "profile": profile,
            "message": message,
            **request,
        }
        return await self.c.child_start("root-run", self.ext, self.gen, request)

    async def read_until(self, child_id, predicate, timeout=30, run_id=None):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        events, after = [], 0
        while True:
            result = await self.c.child_read(
                "root-run", self.ext, self.gen, child_id, child_run_id=run_id, after=after
            )
            events.extend(result.events)
            after = result.last_sequence or after
            if result.done and result.events:
                continue  # a done run may still have pages to read
            if predicate(result, events):
                return result, events
            if loop.time() > deadline:
                raise AssertionError(f"timed out; events so far: {[e.raw for e in events]}")
            await asyncio.sleep(0.05)

    async def steer(self, child_id, message, request_id):
        return await self.c.child_steer(
            "root-run", self.ext, self.gen, child_id, message, request_id=request_id
        )

    def started(self) -> list[dict]:
        path = self.state / "started.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
async def harness(daphne_server, tmp_path, monkeypatch):
    _runner, token = await sync_to_async(tokens.create_runner)("acp-runner")
    monkeypatch.setenv("CANOPY_RUNNER_TOKEN", token)  # must not reach the agent
    state = tmp_path / "state"
    state.mkdir()
    workspace = tmp_path / "ws"
    (workspace / "sub").mkdir(parents=True)
    env = {"ACP_AGENT_STATE": str(state), "ACP_AGENT_RELEASE": str(state / "release")}
    # Unsandboxed: the stub reports its host pid and writes its state outside the workspace
    # (the sandbox's own tests are tests/security/test_containment.py).
    bare = {"sandbox": "none"}
    presets = [
        AcpPreset(
            "acp", AGENT, env=env, allow_tool_kinds=("read", "search"), cancel_grace=2.0, **bare
        ),
        AcpPreset("stubborn", AGENT, env=env, cancel_grace=0.5, **bare),
        AcpPreset("noload", AGENT, env={**env, "ACP_AGENT_NO_LOAD": "1"}, **bare),
        AcpPreset("crash", AGENT, env={**env, "ACP_AGENT_CRASH": "1"}, **bare),
    ]
    asked = []

    async def mcp(ctx):
        asked.append(ctx.run_id)
        return {"url": "http://127.0.0.1:9/mcp", "token": f"run-token-{ctx.run_id}"}

    engine = AcpEngine(presets, str(workspace), mcp=mcp)
    host = RunnerHost(
        daphne_server.ws_url,
        token,
        engine,
        extension_id="acp",
        workspace=str(workspace),
        client_options=FAST,
    )
    async with host:
        root = await host.client.open_run("root-conv", "root-run", depth=1)
        assert root.depth == 1
        h = Harness(host, state)
        h.workspace, h.engine, h.asked = workspace, engine, asked
        yield h


async def test_it_runs_an_acp_child_to_readable_events_usage_and_permission_decisions(harness):
    h = harness
    child = await h.start("hello terminal permission:read permission:execute", cwd="sub")
    assert child.depth == 2
    result, events = await h.read_until(child.child_id, lambda r, ev: r.done)
    assert result.status == "succeeded", result.error
    assert result.output == "Echo: hello terminal permission:read permission:execute"

    # The agent ran in the child's cwd at the child's level, without the runner's token, and
    # was given Canopy's MCP server with the run token and depth headers.
    (info,) = h.started()
    assert info["cwd"] == str((h.workspace / "sub").resolve())
    assert info["depth"] == "2" and info["token"] == "-"
    (server,) = info["mcpServers"]
    assert server["type"] == "http" and server["url"] == "http://127.0.0.1:9/mcp"
    headers = {hd["name"]: hd["value"] for hd in server["headers"]}
    assert headers == {
        "Authorization": f"Bearer run-token-{child.run_id}",
        "X-Pando-Delegation-Depth": "2",
    }
    assert not pid_alive(info["pid"])

    kinds = [e.kind for e in events]
    assert kinds[0] == "session" and kinds[-1] == "result"
    # Two thought chunks and three message chunks, each coalesced into one readable event.
    assert [e.text for e in events if e.kind == "thinking"] == ["Thinking about turn 1."]
    assert [e.text for e in events if e.kind == "text"] == [result.output]
    plan = next(e for e in events if e.kind == "plan")
    assert plan.text == "[x] look around\n[~] answer"
    read = [e for e in events if e.tool_call_id == "call-1-read"]
    assert [e.kind for e in read] == ["tool-use", "tool-update", "tool-result"]
    assert read[0].tool_name == "Read notes.md" and read[0].input == {"path": "notes.md"}
    assert read[0].text == "read"
    assert read[1].text == "in_progress"
    assert read[2].success is True and read[2].tool_output == {"bytes": 11}

    # Permissions: the allow-listed kind is allowed once, the other rejected; both recorded.
    permissions = {e.tool_call_id: e for e in events if e.kind == "permission"}
    allowed, denied = permissions["call-1-ask-read"], permissions["call-1-ask-execute"]
    assert allowed.success is True and allowed.input["option"] == "yes"
    assert allowed.input["decision"] == "allowed" and allowed.input["toolKind"] == "read"
    assert denied.success is False and denied.input["option"] == "no"
    assert "not on preset 'acp'" in denied.text
    term = [e for e in events if e.tool_call_id == "term-1"]
    assert [e.kind for e in term] == ["tool-use", "tool-update", "tool-result"]
    assert term[1].input == {"command": "ls"} and term[1].tool_name == "`ls`"
    assert term[2].tool_name == "`ls`" and term[2].tool_output == "a.py"
    results = {e.tool_call_id: e for e in events if e.kind == "tool-result"}
    assert results["call-1-ask-execute"].success is False
    assert results["call-1-ask-execute"].error == "permission denied by the client"

    # usage_update's cumulative cost and the turn's own tokens, in SPEC §10 shape.
    usage = [e.input for e in events if e.kind == "usage"]
    # costSource: added by the server when it stored them (the agent's cost, or none known).
    assert {"inputTokens": 0, "outputTokens": 0, "costUsd": 0.25, "costSource": "agent"} in usage
    assert {
        "inputTokens": 100,
        "outputTokens": 50,
        "cacheReadTokens": 30,
        "costSource": "unpriced",
    } in usage
    assert h.asked == [child.run_id]


async def test_it_queues_a_steer_for_the_next_prompt_and_refuses_one_after_the_end(harness):
    h = harness
    child = await h.start("slow")
    await h.read_until(
        child.child_id, lambda r, ev: any("[working 0]" in (e.text or "") for e in ev)
    )
    outcome = await h.steer(child.child_id, "turn left", "s1")
    assert outcome.injected
    # The server answers once the steer is queued for the runner; end the slow turn only once
    # the runner has it, or the steer would arrive after the session ended.
    ctx = h.host.runs[child.run_id]
    for _ in range(200):
        if not ctx.steers.empty():
            break
        await asyncio.sleep(0.05)
    assert not ctx.steers.empty()
    (h.state / "release").touch()
    result, events = await h.read_until(child.child_id, lambda r, ev: r.done)
    assert result.status == "succeeded", result.error
    # The steer became the next prompt, after the slow turn ended.
    assert result.output == "Echo: turn left"
    texts = [e.text for e in events if e.kind == "text"]
    assert any(t.startswith("[working 0]") for t in texts)
    # Progress and answer are separate messages (messageId), so separate events.
    assert "Echo: slow" in texts and texts[-1] == "Echo: turn left"
    order = [e.kind for e in events]
    assert order.index("steer") < len(order) - 1 - order[::-1].index("thinking")
    assert len([e for e in events if e.kind == "usage" and "costUsd" in e.input]) == 2
    # After the session ended, a steer needs a new prompt.
    late = await h.steer(child.child_id, "too late", "s2")
    assert not late.injected and late.reason == "noRunningTurn"


async def test_it_cancels_with_session_cancel_and_stops_a_stubborn_agent(harness):
    h = harness
    child = await h.start("slow")
    await h.read_until(
        child.child_id, lambda r, ev: any("[working 0]" in (e.text or "") for e in ev)
    )
    pid = h.started()[-1]["pid"]
    await h.c.child_cancel("root-run", h.ext, h.gen, child.child_id)
    result, events = await h.read_until(child.child_id, lambda r, ev: r.done)
    assert result.cancelled and result.status == "cancelled"
    # The agent heard session/cancel and ended its turn itself, well inside the grace.
    # (That text is the proof; how fast it came depends on the machine's load.)
    assert any(e.text == "Stopping as asked." for e in events if e.kind == "text")
    assert not pid_alive(pid)

    stubborn = await h.start("stubborn", profile="stubborn")
    await h.read_until(
        stubborn.child_id, lambda r, ev: any("[working 0]" in (e.text or "") for e in ev)
    )
    pid = h.started()[-1]["pid"]
    sent = time.monotonic()
    await h.c.child_cancel("root-run", h.ext, h.gen, stubborn.child_id)
    result, _ = await h.read_until(stubborn.child_id, lambda r, ev: r.done)
    assert result.cancelled
    # session/cancel grace, then SIGTERM (ignored) grace, then SIGKILL: a lower bound, which
    # load cannot break, where a sleep-then-check could outlast the grace on a busy machine.
    assert time.monotonic() - sent >= 1.0
    assert not pid_alive(pid)


async def test_it_resumes_with_session_load_or_refuses_clearly(harness):
    h = harness
    first = await h.start("remember the number 7")
    result, _ = await h.read_until(first.child_id, lambda r, ev: r.done)
    assert result.status == "succeeded"
    session_id = h.engine.sessions[first.child_id]

    again = await h.start("again", resume=first.child_id)
    assert again.child_id == first.child_id and again.run_id != first.run_id
    result, events = await h.read_until(again.child_id, lambda r, ev: r.done, run_id=again.run_id)
    assert result.status == "succeeded", result.error
    assert result.output == "Echo: again"
    run_events = [e for e in events if e.kind == "session"]
    assert run_events[-1].text == f"ACP session {session_id} loaded"
    # The history the agent replays on load is not this run's output.
    assert not any(e.kind == "user" for e in events)
    assert len(h.started()) == 1  # session/load, not a second session/new
    # The loaded session's cumulative cost went from 0.25 to 0.50: this run spent 0.25.
    assert [e.input["costUsd"] for e in events if e.kind == "usage" and "costUsd" in e.input] == [
        0.25
    ]

    other = await h.start("fresh", profile="noload")
    await h.read_until(other.child_id, lambda r, ev: r.done)
    refused = await h.start("again", profile="noload", resume=other.child_id)
    result, _ = await h.read_until(refused.child_id, lambda r, ev: r.done, run_id=refused.run_id)
    assert result.status == "failed"
    assert result.error == "resume: preset 'noload''s ACP agent does not offer session/load"


async def test_it_fails_a_child_the_agent_refuses(harness):
    h = harness
    child = await h.start("refuse")
    result, events = await h.read_until(child.child_id, lambda r, ev: r.done)
    assert result.status == "failed"
    assert result.error == "the agent refused to continue (stopReason refusal)"
    assert any(e.kind == "error" for e in events)


async def test_it_runs_a_root_through_the_runner_command_line_with_engine_acp(
    daphne_server, tmp_path
):
    _runner, token = await sync_to_async(tokens.create_runner)("acp-cli")
    config = tmp_path / "presets.json"
    state = tmp_path / "state"
    state.mkdir()
    preset = {
        "name": "acp",
        "command": AGENT,
        "allowToolKinds": ["read"],
        "env": {"ACP_AGENT_STATE": str(state)},
        # Sandboxed, as a preset is by default: its state is inside the workspace (".").
    }
    config.write_text(json.dumps({"workspace": ".", "presets": [preset]}))
    env = {**os.environ, "CANOPY_RUNNER_TOKEN": token}
    env.pop("PANDO_DELEGATION_DEPTH", None)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "manage.py", "runner", "--url", daphne_server.ws_url, "--engine", "acp"]
        + ["--config", str(config), "--root", "from the command line", "--once"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    runs = await sync_to_async(list)(Run.objects.values_list("depth", "status", "output"))
    assert runs == [(0, "succeeded", "Echo: from the command line")]
    # The agent got Canopy's MCP server with a run token the server issued for this run.
    (started,) = [json.loads(line) for line in (state / "started.jsonl").read_text().splitlines()]
    # In its sandbox: its own pid namespace, and an unprivileged uid under a root runner.
    assert started["pid"] <= 3 and started["token"] == "-", started
    assert started["uid"] != 0, started
    (server,) = started["mcpServers"]
    assert (server["type"], server["name"]) == ("http", "canopy")
    assert server["url"] == daphne_server.http_url + "/mcp"
    headers = {h["name"]: h["value"] for h in server["headers"]}
    assert headers["X-Pando-Delegation-Depth"] == "0"
    assert headers["Authorization"].startswith("Bearer cnt_")
    assert headers["Authorization"].removeprefix("Bearer ") not in done.stderr + done.stdout


async def test_it_keeps_every_event_of_a_fast_agent_in_order(harness):
    h = harness
    n = 1000
    sent = time.monotonic()
    child = await h.start(f"flood:{n}")
    result, events = await h.read_until(child.child_id, lambda r, ev: r.done, timeout=90)
    elapsed = time.monotonic() - sent
    assert result.status == "succeeded", result.error
    flood = [(e.kind, e.tool_call_id) for e in events if (e.tool_call_id or "").startswith("f")]
    expected = []
    for i in range(n):
        expected += [("tool-use", f"f{i}"), ("tool-result", f"f{i}")]
    assert flood == expected
    stamps = await sync_to_async(
        lambda: list(
            Event.objects.filter(run__run_id=child.run_id, tool_call_id__in=["f0", f"f{n - 1}"])
            .order_by("sequence")
            .values_list("created_at", flat=True)
        )
    )()
    stored = (stamps[-1] - stamps[0]).total_seconds()
    print(
        f"\nacp: {2 * n} flood events stored in {stored:.2f}s ({2 * n / max(stored, 1e-6):.0f}/s);"
        f" {len(events)} events end to end in {elapsed:.2f}s, agent start included"
    )


def test_it_reads_the_documented_acp_presets_and_refuses_bad_ones(tmp_path):
    readme = (PROJECT / "docs" / "how-to" / "connect-an-acp-agent.md").read_text()
    block = next(
        b.split("```", 1)[0]
        for b in readme.split("```json\n")[1:]
        if b.startswith('{"presets": [{"name": "claude"')
    )
    engine = AcpEngine.from_config(json.loads(block), workspace=str(tmp_path))
    preset = engine.presets_by_name["claude"]
    assert preset.command == ["claude-agent-acp"]
    assert preset.allow_tool_kinds == ("read", "search")
    assert preset.mcp_token_via == "env"
    assert AcpPreset.from_config({"name": "x", "command": ["a"]}).mcp_token_via == "header"
    with pytest.raises(ValueError, match="'mcpTokenVia' must be one of header, env, not 'argv'"):
        AcpPreset.from_config({"name": "x", "command": ["a"], "mcpTokenVia": "argv"})
    with pytest.raises(ValueError, match=r"'allowToolKinds' has unknown kind\(s\) shell"):
        AcpPreset.from_config({"name": "x", "command": ["a"], "allowToolKinds": ["shell"]})
    with pytest.raises(ValueError, match="unknown field"):
        AcpPreset.from_config({"name": "x", "command": ["a"], "format": "lines"})


async def test_it_fails_a_child_whose_agent_dies_with_what_it_said(harness):
    h = harness
    child = await h.start("anything", profile="crash")
    result, _ = await h.read_until(child.child_id, lambda r, ev: r.done)
    assert result.status == "failed"
    assert result.error.startswith("ACP agent failed: ")
    assert result.error.endswith("stderr: fatal: the model endpoint is unreachable")

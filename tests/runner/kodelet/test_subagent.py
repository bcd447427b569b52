"""kodelet's published ``kodelet-subagent`` (PyPI, unmodified) hosted by the reference runner
against a real server: its six tools, each background agent a Canopy child run through
Canopy's ``kodelet acp``, its leases Canopy leases, the depth cap applying (SPEC §15)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event, Lease, Run
from delegation.runner.host import RunnerHost
from delegation.runner.kodelet.engine import ExtensionHosting
from delegation.runner.kodelet.spec import ExtensionSpec
from delegation.runner.scripted import ScriptedConfig, ScriptedEngine
from delegation.services import tokens
from tests.runner.kodelet.tool_script import ToolScriptEngine
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
]

SUBAGENT = ExtensionSpec((sys.executable, "-m", "kodelet_subagent"), {}, "worker")


def plan(path: str, **more) -> str:
    return "\n\n[scripted " + json.dumps({"path": path, **more}, separators=(",", ":")) + "]"


def hosting() -> tuple[ToolScriptEngine, ExtensionHosting]:
    inner = ToolScriptEngine()
    return inner, ExtensionHosting(inner, {"boss": (SUBAGENT,)})


@sync_to_async
def tree(root_run_id: str) -> dict:
    root = Run.objects.select_related("session").get(run_id=root_run_id)
    children = list(
        Run.objects.filter(parent=root).select_related("session").order_by("created_at", "id")
    )
    return {
        "root": root,
        "children": children,
        "events": {
            r.run_id: list(Event.objects.filter(run=r).order_by("sequence").values("kind", "text"))
            for r in [root, *children]
        },
        "leases": list(Lease.objects.filter(parent_run=root).values("lease_id", "state")),
    }


def kodelet_processes() -> list[int]:
    """Our ``kodelet`` and hosted extension processes still alive on this machine."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"delegation.runner.kodelet.acp" in cmdline or b"-m kodelet_subagent" in cmdline:
            found.append(int(pid))
    return found


async def new_token(name: str) -> str:
    _runner, token = await sync_to_async(tokens.create_runner)(name)
    return token


def content(results: list[dict], index: int) -> str:
    return str(results[index]["result"].get("content", ""))


async def test_it_runs_kodelet_subagents_as_canopy_children(daphne_factory):
    server = daphne_factory()
    inner, engine = hosting()
    script = [
        # 0: the default context mode forks the live conversation: refused by name (a
        # scripted preset cannot fork; test_claude_code_fork.py forks a Claude Code one).
        {"tool": "spawn_agent", "input": {"name": "forker", "task": "t" + plan("f")}},
        # 1, 2: a child that finishes; its result comes back through wait_agent.
        {
            "tool": "spawn_agent",
            "input": {"name": "reviewer", "task": "Review it" + plan("r"), "context_mode": "fresh"},
        },
        {"tool": "wait_agent", "input": {"agent_id": "$reviewer", "timeout_ms": 60000}},
        # 3
        {"tool": "list_agents"},
        # 4..: a long child, steered, then cancelled.
        {
            "tool": "spawn_agent",
            "input": {
                "name": "slow",
                "task": "Take long" + plan("s", long=True),
                "context_mode": "fresh",
            },
        },
        {"until": "slow", "status": "running"},
        {"sleep": 0.5},
        {"tool": "steer_agent", "input": {"agent_id": "$slow", "message": "focus on the tests"}},
        {"sleep": 2.5},
        {"tool": "cancel_agent", "input": {"agent_id": "$slow"}},
        # 7: the cancelled agent's kodelet acp (the only one left running) is gone.
        {"processes": "kodelet"},
        # 8, 9: a follow-up of the finished child: the same conversation, a new run.
        {
            "tool": "followup_agent",
            "input": {"agent_id": "$reviewer", "task": "Again" + plan("r2")},
        },
        {"tool": "wait_agent", "input": {"agent_id": "$reviewer", "timeout_ms": 60000}},
    ]
    token = await new_token("kodelet-host")
    async with RunnerHost(server.ws_url, token, engine, client_options=FAST) as host:
        root = await host.open_root(json.dumps(script), profile="boss")
        await host.wait(root.run_id, timeout=100)
        results = inner.results[root.run_id]
        assert [r["tool"] for r in results] == [
            "spawn_agent", "spawn_agent", "wait_agent", "list_agents", "spawn_agent",
            "steer_agent", "cancel_agent", "processes", "followup_agent", "wait_agent",
        ]  # fmt: skip
        assert "requires live conversation forking" in content(results, 0), results[0]
        assert "Done with Review it" in content(results, 2), results[2]
        listed = results[3]["result"]["structuredContent"]["agents"]
        assert [a["name"] for a in listed] == ["reviewer"]
        assert results[5]["result"]["structuredContent"]["accepted"] is True
        assert "Canceled agent 'slow'" in content(results, 6), results[6]
        assert content(results, 7) == "0", "a kodelet acp process outlived cancel_agent"
        assert "Done with Again" in content(results, 9), results[9]
        record = await tree(root.run_id)
    root_run, children = record["root"], record["children"]
    by_conversation: dict[str, list[Run]] = {}
    for child in children:
        by_conversation.setdefault(child.session.conversation_id, []).append(child)
        assert child.depth == root_run.depth + 1
        assert child.session.profile == "worker"
        assert child.lease_id is not None  # each under the lease its agent acquired
    assert len(children) == 3 and len(by_conversation) == 2, children
    reviewer_runs = next(runs for runs in by_conversation.values() if len(runs) == 2)
    assert [r.output for r in reviewer_runs] == ["Done with Review it", "Done with Again"]
    slow = next(runs[0] for runs in by_conversation.values() if len(runs) == 1)
    assert slow.cancelled
    slow_events = record["events"][slow.run_id]
    assert any(e["kind"] == "steer" for e in slow_events), slow_events
    assert any(
        "focus on the tests" in (e["text"] or "") for e in slow_events if e["kind"] == "text"
    )
    # Every lease the extension acquired is a Canopy lease, released by the end.
    assert len(record["leases"]) == 3
    assert {lease["state"] for lease in record["leases"]} == {"released"}, record["leases"]
    for _ in range(50):
        if not kodelet_processes():
            break
        await asyncio.sleep(0.1)
    assert kodelet_processes() == []


async def test_it_refuses_a_spawn_past_the_depth_cap_and_the_extension_reports_it(
    daphne_factory,
):
    server = daphne_factory(DELEGATION_MAX_DEPTH=1)
    inner, engine = hosting()
    script = [
        {
            "tool": "spawn_agent",
            "input": {"name": "deep", "task": "Go deeper" + plan("d"), "context_mode": "fresh"},
        },
        {"tool": "wait_agent", "input": {"agent_id": "$deep", "timeout_ms": 30000}},
    ]
    token = await new_token("kodelet-deep")
    async with RunnerHost(server.ws_url, token, engine, client_options=FAST) as host:
        root = await host.open_root(json.dumps(script), profile="boss", depth=1)
        await host.wait(root.run_id, timeout=60)
        results = inner.results[root.run_id]
        waited = results[1]["result"]
        assert waited["structuredContent"]["status"] == "failed", waited
        assert "depth" in waited["error"], waited
        record = await tree(root.run_id)
    assert record["children"] == []
    assert any(e["kind"] == "delegation-refused" for e in record["events"][root.run_id])


async def test_it_stops_the_agents_and_releases_their_leases_when_the_hosting_run_ends(
    daphne_factory,
):
    server = daphne_factory()
    inner, engine = hosting()
    script = [
        {
            "tool": "spawn_agent",
            "input": {
                "name": "left",
                "task": "Run on" + plan("l", long=True),
                "context_mode": "fresh",
            },
        },
        {"until": "left", "status": "running"},
    ]
    token = await new_token("kodelet-end")
    async with RunnerHost(server.ws_url, token, engine, client_options=FAST) as host:
        root = await host.open_root(json.dumps(script), profile="boss")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await host.wait(root.run_id, timeout=60)
        took = loop.time() - started
        record = await tree(root.run_id)
    assert took < 20, f"the hosting run took {took:.1f}s to end"
    [child] = record["children"]
    await sync_to_async(child.refresh_from_db)()
    assert child.cancelled and child.depth == 1
    assert [lease["state"] for lease in record["leases"]] == ["released"]
    assert kodelet_processes() == []


async def test_the_trees_budget_and_approvals_apply_to_kodelet_children(
    daphne_factory, operator_token
):
    """A kodelet-subagent agent is a child like any other: its approval is an inbox item of
    that child run in the hosting tree, the operator's denial reaches it; and a spawn past the
    tree's budget (maxRuns 1) is refused, kodelet-subagent reporting the budget's error."""
    server = daphne_factory()
    asking = ScriptedEngine(
        ScriptedConfig(pace=0.02, steps=1, fanout=0, depth=0, tool_fail_rate=0.0, approval_rate=1.0)
    )
    inner = ToolScriptEngine(asking)
    engine = ExtensionHosting(inner, {"boss": (SUBAGENT,)})
    fresh = {"context_mode": "fresh"}
    script = [
        {"tool": "spawn_agent", "input": {"name": "asker", "task": "Test" + plan("a"), **fresh}},
        {"tool": "wait_agent", "input": {"agent_id": "$asker", "timeout_ms": 60000}},
        {"tool": "spawn_agent", "input": {"name": "extra", "task": "More" + plan("b"), **fresh}},
        {"tool": "wait_agent", "input": {"agent_id": "$extra", "timeout_ms": 30000}},
    ]
    token = await new_token("kodelet-rules")
    auth = {"Authorization": f"Bearer {operator_token}"}
    async with (
        RunnerHost(server.ws_url, token, engine, client_options=FAST) as host,
        httpx.AsyncClient(base_url=server.http_url, headers=auth, timeout=30) as http,
    ):
        root = await host.open_root(json.dumps(script), profile="boss", budget={"maxRuns": 1})
        for _ in range(300):
            items = (await http.get("/api/approvals", params={"status": "pending"})).json()
            mine = [i for i in items["items"] if i["rootRunId"] == root.run_id]
            if mine:
                break
            await asyncio.sleep(0.1)
        [asked] = mine
        assert (asked["depth"], asked["toolName"], asked["profile"]) == (1, "Bash", "worker")
        url = f"/api/approvals/{asked['approvalId']}/decision"
        body = {"decision": "deny", "message": "not on this branch"}
        assert (await http.post(url, json=body)).status_code == 200
        await host.wait(root.run_id, timeout=90)
        results = inner.results[root.run_id]
        record = await tree(root.run_id)
    [child] = record["children"]
    assert child.run_id == asked["runId"] and child.status == "succeeded"
    said = " ".join(e["text"] or "" for e in record["events"][child.run_id])
    assert "not on this branch" in said, said  # the denial reached the kodelet child
    refused = results[3]["result"]
    assert refused["structuredContent"]["status"] == "failed", refused
    assert "budget" in refused["error"] and "maxRuns" in refused["error"], refused

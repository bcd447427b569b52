"""The host methods kodelet-subagent does not use, through an extension written with
kodelet's SDK: ``kodelet.ui.confirm`` is one question an operator answers in the inbox (REST
here), ``kodelet.tool.update`` and ``kodelet.ui.notify`` are events of the run, and an
extension that dies is started again while its tools say so (SPEC §15)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from contextlib import asynccontextmanager

import httpx
import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event
from delegation.runner.host import RunnerHost
from delegation.runner.kodelet.engine import ExtensionHosting
from delegation.runner.kodelet.spec import ExtensionSpec
from delegation.services import tokens
from tests.runner.kodelet.tool_script import ToolScriptEngine
from tests.support.paths import AGENTS
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
]

PROBE = ExtensionSpec((sys.executable, str(AGENTS / "kodelet_probe.py")))


@asynccontextmanager
async def probe_host(server, operator_token: str, name: str):
    """``(inner, host, http)``: the probe extension hosted for preset ``boss`` on a runner
    registered as ``name`` (``inner`` runs the tool script and keeps its results), and an
    operator's REST client."""
    inner = ToolScriptEngine()
    engine = ExtensionHosting(inner, {"boss": (PROBE,)})
    _runner, token = await sync_to_async(tokens.create_runner)(name)
    auth = {"Authorization": f"Bearer {operator_token}"}
    async with (
        RunnerHost(server.ws_url, token, engine, client_options=FAST) as host,
        httpx.AsyncClient(base_url=server.http_url, headers=auth, timeout=30) as http,
    ):
        yield inner, host, http


async def pending(http, title: str) -> dict:
    """The pending question with that title, once it is in the inbox."""
    for _ in range(300):
        items = (await http.get("/api/approvals", params={"status": "pending"})).json()["items"]
        found = [item for item in items if item["title"] == title]
        if found:
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no question {title!r} in the inbox")


async def test_it_maps_confirm_update_notify_and_restarts_a_dead_extension(
    daphne_server, operator_token
):
    script = [
        {"tool": "ask", "input": {"question": "Ship the release?"}},
        {"tool": "pick"},
        {"tool": "pid"},
        {"tool": "die"},
        {"tool": "pid"},
        {"sleep": 3},
        {"tool": "pid"},
    ]
    hosted = probe_host(daphne_server, operator_token, "kodelet-probe")
    async with hosted as (inner, host, http):
        root = await host.open_root(json.dumps(script), profile="boss")
        question = await pending(http, "Ship the release?")
        assert question["runId"] == root.run_id and question["kind"] == "question"
        url = f"/api/approvals/{question['approvalId']}/decision"
        assert (await http.post(url, json={"decision": "allow"})).status_code == 200
        # select: the operator's answer is the decision's message, one of the options.
        choice = await pending(http, "Which colour?")
        url = f"/api/approvals/{choice['approvalId']}/decision"
        body = {"decision": "allow", "message": "green"}
        assert (await http.post(url, json=body)).status_code == 200
        await host.wait(root.run_id, timeout=60)
    results = [r["result"] for r in inner.results[root.run_id]]
    assert results[0]["content"] == "confirmed=True", results[0]
    assert results[1]["content"] == "picked=green", results[1]
    first_pid = results[2]["content"]
    assert results[3].get("error")  # it died answering
    assert "restarting" in results[4]["error"], results[4]
    assert results[5]["content"].isdigit() and results[5]["content"] != first_pid, results[5]
    events = await sync_to_async(
        lambda: list(
            Event.objects.filter(run__run_id=root.run_id).values_list(
                "kind", "text", "tool_call_id"
            )
        )
    )()
    assert ("tool-update", "thinking about it", "call-0") in events, events
    assert ("notify", "asking the operator", None) in events, events
    assert any(k == "notify" and "restarting" in (t or "") for k, t, _ in events), events


async def test_it_asks_the_operator_for_an_extensions_input_in_the_inbox(
    daphne_server, operator_token
):
    """``kodelet.ui.input``: one question in the inbox with the extension's text; the
    operator's message is the value the extension gets, a denial is its cancel (None). And a
    tool the extension's ``agent.init`` answer disables is neither listed nor callable."""
    script = [
        {"tool": "name_it", "input": {"title": "Release name?"}},
        {"tool": "name_it", "input": {"title": "Codename?"}},
        {"tool": "hidden"},  # disabled by the probe's agent.init answer
    ]
    hosted = probe_host(daphne_server, operator_token, "kodelet-input")
    async with hosted as (inner, host, http):
        root = await host.open_root(json.dumps(script), profile="boss")
        question = await pending(http, "Release name?")
        assert question["runId"] == root.run_id and question["kind"] == "question"
        assert question["toolName"].endswith(".input")  # <extension id>.<method>
        assert question["input"]["message"] == "Name the release"  # the extension's text
        assert question["canEdit"] is False
        url = f"/api/approvals/{question['approvalId']}/decision"
        body = {"decision": "allow", "message": "Aspen"}
        assert (await http.post(url, json=body)).status_code == 200
        second = await pending(http, "Codename?")
        url = f"/api/approvals/{second['approvalId']}/decision"
        body = {"decision": "deny", "message": "not now"}
        assert (await http.post(url, json=body)).status_code == 200
        await host.wait(root.run_id, timeout=60)
        asked = (await http.get("/api/approvals", params={"run": root.run_id})).json()
    results = [r["result"]["content"] for r in inner.results[root.run_id]]
    assert results == ["named=Aspen", "named=None", "no hosted extension offers 'hidden'"]
    listed = await sync_to_async(
        lambda: Event.objects.get(run__run_id=root.run_id, kind="extension-tools").input
    )()
    assert "name_it" in [t["name"] for t in listed["tools"]]
    assert "hidden" not in [t["name"] for t in listed["tools"]], listed
    titles = sorted(item["title"] for item in asked["items"] if item["runId"] == root.run_id)
    assert titles == ["Codename?", "Release name?"], asked  # one item each, no more


SECRET = "hunter2-DEPLOY-KEY-7731"


def rows_holding(text: str) -> list[str]:
    """Every stored row a person could read (or the outbox resend) that holds ``text``."""
    from delegation.models import Approval, AuditEntry, Command

    found = []
    for model in (Approval, Event, AuditEntry, Command):
        for row in model.objects.values():
            if text in repr(row):
                found.append(f"{model.__name__} {row}")
    return found


async def test_it_passes_a_secret_input_to_the_extension_and_stores_it_nowhere(
    daphne_server, operator_token
):
    """``kodelet.ui.input`` with ``secret: true``: the extension gets the operator's answer;
    the approval, its event and the audit entry say "(secret)", and once the runner has the
    answer the outbox's copy goes too (kodelet-extensions.md)."""
    script = [{"tool": "name_it", "input": {"title": "Deploy key?", "secret": True}}]
    hosted = probe_host(daphne_server, operator_token, "kodelet-secret")
    async with hosted as (inner, host, http):
        root = await host.open_root(json.dumps(script), profile="boss")
        question = await pending(http, "Deploy key?")
        assert question["input"]["secret"] is True  # the inbox can mask its answer field
        url = f"/api/approvals/{question['approvalId']}/decision"
        answer = await http.post(url, json={"decision": "allow", "message": SECRET})
        assert answer.status_code == 200, answer.text
        assert answer.json()["message"] == "(secret)"
        await host.wait(root.run_id, timeout=60)
        for _ in range(100):  # the runner's answer to approval.decided lands after the run's
            left = await sync_to_async(rows_holding)(SECRET)
            if not left:
                break
            await asyncio.sleep(0.1)
    results = [r["result"]["content"] for r in inner.results[root.run_id]]
    assert results == [f"secret sha256={hashlib.sha256(SECRET.encode()).hexdigest()}"]
    assert left == []
    said = await sync_to_async(rows_holding)("(secret)")
    assert any(row.startswith("AuditEntry") for row in said), said

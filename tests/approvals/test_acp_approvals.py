"""The acp engine asks Canopy (SPEC §11): the real ``claude-code-acp`` adapter, offline,
wants to run a Bash command that writes a file; its ``session/request_permission`` becomes an
approval pending in REST, and the operator's decision reaches the agent as the right option.
An ACP agent takes an option id only, so its approvals offer no edit: an edited allow is 409
and what runs is the input as asked, which is what the record shows (issue 35)."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event
from delegation.runner import model_stub
from delegation.runner.acp import AcpEngine, AcpPreset
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.support.agents import claude_cli
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.timeout(150),
]


def _script(target):
    def script(request):
        if request.tool_results:
            said = request.tool_result_text(request.tool_results[-1])
            return model_stub.Text(f"Tool said: {said.strip()[:200]}")
        command = {"command": f"touch {target}", "description": "Create the marker"}
        return model_stub.ToolCall("Bash", command, text="Creating it.")

    return script


async def _pending(http) -> dict:
    for _ in range(900):
        page = (await http.get("/api/approvals", params={"status": "pending"})).json()
        if page["items"]:
            return page["items"][0]
        await asyncio.sleep(0.1)
    raise AssertionError("no pending approval")


async def _wait_done(c, ext, gen, child):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while True:
        result = await c.child_read("root-run", ext, gen, child.child_id, after=10**9)
        if result.done:
            return result
        assert loop.time() < deadline
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def acp_child(server, tmp_path, operator_token, target):
    """A root run whose child is the real ACP adapter told to touch ``target``; yields the
    operator's REST client, the runner's client with its extension and generation, the child."""
    _runner, token = await sync_to_async(tokens.create_runner)("claude-acp")
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    auth = {"Authorization": f"Bearer {operator_token}"}
    with model_stub.ModelStub(_script(target)) as stub:
        env = claude_cli.offline_env(stub.url, tmp_path / "home", IS_SANDBOX="1")
        preset = AcpPreset(
            "claude",
            [claude_cli.acp_bin()],
            env=env,
            ask_canopy=True,
            allow_hosts=tuple(claude_cli.allow_model(stub.url)),
        )
        engine = AcpEngine([preset], str(workspace))
        host = RunnerHost(server.ws_url, token, engine, extension_id="claude", client_options=FAST)
        ext, gen, c = host.extension_id, host.generation, host.client
        async with (
            host,
            httpx.AsyncClient(base_url=server.http_url, headers=auth, timeout=30) as http,
        ):
            await c.open_run("root-conv", "root-run")
            request = {"requestId": "r1", "profile": "claude", "message": f"touch {target}"}
            child = await c.child_start("root-run", ext, gen, request)
            yield http, (c, ext, gen), child
            await c.finish("root-run", output="ok")


async def test_it_answers_an_acp_permission_request_with_the_operators_decision(
    daphne_server, tmp_path, operator_token
):
    target = tmp_path / "ws" / "made-by-acp.txt"
    async with acp_child(daphne_server, tmp_path, operator_token, target) as (http, rc, child):
        pending = await _pending(http)
        assert pending["runId"] == child.run_id and pending["via"] == "runner"
        assert pending["kind"] == "execute" and not target.exists()
        url = f"/api/approvals/{pending['approvalId']}/decision"
        assert (await http.post(url, json={"decision": "allow"})).status_code == 200
        result = await _wait_done(*rc, child)
    assert result.status == "succeeded", result.error
    assert target.exists()
    kinds = await sync_to_async(
        lambda: list(
            Event.objects.filter(run__run_id=child.run_id)
            .order_by("sequence")
            .values_list("kind", "text")
        )
    )()
    permission = [text for kind, text in kinds if kind == "permission"]
    assert permission and permission[0].startswith("allowed: Canopy: allow"), kinds
    assert [k for k, _ in kinds].index("approval-requested") < [k for k, _ in kinds].index(
        "approval-decided"
    )


async def test_it_refuses_an_edit_the_acp_agent_cannot_run_and_records_what_ran(
    daphne_server, tmp_path, operator_token
):
    """Before: the edit was stored as approved and claude-agent-acp ran the original."""
    original = tmp_path / "ws" / "ORIGINAL-dangerous.txt"
    edited = tmp_path / "ws" / "edited-safe.txt"
    async with acp_child(daphne_server, tmp_path, operator_token, original) as (http, rc, child):
        pending = await _pending(http)
        assert (pending["via"], pending["canEdit"]) == ("runner", False)
        asked = pending["input"]
        assert asked["command"] == f"touch {original}"
        url = f"/api/approvals/{pending['approvalId']}/decision"
        edit = {**asked, "command": f"touch {edited}"}
        refused = await http.post(url, json={"decision": "allow", "updatedInput": edit})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "edit_not_supported_by_door" and "ACP" in error["message"]
        assert not original.exists()  # a refused decision decided nothing
        assert (await http.post(url, json={"decision": "allow"})).status_code == 200
        result = await _wait_done(*rc, child)
        record = (await http.get(f"/api/approvals/{pending['approvalId']}")).json()
    assert result.status == "succeeded", result.error
    # What was decided is what ran, and the record says so.
    assert original.exists() and not edited.exists()
    assert (record["decision"], record["updatedInput"], record["input"]) == ("allow", None, asked)

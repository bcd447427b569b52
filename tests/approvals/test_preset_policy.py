"""A preset's ``approvals`` (SPEC §11) decides through the real runner → server path: the
runner registers the ``acp`` preset with its policy, a child started from it asks before a
Bash ``touch``, and the preset's deny rule refuses it with no operator involved."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from asgiref.sync import sync_to_async

from delegation.runner import model_stub
from delegation.runner.acp import AcpEngine, AcpPreset
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.approvals.test_acp_approvals import _script
from tests.support.agents import claude_cli
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.timeout(150),
]

DENY_TOUCH = {"match": {"tool": "*", "input": "touch *"}, "decision": "deny"}


async def test_it_lets_the_presets_policy_deny_without_an_operator(
    daphne_server, tmp_path, operator_token
):
    _runner, token = await sync_to_async(tokens.create_runner)("claude-acp")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    target = workspace / "refused.txt"
    auth = {"Authorization": f"Bearer {operator_token}"}
    with model_stub.ModelStub(_script(target)) as stub:
        env = claude_cli.offline_env(stub.url, tmp_path / "home", IS_SANDBOX="1")
        preset = AcpPreset.from_config(
            {
                "name": "claude",
                "command": [claude_cli.acp_bin()],
                "env": env,
                "askCanopy": True,
                "sandbox": "none",
                "approvals": {"rules": [DENY_TOUCH]},
            }
        )
        engine = AcpEngine([preset], str(workspace))
        host = RunnerHost(
            daphne_server.ws_url, token, engine, extension_id="claude", client_options=FAST
        )
        ext, gen, c = host.extension_id, host.generation, host.client
        async with (
            host,
            httpx.AsyncClient(base_url=daphne_server.http_url, headers=auth, timeout=30) as http,
        ):
            await c.open_run("root-conv", "root-run")
            request = {"requestId": "r1", "profile": "claude", "message": f"touch {target}"}
            child = await c.child_start("root-run", ext, gen, request)
            policy = await http.get(f"/api/runs/{child.run_id}/approval-policy")
            assert policy.status_code == 200, policy.text
            assert policy.json()["policy"] == {"rules": [DENY_TOUCH], "default": "ask"}, policy.text
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90
            while True:
                result = await c.child_read("root-run", ext, gen, child.child_id, after=10**9)
                if result.done:
                    break
                assert loop.time() < deadline
                await asyncio.sleep(0.1)
            await c.finish("root-run", output="ok")
            page = (await http.get("/api/approvals", params={"run": child.run_id})).json()
    assert not target.exists()
    (approval,) = page["items"]
    assert (approval["status"], approval["decision"], approval["decidedBy"]) == (
        "decided",
        "deny",
        "policy",
    )

"""``contextMode: "fork"`` on an ACP agent (SPEC §14), offline: the acp engine drives the real
claude-agent-acp adapter (pinned by ``make agents``) against the scripted Anthropic endpoint.
The parent delegates through Canopy's ``/mcp`` once as a fork and once fresh: the fork child's
adapter runs ``session/fork`` of the parent's session, so its first model request holds the
parent's earlier messages; the fresh child's does not. A preset that does not say ``canFork``
is refused −32012 before anything starts."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from delegation.runner import model_stub
from delegation.runner.acp import AcpEngine, AcpPreset
from tests.agents.test_claude_fork import SECRET, ForkScript, children_of, said, turns
from tests.support.agents import claude_cli
from tests.support.agents.delegating import AgentTree

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]


def acp_preset(stub_url: str, home, **changes) -> AcpPreset:
    env = claude_cli.offline_env(stub_url, home, IS_SANDBOX="1")
    return AcpPreset(
        "claude",
        [claude_cli.acp_bin()],
        env=env,
        allow_tool_kinds=("execute", "other"),
        mcp_token_via="env",
        allow_hosts=tuple(claude_cli.allow_model(stub_url)),
        **changes,
    )


async def test_it_forks_an_acp_child_from_its_parents_session(daphne_server, tmp_path):
    script = ForkScript()
    (tmp_path / "ws").mkdir()
    with model_stub.ModelStub(script) as stub:
        preset = acp_preset(stub.url, tmp_path / "home", can_fork=True)
        engine = AcpEngine([preset], str(tmp_path / "ws"))
        async with AgentTree(daphne_server, engine, "acp-fork") as tree:
            root = await tree.host.open_root(f"Remember {SECRET}, then delegate.", profile="claude")
            await tree.host.wait(root.run_id, timeout=200)
        parent, children = await sync_to_async(children_of)(root.run_id)

    assert parent.status == "succeeded", parent.error
    assert set(children) == {"fork", "fresh"}
    for child in children.values():
        assert child.status == "succeeded", child.error
    assert parent.agent_session_id
    forked = children["fork"].agent_session_id
    assert forked and forked != parent.agent_session_id
    fork_first, fresh_first = script.first_of["CHILD-FORK"], script.first_of["CHILD-FRESH"]
    assert SECRET in said(fork_first), "the fork child did not get the parent's conversation"
    assert len(turns(fork_first)) > 1
    assert SECRET not in said(fresh_first)


async def test_it_refuses_a_fork_on_an_acp_preset_that_does_not_say_it_forks(
    daphne_server, tmp_path
):
    script = ForkScript()
    (tmp_path / "ws").mkdir()
    with model_stub.ModelStub(script) as stub:
        engine = AcpEngine([acp_preset(stub.url, tmp_path / "home")], str(tmp_path / "ws"))
        async with AgentTree(daphne_server, engine, "acp-no-fork") as tree:
            root = await tree.host.open_root(f"Remember {SECRET}, then delegate.", profile="claude")
            await tree.host.wait(root.run_id, timeout=200)
        parent, children = await sync_to_async(children_of)(root.run_id)
        seen = [repr(request.messages) for request in stub.requests]
    # The fork was refused at child.start (nothing stored); the fresh child ran.
    assert set(children) == {"fresh"}
    assert "CHILD-FORK" not in script.first_of
    refused = [m for m in seen if "-32012" in m and "cannot fork" in m]
    assert refused, "the parent's delegate call was not refused with -32012"

"""A refusal through the MCP front door names the door it came through: an agent's refused
spawn is ``mcp:<runner>`` on the parent's stream, whether depth or a budget refused it."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from delegation.errors import BUDGET_EXHAUSTED
from delegation.models import Event
from delegation.services import tokens
from tests.support.mcp_tools import LiveRunner, mcp_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def runner_token(transactional_db):
    return tokens.create_runner("mcp-runner")[1]


async def test_it_labels_a_budget_refusal_through_mcp_with_the_mcp_door(
    daphne_server,
    runner_token,
):
    async with LiveRunner(daphne_server, runner_token) as live:
        await live.open("root-1", budget={"maxRuns": 0})
        issued = await live.run_token("root-1")
        async with mcp_session(issued["url"], issued["token"]) as mcp:
            refused = await mcp.call_tool("delegate", {"profile": "worker", "message": "x"})
    assert refused.is_error and refused.structured_content["code"] == BUDGET_EXHAUSTED
    refusals = await sync_to_async(list)(
        Event.objects.filter(run__run_id="root-1", kind="delegation-refused")
    )
    assert [event.actor for event in refusals] == ["mcp:mcp-runner"]

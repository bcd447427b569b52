"""``client.await_children`` (issue 24): the SDK's join over a runner's children, built on
``child.read``, against a real daphne server."""

from __future__ import annotations

import asyncio

import pytest

from delegation.client import InvalidParams, NotOwned
from delegation.services import tokens
from tests.support.mcp_tools import LiveRunner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture
def runner_token(transactional_db):
    return tokens.create_runner("sdk-join")[1]


async def _children(live, parent: str, n: int) -> list:
    started = []
    for index in range(n):
        request = {"requestId": f"{parent}-{index}", "profile": "worker", "message": "x"}
        started.append(await live.client.child_start(parent, "ext", 1, request))
    return started


async def test_it_joins_a_quorum_of_children_then_all_of_them(daphne_server, runner_token):
    async with LiveRunner(daphne_server, runner_token) as live:
        await live.open("root-1")
        children = await _children(live, "root-1", 3)
        ids = [c.child_id for c in children]
        client = live.client
        timed_out = await client.await_children("root-1", "ext", 1, ids, wait_seconds=0.3)
        assert not timed_out.done and [r.status for r in timed_out.results] == ["running"] * 3

        async def finish(child, text):
            await client.emit(child.run_id, {"kind": "result", "text": text})
            await client.finish(child.run_id, output=text)

        joining = asyncio.ensure_future(
            client.await_children("root-1", "ext", 1, ids, mode="quorum", quorum=2, wait_seconds=20)
        )
        await finish(
            children[2], 'c done\n```canopy-conclusion\n{"status": "done", "summary": "c"}\n```'
        )
        await asyncio.sleep(0.3)
        assert not joining.done()
        await finish(children[0], "a done")
        quorum = await asyncio.wait_for(joining, 20)
        assert quorum.done and [r.done for r in quorum.results] == [True, False, True]
        assert quorum.results[2].conclusion["summary"] == "c"
        assert quorum.results[0].conclusion is None
        assert all(r.events == [] for r in quorum.results)
        await finish(children[1], "b done")
        every = await client.await_children("root-1", "ext", 1, ids, mode="all", wait_seconds=5)
        assert every.done and [r.output for r in every.results][:2] == ["a done", "b done"]
        anyone = await client.await_children("root-1", "ext", 1, ids, mode="any")
        assert anyone.done


async def test_it_refuses_another_runs_child_and_a_malformed_join(daphne_server, runner_token):
    async with LiveRunner(daphne_server, runner_token) as live:
        await live.open("root-1")
        await live.open("root-2")
        (mine,) = await _children(live, "root-1", 1)
        (theirs,) = await _children(live, "root-2", 1)
        client = live.client
        with pytest.raises(NotOwned):
            await client.await_children("root-1", "ext", 1, [mine.child_id, theirs.child_id])
        for ids, kw in (
            ([], {}),
            ([f"c{i}" for i in range(65)], {}),
            (["a", "a"], {}),
            (["a", "b"], {"mode": "quorum", "quorum": 3}),
            (["a"], {"mode": "all", "quorum": 1}),
            (["a"], {"mode": "most"}),
        ):
            with pytest.raises(InvalidParams):
                await client.await_children("root-1", "ext", 1, ids, **kw)

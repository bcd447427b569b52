"""Fan out and join (SPEC §9): ``await_children`` and ``conclude`` through the official MCP
client over real HTTP against a live daphne, with the SDK as the runner that hosts the
children (the test plays each child's agent by emitting and finishing its run); and the
same join for runners, the SDK's ``client.await_children``."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from delegation.client import InvalidParams, NotOwned
from delegation.errors import INVALID_PARAMS, NOT_OWNED
from delegation.models import AuditEntry, Event, Run
from delegation.services import tokens
from tests.support.mcp_tools import LiveRunner, connections_held, mcp_session, waiting_calls

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def runner_token(transactional_db):
    return tokens.create_runner("join-runner")[1]


@pytest.fixture
async def live(daphne_server, runner_token):
    async with LiveRunner(daphne_server, runner_token) as runner:
        yield runner


async def _fan_out(live, mcp, n: int) -> list[dict]:
    children = []
    for index in range(n):
        answer = await mcp.call_tool("delegate", {"profile": "worker", "message": f"part {index}"})
        assert not answer.is_error, answer
        children.append(answer.structured_content)
    for child in children:
        await live.wait_command("child.execute", child["runId"])
    return children


async def _finish(live, child: dict, text: str) -> None:
    await live.client.emit(child["runId"], {"kind": "result", "text": text})
    await live.client.finish(child["runId"], output=text)


async def test_it_answers_any_when_the_first_child_finishes_and_all_when_every_one_has(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        children = await _fan_out(live, mcp, 3)
        ids = [c["conversationId"] for c in children]
        progress = []

        async def on_progress(value, total, message):
            progress.append(message)

        waiting = asyncio.ensure_future(
            mcp.call_tool(
                "await_children",
                {"childIds": ids, "mode": "any", "waitSeconds": 30},
                progress_callback=on_progress,
            )
        )
        while not progress:
            await asyncio.sleep(0.01)
        assert not waiting.done()
        await _finish(live, children[1], "second part done")
        anyone = (await asyncio.wait_for(waiting, 20)).structured_content
        assert anyone["done"] is True
        assert [r["conversationId"] for r in anyone["results"]] == ids
        assert [r["done"] for r in anyone["results"]] == [False, True, False]
        assert anyone["results"][1]["output"] == "second part done"
        assert progress[0] == "waiting for 1 of 3 children (any)"

        waiting = asyncio.ensure_future(
            mcp.call_tool("await_children", {"childIds": ids, "mode": "all", "waitSeconds": 30})
        )
        await _finish(live, children[0], "first part done")
        await asyncio.sleep(0.3)
        assert not waiting.done()  # two of three is not all
        await _finish(live, children[2], "third part done")
        every = (await asyncio.wait_for(waiting, 20)).structured_content
    assert every["done"] is True
    assert [r["status"] for r in every["results"]] == ["succeeded"] * 3
    assert all(r["events"] == [] for r in every["results"])


async def test_it_answers_done_false_with_the_states_when_the_wait_ends_first(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        children = await _fan_out(live, mcp, 2)
        await _finish(live, children[0], "one")
        ids = [c["conversationId"] for c in children]
        answer = await mcp.call_tool(
            "await_children", {"childIds": ids, "mode": "quorum", "quorum": 2, "waitSeconds": 1}
        )
        at_once = await mcp.call_tool("await_children", {"childIds": ids, "mode": "any"})
    assert not answer.is_error, answer
    assert answer.structured_content["done"] is False
    assert [r["status"] for r in answer.structured_content["results"]] == ["succeeded", "running"]
    assert at_once.structured_content["done"] is True


async def test_it_refuses_a_join_over_another_runs_child_revealing_nothing(live):
    await live.open("root-1")
    await live.open("root-2")
    one = await live.run_token("root-1")
    two = await live.run_token("root-2")
    async with mcp_session(one["url"], one["token"]) as mcp:
        (theirs,) = await _fan_out(live, mcp, 1)
        await _finish(live, theirs, "their secret output")
    async with mcp_session(two["url"], two["token"]) as mcp:
        (mine,) = await _fan_out(live, mcp, 1)
        answers = {}
        for target in (theirs["conversationId"], "c-does-not-exist"):
            answers[target] = await mcp.call_tool(
                "await_children",
                {"childIds": [mine["conversationId"], target], "mode": "any", "waitSeconds": 5},
            )
    for target, answer in answers.items():
        assert answer.is_error and answer.structured_content["code"] == NOT_OWNED, answer
        message = answer.structured_content["message"]
        assert message.startswith("childIds[1]: ") and target in message, message
        assert "secret" not in answer.content[0].text and "results" not in answer.content[0].text
    refused, missing = (a.structured_content["message"] for a in answers.values())
    assert refused.replace(theirs["conversationId"], "X") == missing.replace(
        "c-does-not-exist", "X"
    )


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"childIds": [f"c-{i}" for i in range(65)], "mode": "all"}, "childIds: must name 1 to 64"),
        ({"childIds": [], "mode": "all"}, "childIds: must name 1 to 64"),
        ({"childIds": ["c-1", "c-2", "c-1"], "mode": "all"}, "childIds[2]: 'c-1' repeats"),
        ({"childIds": ["c-1", "c-2"], "mode": "quorum", "quorum": 3}, "quorum: must be between"),
        ({"childIds": ["c-1"], "mode": "quorum", "quorum": 0}, "quorum: must be between"),
        ({"childIds": ["c-1"], "mode": "quorum"}, "quorum: required"),
        ({"childIds": ["c-1"], "mode": "all", "quorum": 1}, "quorum: only with mode"),
        ({"childIds": ["c-1"], "mode": "most"}, "arguments.mode"),
        ({"childIds": ["a/b"], "mode": "all"}, "childIds[0]:"),
        ({"childIds": ["c-1"], "mode": "all", "waitSeconds": 51}, "waitSeconds"),
    ],
)
async def test_it_refuses_a_malformed_join_with_invalid_params(live, arguments, named):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        answer = await mcp.call_tool("await_children", arguments)
    assert answer.is_error and answer.structured_content["code"] == INVALID_PARAMS, answer
    assert named in answer.structured_content["message"], answer.structured_content


async def test_it_holds_no_database_connection_for_50_waiting_joins(daphne_factory, runner_token):
    # CONN_MAX_AGE=0: whatever the server holds while the joins wait is held by the waiting.
    server = daphne_factory(CONN_MAX_AGE="0", UPKEEP_IN_PROCESS="false")
    async with LiveRunner(server, runner_token) as live:
        await live.open("root-1")
        issued = await live.run_token("root-1")
        async with mcp_session(issued["url"], issued["token"]) as mcp:
            children = await _fan_out(live, mcp, 2)
            ids = [c["conversationId"] for c in children]
            arguments = {"childIds": ids, "mode": "all", "waitSeconds": 40}
            joins = await waiting_calls(mcp, "await_children", arguments)
            held = await connections_held(server)
            assert not any(j.done() for j in joins)
            for child in children:
                await _finish(live, child, "ok")
            answers = await asyncio.wait_for(asyncio.gather(*joins), 30)
    # At most a momentary re-read (a lost-doorbell check), never one per waiting call.
    assert max(held) <= 1, held
    assert all(a.structured_content["done"] for a in answers)


async def test_it_stores_a_childs_conclusion_and_answers_it_to_the_parent(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        (child,) = await _fan_out(live, mcp, 1)
        child_token = await live.run_token(child["runId"])
        conclusion = {
            "status": "partial",
            "summary": "Parsed two of three files.",
            "artifacts": [{"path": "out/report.md", "description": "the report"}],
            "followUp": ["parse c.txt"],
            "confidence": 0.5,
        }
        async with mcp_session(child_token["url"], child_token["token"]) as child_mcp:
            bad = await child_mcp.call_tool(
                "conclude", {"status": "done", "summary": "x", "confidence": 2}
            )
            said = await child_mcp.call_tool("conclude", conclusion)
        await _finish(live, child, "finished")
        joined = await mcp.call_tool(
            "await_children", {"childIds": [child["conversationId"]], "mode": "all"}
        )
    assert bad.is_error and bad.structured_content["code"] == INVALID_PARAMS
    assert "arguments.confidence" in bad.structured_content["message"]
    assert not said.is_error and said.structured_content == {}
    (result,) = joined.structured_content["results"]
    assert result["conclusion"] == conclusion
    run = await sync_to_async(Run.objects.get)(run_id=child["runId"])
    assert run.conclusion == conclusion
    kinds = await sync_to_async(list)(Event.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds.count("conclusion") == 1  # the refused one stored nothing
    audited = await sync_to_async(list)(
        AuditEntry.objects.filter(target_id=child["runId"], action="conclude").values_list(
            "outcome", "via"
        )
    )
    assert audited == [("partial", "mcp")]


# --- the same join for runners: the SDK's client.await_children, built on child.read -----


async def _children(live, parent: str, n: int) -> list:
    started = []
    for index in range(n):
        request = {"requestId": f"{parent}-{index}", "profile": "worker", "message": "x"}
        started.append(await live.client.child_start(parent, "ext", 1, request))
    return started


async def test_it_joins_a_runners_children_with_the_sdk_quorum_then_all(
    daphne_server, runner_token
):
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


async def test_it_refuses_the_sdk_join_over_another_runs_child_or_a_malformed_list(
    daphne_server, runner_token
):
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

"""The MCP front door (SPEC §9) through the official ``mcp`` client over real HTTP against a
live daphne, with a real runner (the SDK) on the runner socket of the same server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2
import pytest
from asgiref.sync import sync_to_async

from delegation import selectors
from delegation.errors import DEPTH_LIMIT, NOT_OWNED
from delegation.models import AuditEntry, Event, Run, RunVia
from delegation.services import tokens
from tests.support.mcp_tools import (
    LiveRunner,
    connections_held,
    mcp_session,
    post_status,
    server_db_connections,
    waiting_calls,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

TOOLS = {"delegate", "read_child", "steer_child", "cancel_child", "list_profiles", "approve"}
# Fan out and join (issue 24).
TOOLS |= {"await_children", "conclude"}


@pytest.fixture
def runner_token(transactional_db):
    return tokens.create_runner("mcp-runner")[1]


@pytest.fixture
async def live(daphne_server, runner_token):
    async with LiveRunner(daphne_server, runner_token) as runner:
        yield runner


def _run(run_id: str) -> Run:
    return Run.objects.select_related("parent").get(run_id=run_id)


async def test_it_lists_the_tools_with_described_arguments(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    assert issued["url"] == f"{live.server.http_url}/mcp"
    assert issued["token"].startswith("cnt_") and issued["expiresAt"]
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        listed = await mcp.list_tools()
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == TOOLS
    delegate = tools["delegate"].input_schema
    assert set(delegate["required"]) == {"profile", "message"}
    for name in (
        "profile",
        "message",
        "requestId",
        "options",
        "cwd",
        "contextMode",
        "resume",
        "waitSeconds",
    ):
        assert delegate["properties"][name]["description"], name
    assert set(tools["read_child"].input_schema["properties"]) == {
        "childId",
        "after",
        "waitSeconds",
    }
    assert tools["list_profiles"].input_schema.get("properties", {}) == {}


async def test_it_delegates_a_child_one_level_down_dispatched_to_the_runner(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        answer = await mcp.call_tool("delegate", {"profile": "worker", "message": "sum 1..9"})
        again = await mcp.call_tool(
            "delegate", {"profile": "worker", "message": "twice", "requestId": "same"}
        )
        repeat = await mcp.call_tool(
            "delegate", {"profile": "worker", "message": "twice", "requestId": "same"}
        )
    assert not answer.is_error, answer
    child = answer.structured_content
    assert (child["depth"], child["parentRunId"], child["status"]) == (1, "root-1", "running")
    execute = await live.wait_command("child.execute", child["runId"])
    assert execute["depth"] == 1 and execute["request"]["message"] == "sum 1..9"
    stored = await sync_to_async(_run)(child["runId"])
    assert (stored.via, stored.parent.run_id, stored.depth) == (RunVia.MCP, "root-1", 1)
    # The same requestId twice is one child.
    assert repeat.structured_content["runId"] == again.structured_content["runId"]
    count = await sync_to_async(Run.objects.filter(request_id="same").count)()
    assert count == 1


async def test_it_marks_mcp_children_via_mcp_in_rest_and_the_tree(live, operator_token):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        answer = await mcp.call_tool("delegate", {"profile": "worker", "message": "x"})
    run_id = answer.structured_content["runId"]
    auth = {"Authorization": f"Bearer {operator_token}"}
    async with httpx2.AsyncClient(base_url=live.server.http_url, headers=auth) as http:
        detail = (await http.get(f"/api/runs/{run_id}")).json()
        rows = (await http.get("/api/runs", params={"root": "root-1"})).json()["items"]
    assert detail["via"] == "mcp"
    assert {row["runId"]: row["via"] for row in rows} == {"root-1": "runner", run_id: "mcp"}
    tree = await sync_to_async(lambda: selectors.tree_rows(Run.objects.get(run_id="root-1")))()
    assert {row["runId"]: row["via"] for row in tree} == {"root-1": "runner", run_id: "mcp"}


async def test_it_refuses_at_max_depth_with_the_code_and_the_event(daphne_factory, runner_token):
    server = daphne_factory(DELEGATION_MAX_DEPTH="1")
    async with LiveRunner(server, runner_token) as live:
        await live.open("root-1")
        issued = await live.run_token("root-1")
        async with mcp_session(issued["url"], issued["token"]) as mcp:
            first = await mcp.call_tool("delegate", {"profile": "worker", "message": "level 1"})
        child = first.structured_content
        await live.wait_command("child.execute", child["runId"])
        # The child's own agent gets its own token and tries to go one level further.
        child_token = await live.run_token(child["runId"])
        async with mcp_session(child_token["url"], child_token["token"]) as mcp:
            refused = await mcp.call_tool("delegate", {"profile": "worker", "message": "level 2"})
            profiles = await mcp.call_tool("list_profiles", {})
    assert refused.is_error
    assert refused.structured_content["code"] == DEPTH_LIMIT
    assert "depth limit" in refused.structured_content["message"]
    assert "-32010" in refused.content[0].text
    assert profiles.structured_content["maySpawn"] is False
    refusals = await sync_to_async(list)(
        Event.objects.filter(run__run_id=child["runId"], kind="delegation-refused")
    )
    assert len(refusals) == 1 and refusals[0].actor == "mcp:mcp-runner"


async def test_it_lets_a_header_raise_the_level_but_never_lower_it(daphne_factory, runner_token):
    server = daphne_factory(DELEGATION_MAX_DEPTH="2")
    async with LiveRunner(server, runner_token) as live:
        await live.open("root-1")
        issued = await live.run_token("root-1")
        async with mcp_session(issued["url"], issued["token"]) as mcp:
            child = await mcp.call_tool("delegate", {"profile": "worker", "message": "a"})
        child_token = await live.run_token(child.structured_content["runId"])
        # Level 1 declaring 0: still level 1, so its child is level 2.
        async with mcp_session(
            child_token["url"], child_token["token"], X_Pando_Delegation_Depth="0"
        ) as mcp:
            lowered = await mcp.call_tool("delegate", {"profile": "worker", "message": "b"})
        # The root (level 0) declaring 2 through _meta is raised to 2: refused at max 2.
        async with mcp_session(issued["url"], issued["token"]) as mcp:
            raised = await mcp.call_tool(
                "delegate",
                {"profile": "worker", "message": "c"},
                meta={"dev.pando/delegationDepth": 2},
            )
    assert not lowered.is_error and lowered.structured_content["depth"] == 2
    assert raised.is_error and raised.structured_content["code"] == DEPTH_LIMIT


async def test_it_answers_401_for_a_missing_wrong_or_finished_runs_token(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    url = issued["url"]
    assert await post_status(url, issued["token"]) == 200
    assert await post_status(url, None) == 401
    assert await post_status(url, "cnt_not-a-token") == 401
    await live.client.finish("root-1", output="done")
    assert await post_status(url, issued["token"]) == 401


async def test_it_kills_run_tokens_when_the_runner_token_is_rotated(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    await sync_to_async(tokens.create_runner)("mcp-runner")
    assert await post_status(issued["url"], issued["token"]) == 401


async def test_it_hides_another_runs_child_exactly_like_a_missing_one(live):
    await live.open("root-1")
    await live.open("root-2")
    one = await live.run_token("root-1")
    two = await live.run_token("root-2")
    async with mcp_session(one["url"], one["token"]) as mcp:
        child = await mcp.call_tool("delegate", {"profile": "worker", "message": "x"})
    child_id = child.structured_content["conversationId"]
    answers = {}
    async with mcp_session(two["url"], two["token"]) as mcp:
        for target in (child_id, "c-does-not-exist"):
            answers[target] = [
                await mcp.call_tool("read_child", {"childId": target}),
                await mcp.call_tool("steer_child", {"childId": target, "message": "stop"}),
                await mcp.call_tool("cancel_child", {"childId": target}),
            ]
    for results in answers.values():
        for result in results:
            assert result.is_error and result.structured_content["code"] == NOT_OWNED, result
    # Same message apart from the id itself: no existence leak.
    for theirs, missing in zip(answers[child_id], answers["c-does-not-exist"], strict=True):
        assert theirs.structured_content["message"].replace(child_id, "X") == (
            missing.structured_content["message"].replace("c-does-not-exist", "X")
        )
    stored = await sync_to_async(_run)(child.structured_content["runId"])
    assert stored.cancel_requested_at is None


async def test_it_reads_steers_and_cancels_its_own_child(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        child = await mcp.call_tool("delegate", {"profile": "worker", "message": "x"})
        child_id = child.structured_content["conversationId"]
        run_id = child.structured_content["runId"]
        await live.wait_command("child.execute", run_id)
        await live.client.emit(run_id, {"kind": "text", "text": "working"})
        read = await mcp.call_tool("read_child", {"childId": child_id})
        steer = await mcp.call_tool("steer_child", {"childId": child_id, "message": "faster"})
        cancel = await mcp.call_tool("cancel_child", {"childId": child_id})
    assert [e["text"] for e in read.structured_content["events"]] == ["working"]
    assert steer.structured_content == {"outcome": "injected", "reason": ""}
    assert cancel.structured_content["runId"] == run_id
    for _ in range(200):
        if any(m == "run.cancel" and p["runId"] == run_id for m, p in live.commands):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"no run.cancel for {run_id}: {live.commands}")
    stored = await sync_to_async(_run)(run_id)
    assert stored.cancel_requested_at is not None
    audited = await sync_to_async(list)(
        AuditEntry.objects.filter(target_id=run_id).values_list("action", "actor", "via")
    )
    assert sorted(audited) == [
        ("cancel", "mcp:mcp-runner", "mcp"),
        ("steer", "mcp:mcp-runner", "mcp"),
    ]


async def test_it_answers_a_waiting_read_as_soon_as_an_event_commits(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        child = await mcp.call_tool("delegate", {"profile": "worker", "message": "x"})
        child_id = child.structured_content["conversationId"]
        run_id = child.structured_content["runId"]
        await live.wait_command("child.execute", run_id)
        progress = []

        async def on_progress(value, total, message):
            progress.append((value, total, message))

        loop = asyncio.get_running_loop()
        reading = asyncio.ensure_future(
            mcp.call_tool(
                "read_child",
                {"childId": child_id, "waitSeconds": 30},
                progress_callback=on_progress,
            )
        )
        while not progress:
            await asyncio.sleep(0.01)
        emitted_at = loop.time()
        await live.client.emit(run_id, {"kind": "text", "text": "first"})
        result = await reading
        answered_after = loop.time() - emitted_at
    assert [e["text"] for e in result.structured_content["events"]] == ["first"]
    assert answered_after < 1.5, answered_after
    assert progress[0][1] == 30


def _rss_kib(server) -> int:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


async def test_it_holds_no_database_connection_for_50_waiting_reads(daphne_factory, runner_token):
    # CONN_MAX_AGE=0: a connection is closed when the call that used it ends, so whatever the
    # server holds while the reads wait is held by the waiting itself.
    server = daphne_factory(CONN_MAX_AGE="0", UPKEEP_IN_PROCESS="false")
    async with LiveRunner(server, runner_token) as live:
        await live.open("root-1")
        issued = await live.run_token("root-1")
        async with mcp_session(issued["url"], issued["token"]) as mcp:
            child = await mcp.call_tool("delegate", {"profile": "worker", "message": "x"})
            child_id = child.structured_content["conversationId"]
            run_id = child.structured_content["runId"]
            await live.wait_command("child.execute", run_id)
            await asyncio.sleep(0.5)
            idle = await sync_to_async(server_db_connections)(server)
            rss_before = _rss_kib(server)
            arguments = {"childId": child_id, "waitSeconds": 40}
            reads = await waiting_calls(mcp, "read_child", arguments)
            held = await connections_held(server)
            rss_waiting = _rss_kib(server)
            assert not any(r.done() for r in reads)
            await live.client.emit(run_id, {"kind": "text", "text": "wake"})
            results = await asyncio.wait_for(asyncio.gather(*reads), 20)
    print(
        f"\n50 waiting read_child: server RSS {rss_before} KiB before, {rss_waiting} KiB "
        f"while waiting (+{rss_waiting - rss_before} KiB); DB connections held: idle {idle}, "
        f"waiting {held}"
    )
    # At most a momentary re-read (a lost-doorbell check), never one per waiting call.
    assert max(held) <= 1, held
    assert all([e["text"] for e in r.structured_content["events"]] == ["wake"] for r in results)


async def test_it_waits_for_a_delegated_child_to_finish(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")

    async def finish_child():
        for _ in range(500):
            execute = [p for m, p in live.commands if m == "child.execute"]
            if execute:
                run_id = execute[0]["identity"]["runId"]
                await asyncio.sleep(0.3)
                await live.client.emit(run_id, {"kind": "result", "text": "42"})
                await live.client.finish(run_id, output="42")
                return
            await asyncio.sleep(0.02)

    finisher = asyncio.ensure_future(finish_child())
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        answer = await mcp.call_tool(
            "delegate", {"profile": "worker", "message": "the answer", "waitSeconds": 20}
        )
    await finisher
    result = answer.structured_content
    assert (result["done"], result["status"], result["output"]) == (True, "succeeded", "42")


async def test_it_serves_mcp_under_a_server_that_sends_asgi_lifespan(
    runner_token, transactional_db
):
    """uvicorn sends lifespan (daphne does not): the gate starts the SDK's session manager at
    startup and stops it at shutdown, and /mcp works in between."""
    import socket
    import threading

    import uvicorn

    from canopy import asgi

    lifespan_sent: list[str] = []

    async def recording(scope, receive, send):
        async def record(message):
            if scope["type"] == "lifespan":
                lifespan_sent.append(message["type"])
            await send(message)

        await asgi.application(scope, receive, record)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(recording, lifespan="on", log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    try:
        while not server.started:
            await asyncio.sleep(0.05)

        class Where:
            ws_url = f"ws://127.0.0.1:{port}/ws/runner/"

        async with LiveRunner(Where, runner_token) as live:
            await live.open("root-1")
            issued = await live.run_token("root-1")
            async with mcp_session(issued["url"], issued["token"]) as mcp:
                listed = await mcp.list_tools()
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 20)
        sock.close()
    assert issued["url"] == f"http://127.0.0.1:{port}/mcp"
    assert {tool.name for tool in listed.tools} == TOOLS
    assert lifespan_sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]

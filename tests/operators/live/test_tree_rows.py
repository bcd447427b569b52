"""Tree rows that explain themselves: the task and the latest activity, stored with the
append and pushed live over real WebSocket frames (runner socket in, live socket out)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from delegation import models
from tests.support.live import check_frames, operator_socket, until

pytestmark = pytest.mark.django_db(transaction=True)


def _row(frames, run_id):
    for f in reversed(frames):
        for row in f.get("runs", []):
            if row["runId"] == run_id:
                return row
    return None


async def test_it_shows_each_runs_task_and_latest_activity_live(runner, operator):
    await runner.open("root-1")
    child = await runner.start(message="Review the parser\nthen the lexer, in that order")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "treeId": "root-1"})
    frames = await until(ws, lambda f: f["type"] == "tree" and not f["more"])
    row = _row(frames, child["runId"])
    assert row["task"] == "Review the parser" and row["activity"] == ""
    assert _row(frames, "root-1")["task"] == ""

    await runner.emit(
        child["runId"],
        [
            "\n  Reading parser.py first",
            {"kind": "usage", "input": {"inputTokens": 3, "outputTokens": 0}},
        ],
    )
    frames = await until(
        ws, lambda f: f["type"] == "rows" and (_row([f], child["runId"]) or {}).get("activity")
    )
    assert _row(frames, child["runId"])["activity"] == "Reading parser.py first"

    tool = {
        "kind": "tool-use",
        "toolName": "Bash",
        "toolCallId": "t1",
        "input": {"command": "pytest -x tests/test_parser.py"},
    }
    await runner.emit(child["runId"], [tool, {"kind": "tool-result", "toolCallId": "t1"}], 3)
    frames = await until(
        ws,
        lambda f: (
            f["type"] == "rows"
            and (_row([f], child["runId"]) or {}).get("activity", "").startswith("Bash")
        ),
    )
    row = _row(frames, child["runId"])
    assert row["activity"] == "Bash: pytest -x tests/test_parser.py" and row["events"] == 4
    check_frames(frames)
    stored = await database_sync_to_async(models.Run.objects.get)(run_id=child["runId"])
    assert stored.activity_at is not None and stored.task == "Review the parser"
    await ws.disconnect()


async def test_it_keeps_the_last_activity_when_new_events_say_nothing(runner):
    await runner.open("root-1")
    await runner.emit("root-1", ["x" * 500])
    await runner.emit(
        "root-1", [{"kind": "usage", "input": {"inputTokens": 1, "outputTokens": 0}}], 2
    )
    stored = await database_sync_to_async(models.Run.objects.get)(run_id="root-1")
    assert stored.activity == "x" * 199 + "…" and len(stored.activity) == models.ACTIVITY_CHARS


async def test_it_shows_the_full_request_and_who_started_the_run(runner, viewer):
    from tests.support.personas import signed_in

    await runner.open("root-1")
    child = await runner.start(
        message="Review the parser\nLine two & <b>more</b>", contextMode="fresh", cwd="/tmp/work"
    )

    def check():
        client = signed_in(viewer)
        page = client.get(f"/runs/{child['runId']}/").content.decode()
        assert 'data-started-via="runner"' in page
        assert "child.start from run root-1" in page
        assert "Review the parser\nLine two &amp; &lt;b&gt;more&lt;/b&gt;</pre>" in page
        assert 'data-field="cwd">/tmp/work<' in page
        assert 'data-field="contextMode">fresh<' in page
        root = client.get("/runs/root-1/").content.decode()
        assert "run.open by runner" in root and "No request message recorded" in root

    await database_sync_to_async(check)()


async def test_it_streams_a_compact_snapshot_in_chunks_and_rows_after_it(runner, operator):
    from dashboard.live import trees

    await runner.open("root-1")
    kids = [
        (await runner.start(request_id=f"req-{i}", message=f"task {i}"))["runId"] for i in range(5)
    ]
    ws = await operator_socket(operator)
    previous = trees.TREE_READ_CHUNK, trees.TREE_FIRST_CHUNK
    trees.TREE_READ_CHUNK = trees.TREE_FIRST_CHUNK = 2
    try:
        await ws.send_json_to({"type": "subscribe", "treeId": "root-1", "compact": True})
        frames = await until(ws, lambda f: f["type"] == "treeCols" and not f["more"])
    finally:
        trees.TREE_READ_CHUNK, trees.TREE_FIRST_CHUNK = previous
    chunks = [f for f in frames if f["type"] == "treeCols"]
    assert [len(f["columns"]["pk"]) for f in chunks] == [2, 2, 2]
    run_ids = [rid for f in chunks for rid in f["columns"]["runId"]]
    assert run_ids == ["root-1", *kids]
    root_pk = chunks[0]["columns"]["pk"][0]
    assert all(
        p == root_pk for f in chunks for p in f["columns"]["parentPk"][1 if f is chunks[0] else 0 :]
    )
    tasks = [t for f in chunks for t in f["columns"]["task"]]
    assert tasks == ["", "task 0", "task 1", "task 2", "task 3", "task 4"]
    await runner.finish(kids[3], output="ok")
    rows = await until(
        ws,
        lambda f: (
            f["type"] == "rows"
            and any(r["runId"] == kids[3] and r["status"] == "succeeded" for r in f["runs"])
        ),
    )
    check_frames(frames + rows)
    await ws.disconnect()


async def test_it_shows_a_paused_run_on_its_tree_row_live(runner, operator):
    # SPEC §14: status paused reaches the live tree rows, and running again after a resume.
    from delegation.services import pause
    from delegation.services.identity import Actor

    await runner.open("root-1")
    kid = (await runner.start(request_id="req-p", message="task p"))["runId"]
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "treeId": "root-1"})
    first = await until(ws, lambda f: f["type"] == "tree" and not f["more"])
    assert _row(first, kid)["status"] == "running"
    actor = Actor.for_user(operator, "dashboard")
    run = await database_sync_to_async(models.Run.objects.get)(run_id=kid)

    def row_is(status):
        return lambda f: (
            f["type"] == "rows"
            and any(r["runId"] == kid and r["status"] == status for r in f["runs"])
        )

    await database_sync_to_async(pause.do_pause_run)(actor, run, reason="hold")
    paused = await until(ws, row_is("paused"))
    await database_sync_to_async(pause.do_resume_run)(actor, run)
    resumed = await until(ws, row_is("running"))
    check_frames(first + paused + resumed)
    await ws.disconnect()

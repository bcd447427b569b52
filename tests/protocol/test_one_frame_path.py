"""Every ``run.event`` frame has one way in (issue 34): a frame that cannot join a group is a
group of one through the same commit (``methods.append_event_frames_of``), stored and answered
exactly as a grouped one; and a malformed envelope gets the same error whatever method it
names, ``run.event`` included (one envelope check, ``runner_socket.envelope``).
"""

import json

import pytest

from delegation.models import Event
from delegation.runner_socket import methods
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)

FRAMES = 12


@pytest.fixture
def commits(monkeypatch) -> list[list]:
    """The (connection, frames) of each commit of run.event frames."""
    calls: list[list] = []
    real = methods.append_event_frames_of

    def recorded(items):
        calls.append(list(items))
        return real(items)

    monkeypatch.setattr(methods, "append_event_frames_of", recorded)
    return calls


def _frames(prefix: str, run_id: str) -> list[str]:
    """FRAMES frames in order, every fourth carrying usage (it ends its transaction)."""
    frames, start = [], 1
    for index in range(1, FRAMES + 1):
        events = [{"kind": "text", "text": f"e{index}"}]
        if index % 4 == 0:
            events.append({"kind": "usage", "input": {"inputTokens": 3, "outputTokens": 2}})
        params = {"runId": run_id, "from": start, "events": events}
        body = {"jsonrpc": "2.0", "id": f"{prefix}{index}", "method": "run.event", "params": params}
        frames.append(json.dumps(body))
        start += len(events)
    return frames


async def _stream(run_id: str) -> list[tuple]:
    return await adb(
        lambda: list(
            Event.objects.filter(run__run_id=run_id)
            .order_by("sequence")
            .values_list("sequence", "runner_index", "kind", "text")
        )
    )()


async def test_a_lone_frame_and_a_grouped_one_land_through_the_one_path(runner, commits):
    await runner.open("lone")
    await runner.open("grouped")

    lone = []
    for text in _frames("l", "lone"):
        await runner.send_raw(text)
        lone.append(await runner.next_response())  # nothing behind it: a group of one
    lone_commits = list(commits)
    commits.clear()

    for text in _frames("g", "grouped"):
        await runner.send_raw(text)
    grouped = [await runner.next_response() for _ in range(FRAMES)]

    # Both went through the same commit: the lone frames one a commit, the pipelined ones
    # (at least once) several to a commit, so the test fails if either path went elsewhere.
    assert [[len(frames) for _conn, frames in call] for call in lone_commits] == [[1]] * FRAMES
    assert sum(len(frames) for call in commits for _conn, frames in call) == FRAMES
    assert max(sum(len(frames) for _conn, frames in call) for call in commits) > 1

    assert [a["id"] for a in lone] == [f"l{i}" for i in range(1, FRAMES + 1)]
    assert [a["id"] for a in grouped] == [f"g{i}" for i in range(1, FRAMES + 1)]
    assert [a["result"] for a in lone] == [a["result"] for a in grouped]
    stored = await _stream("lone")
    assert stored == await _stream("grouped")
    # Gap-free: every sequence once, in order.
    assert [row[0] for row in stored] == list(range(1, len(stored) + 1))


def _malformed(method: str) -> list[tuple[str, object]]:
    """Frames wrong in their envelope, each with the id the error must carry."""
    params = {"runId": "r", "from": 1, "events": []}
    base = {"jsonrpc": "2.0", "method": method, "params": params}
    return [
        (json.dumps({**base, "id": 7, "extra": 1}), 7),
        (json.dumps({**base, "id": 1.5}), None),
        (json.dumps({**base, "id": True}), None),
        (json.dumps({**base, "jsonrpc": "1.0", "id": 8}), None),
    ]


@pytest.mark.parametrize("registered", [True, False], ids=["registered", "unregistered"])
async def test_a_malformed_envelope_gets_the_same_error_whatever_the_method(
    runner, make_client, runner_token, registered
):
    client = runner if registered else await make_client(runner_token, register=False)
    if registered:
        await client.open("r")
    errors: dict[str, list] = {}
    for method in ("run.event", "run.open", "run.finish", "child.start", "runner.register"):
        answers = []
        for text, rpc_id in _malformed(method):
            await client.send_raw(text)
            answer = await client.next_response()
            assert answer["id"] == rpc_id, answer
            assert answer["error"]["code"] == -32600, answer
            answers.append(answer)
        errors[method] = answers
    assert all(answers == errors["run.event"] for answers in errors.values()), errors
    assert await _stream("r") == []

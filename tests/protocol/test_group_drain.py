"""The group commit's database thread commits group after group while frames wait (issue 39),
and gives the thread back after ``DRAIN_SECONDS``; a failure outside any group answers every
waiting socket and lets the next frame start a new commit.

Each test holds the first commit for a moment (on the database thread), so the other sockets'
frames are waiting when it ends: what happens next is then the drain's doing, not timing's.
"""

import json
import threading
import time

import pytest

from delegation.runner_socket import frame_groups
from tests.support.rpc import create_runner_async

pytestmark = pytest.mark.django_db(transaction=True)


def _frame(rpc_id, run_id, start, text) -> str:
    params = {"runId": run_id, "from": start, "events": [{"kind": "text", "text": text}]}
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "run.event", "params": params})


@pytest.fixture
def groups_per_call(monkeypatch) -> list[list[int]]:
    """For each database call of the group commit, the frames of each group it committed;
    the first group of all is held 0.3 s so that the others queue up behind it."""
    calls: list[list[int]] = []
    here = threading.local()
    real_drain, real_commit = frame_groups.FrameGroups._drain, frame_groups._commit

    def drain(self, loop):
        here.groups = []
        calls.append(here.groups)
        return real_drain(self, loop)

    def commit(batch):
        if not any(calls[:-1]) and not here.groups:
            time.sleep(0.3)
        here.groups.append(sum(len(frames) for _conn, frames in batch))
        return real_commit(batch)

    monkeypatch.setattr(frame_groups.FrameGroups, "_drain", drain)
    monkeypatch.setattr(frame_groups, "_commit", commit)
    return calls


async def _three_sockets(runner, make_client):
    clients = [runner]
    for name in ("runner-b", "runner-c"):
        clients.append(await make_client(await create_runner_async(name)))
    for index, client in enumerate(clients):
        await client.open(f"root-{index}")
    return clients


async def _send_one_each(clients):
    for index, client in enumerate(clients):
        await client.send_raw(_frame(1, f"root-{index}", 1, f"from {index}"))
    return [await client.next_response() for client in clients]


async def test_it_commits_the_groups_waiting_behind_one_in_the_same_database_call(
    runner, make_client, groups_per_call, settings, monkeypatch
):
    settings.RUN_EVENT_GROUP_MAX = 1  # one socket's frame a group: three groups
    monkeypatch.setattr(frame_groups, "DRAIN_SECONDS", 5)  # longer than the held first group
    # One commit at a time on PostgreSQL too (it allows two): the drain is what is tested.
    monkeypatch.setattr(frame_groups, "_commits_at_once", lambda: 1)
    clients = await _three_sockets(runner, make_client)
    answers = await _send_one_each(clients)
    assert [a["result"]["emitted"] for a in answers] == [1, 1, 1], answers
    assert sum(len(groups) for groups in groups_per_call) == 3, groups_per_call
    # The two that waited behind the first went in the same call, without a hop between.
    assert groups_per_call == [[1, 1, 1]], groups_per_call


async def test_it_gives_the_thread_back_after_each_group_when_the_drain_is_spent(
    runner, make_client, groups_per_call, settings, monkeypatch
):
    settings.RUN_EVENT_GROUP_MAX = 1
    monkeypatch.setattr(frame_groups, "DRAIN_SECONDS", 0)
    monkeypatch.setattr(frame_groups, "_commits_at_once", lambda: 1)
    clients = await _three_sockets(runner, make_client)
    answers = await _send_one_each(clients)
    assert [a["result"]["emitted"] for a in answers] == [1, 1, 1], answers
    # At least one group a call, never more; a call that found nothing waiting commits none.
    assert [groups for groups in groups_per_call if groups] == [[1], [1], [1]], groups_per_call


async def test_it_answers_every_waiting_socket_when_the_commit_fails_outside_a_group(
    runner, make_client, monkeypatch, caplog
):
    clients = await _three_sockets(runner, make_client)
    real_on_database = frame_groups.on_database
    failures = []

    def on_database(function):
        if not failures:
            failures.append(function)

            async def broken(*args):
                raise RuntimeError("the database thread could not be reached")

            return broken
        return real_on_database(function)

    monkeypatch.setattr(frame_groups, "on_database", on_database)
    answers = await _send_one_each(clients)
    refused = [a for a in answers if "error" in a]
    assert refused and {a["error"]["code"] for a in refused} == {-32603}, answers
    assert "the group commit of run.event frames failed" in caplog.text
    # Nothing is left holding the commit: every socket's frame goes through now.
    for index, client in enumerate(clients):
        start = 1 if "error" in answers[index] else 2
        await client.send_raw(_frame(2, f"root-{index}", start, "again"))
    again = [await client.next_response() for client in clients]
    assert all("result" in a for a in again), again

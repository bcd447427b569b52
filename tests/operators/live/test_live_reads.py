"""The live path's compiled reads (``delegation.selectors.live``) give exactly what the models
give: the run's state as ``run_state`` builds it and each event as ``live_event`` does, for a
child with every field set, on whichever backend the suite runs."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.live.runs import SharedTexts
from delegation import selectors
from delegation.models import Event, Run
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS = [
    {"kind": "text", "text": "hello"},
    {
        "kind": "tool-use",
        "toolName": "grep",
        "toolCallId": "call-1",
        "input": {"pattern": "x", "paths": ["a", "b"], "deep": {"ok": None}},
    },
    {"kind": "tool-result", "toolCallId": "call-1", "toolOutput": [1, {"two": 2.5}]},
    {"kind": "tool-result", "toolCallId": "call-2", "success": False, "error": "boom"},
    {"kind": "tool-update", "input": "plain string input", "toolOutput": 7},
    {"kind": "text-delta", "text": "x" * 70_000},  # stored truncated
]


def _from_models(run_id: str, after: int, limit: int):
    run = selectors.get_run(run_id)
    events = Event.objects.filter(run=run, sequence__gt=after).order_by("sequence")[:limit]
    return selectors.run_state(run), [selectors.live_event(event) for event in events]


def _compiled(run_id: str, after: int, limit: int):
    pk = Run.objects.get(run_id=run_id).pk
    return selectors.live_run_state(pk), selectors.live_events_page(pk, after, limit)


async def _child_with_everything(runner) -> str:
    await runner.open("root-1")
    child = await runner.start()
    await runner.emit(child["runId"], EVENTS)

    def conclude():
        Run.objects.filter(run_id=child["runId"]).update(
            output="done: äöü",
            error="late error",
            conclusion={"summary": "s", "artifacts": [{"path": "a"}]},
            finished_at=timezone.now(),
            cancel_requested_at=timezone.now(),
            cancel_reason="because",
            refused_spawns=2,
            host_instance_id="host-1",
            extension_id="ext",
        )
        Event.objects.filter(run__run_id=child["runId"], sequence=1).update(
            actor="operator:ann", data={"steer": {"id": 3}}
        )

    await adb(conclude)()
    return child["runId"]


async def test_it_reads_what_the_models_read(runner):
    run_id = await _child_with_everything(runner)
    for after, limit in ((0, 100), (2, 3), (6, 100)):
        expected = await adb(_from_models)(run_id, after, limit)
        assert await adb(_compiled)(run_id, after, limit) == expected
    state, events = await adb(_compiled)(run_id, 0, 100)
    # The comparison above held something: a child with a parent, a truncated event, data.
    assert state["parentRunId"] == "root-1" and state["conclusion"]["summary"] == "s"
    assert events[0]["data"] == {"steer": {"id": 3}} and events[-1]["truncated"] is True


async def test_it_reads_a_root_and_a_missing_run(runner):
    await runner.open("root-1")
    expected = await adb(_from_models)("root-1", 0, 10)
    assert await adb(_compiled)("root-1", 0, 10) == expected
    assert expected[0]["parentRunId"] == "" and expected[0]["parentConversationId"] == ""
    assert await adb(selectors.live_run_state)(10**9) is None


async def test_it_reads_each_in_one_query_with_new_parameters(runner):
    run_id = await _child_with_everything(runner)

    def read_twice():
        pk = Run.objects.get(run_id=run_id).pk
        with CaptureQueriesContext(connection) as queries:
            first = selectors.live_events_page(pk, 0, 2)
            second = selectors.live_events_page(pk, 4, 2)
        return first, second, len(queries)

    first, second, queries = await adb(read_twice)()
    assert [e["sequence"] for e in first] == [1, 2]
    assert [e["sequence"] for e in second] == [5, 6]
    assert queries == 2


def test_it_serializes_a_shared_read_once_and_holds_a_bounded_few():
    texts = SharedTexts()
    made = []

    def make(source, part):
        made.append(part)
        return "x" * part

    read, other = [{"sequence": 1}], [{"sequence": 1}]
    assert texts.get(read, 10, make) == texts.get(read, 10, make) == "x" * 10
    assert made == [10]  # the second socket got the first one's text
    texts.get(other, 10, make)
    assert made == [10, 10]  # an equal list read apart is another read
    # A text too large to hold is made each time; the held ones stay under the bound.
    texts.get(read, SharedTexts.MAX_CHARS, make)
    texts.get(read, SharedTexts.MAX_CHARS, make)
    assert made[-2:] == [SharedTexts.MAX_CHARS] * 2
    for size in range(100_000, 1_000_000, 100_000):
        texts.get([], size, make)
    assert texts._chars <= SharedTexts.MAX_CHARS
    assert texts._chars == sum(chars for _s, _t, chars in texts._texts.values())

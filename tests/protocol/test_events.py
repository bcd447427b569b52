"""SPEC §5 events and sequencing: the runner numbers what it emits (`from`), the server
numbers the stream; replays are skipped, conflicts and gaps refuse the whole frame."""

import pytest

from delegation.models import Event
from tests.support.rpc import adb
from tests.support.state import assert_all_refused, state

pytestmark = pytest.mark.django_db(transaction=True)

KIB = 1024


def ev(text, kind="text", **fields):
    event = {"kind": kind, "text": text}
    event.update(fields)
    return event


async def _stream(run_id: str) -> list[tuple]:
    return await adb(
        lambda: list(
            Event.objects.filter(run__run_id=run_id)
            .order_by("sequence")
            .values_list("sequence", "kind", "text", "runner_index")
        )
    )()


async def _child(runner):
    await runner.open("root-1")
    return await runner.start()


async def test_it_numbers_the_stream_from_one(runner):
    await runner.open("root-1")
    assert await runner.emit("root-1", ["a", "b", "c"]) == {"emitted": 3, "sequence": 3}
    assert await runner.emit("root-1", ["d"], start=4) == {"emitted": 4, "sequence": 4}
    assert [row[:3] for row in await _stream("root-1")] == [
        (1, "text", "a"),
        (2, "text", "b"),
        (3, "text", "c"),
        (4, "text", "d"),
    ]


async def test_it_skips_an_exact_replay(runner):
    await runner.open("root-1")
    await runner.emit("root-1", ["a", "b", "c"])
    before = await state()
    assert await runner.emit("root-1", ["a", "b", "c"]) == {"emitted": 3, "sequence": 3}
    assert await runner.emit("root-1", ["b"], start=2) == {"emitted": 3, "sequence": 3}
    assert await state() == before


async def test_it_stores_only_the_new_tail_of_an_overlapping_frame(runner):
    await runner.open("root-1")
    await runner.emit("root-1", ["a", "b", "c"])
    assert await runner.emit("root-1", ["b", "c", "d", "e"], start=2) == {
        "emitted": 5,
        "sequence": 5,
    }
    assert [row[2] for row in await _stream("root-1")] == ["a", "b", "c", "d", "e"]


CONFLICTS = [
    (1, [ev("a"), ev("X")]),  # second replayed event differs
    (2, [ev("b", kind="thinking")]),  # kind differs
    (3, [ev("c", success=True)]),  # success present vs absent
    (1, [ev("a"), {"kind": "text"}]),  # text absent vs "b"
    (1, [ev("a"), ev("b", toolName="t")]),  # an extra field
    (2, [ev("B"), ev("c"), ev("new")]),  # conflict followed by a fresh tail
    (3, [ev("c "), ev("d")]),  # a trailing space is a difference
]


async def test_it_refuses_a_conflicting_replay_and_stores_nothing_of_it(runner):
    await runner.open("root-1")
    await runner.emit("root-1", ["a", "b", "c"])
    cases = [
        ({"runId": "root-1", "from": start, "events": events}, None) for start, events in CONFLICTS
    ]
    await assert_all_refused(runner, "run.event", cases, -32602)
    assert await runner.emit("root-1", ["d"], start=4) == {"emitted": 4, "sequence": 4}


async def test_it_refuses_a_gap_and_stores_nothing_of_it(runner):
    await runner.open("root-1")
    await runner.emit("root-1", ["a", "b"])
    before = await state()
    error = await runner.error("run.event", {"runId": "root-1", "from": 4, "events": [ev("d")]})
    assert error["code"] == -32602
    assert "from" in error["message"]
    assert await state() == before
    first = await runner.error("run.event", {"runId": "fresh", "from": 1, "events": []})
    assert first["code"] == -32004


async def test_it_refuses_a_gap_on_an_empty_stream(runner):
    await runner.open("root-1")
    error = await runner.error("run.event", {"runId": "root-1", "from": 2, "events": [ev("b")]})
    assert error["code"] == -32602
    assert await _stream("root-1") == []


MALFORMED_EVENTS = [
    ({"runId": "root-1", "from": 0, "events": []}, "from"),
    ({"runId": "root-1", "from": -1, "events": []}, "from"),
    ({"runId": "root-1", "from": "1", "events": []}, "from"),
    ({"runId": "root-1", "from": 1.5, "events": []}, "from"),
    ({"runId": "root-1", "from": True, "events": []}, "from"),
    ({"runId": "root-1", "events": []}, "from"),
    ({"runId": "root-1", "from": 1}, "events"),
    ({"runId": "root-1", "from": 1, "events": {}}, "events"),
    ({"runId": "root-1", "from": 1, "events": [ev("a")], "seq": 1}, "seq"),
    ({"from": 1, "events": []}, "runId"),
    ({"runId": "root-1", "from": 1, "events": [{"text": "no kind"}]}, "kind"),
    ({"runId": "root-1", "from": 1, "events": [{"kind": ""}]}, "kind"),
    ({"runId": "root-1", "from": 1, "events": [{"kind": 3}]}, "kind"),
    ({"runId": "root-1", "from": 1, "events": [ev("a", apiKey="x")]}, "apiKey"),
    ({"runId": "root-1", "from": 1, "events": [ev("a", ToolName="x")]}, "ToolName"),
    ({"runId": "root-1", "from": 1, "events": [ev("a", success="true")]}, "success"),
    ({"runId": "root-1", "from": 1, "events": [ev(5)]}, "text"),
    ({"runId": "root-1", "from": 1, "events": [ev("a"), ev("b", toolName=1)]}, "toolName"),
    ({"runId": "root-1", "from": 1, "events": ["text"]}, "events"),
]


async def test_it_refuses_a_malformed_run_event_whole(runner):
    await runner.open("root-1")
    await assert_all_refused(runner, "run.event", MALFORMED_EVENTS, -32602)


async def test_it_refuses_an_event_for_a_run_it_does_not_know(runner):
    await runner.open("root-1")
    error = await runner.error("run.event", {"runId": "nope", "from": 1, "events": [ev("a")]})
    assert error["code"] == -32004


async def test_it_refuses_an_event_for_another_runners_run(runner, make_client):
    from tests.support.rpc import create_runner_async

    await runner.open("root-1")
    other = await make_client(await create_runner_async("runner-b"))
    before = await state()
    error = await other.error("run.event", {"runId": "root-1", "from": 1, "events": [ev("a")]})
    assert error["code"] == -32004
    assert await state() == before


async def test_it_interleaves_server_events_in_one_numbering(runner):
    child = await _child(runner)
    cid = child["runId"]
    assert await runner.emit(cid, ["a", "b"]) == {"emitted": 2, "sequence": 2}
    steer = await runner.ok(
        "child.steer", runner.on_child(child, message="go left", requestId="s1")
    )
    assert steer == {"outcome": "injected"}
    assert await runner.emit(cid, ["c"], start=3) == {"emitted": 3, "sequence": 4}
    # A replay of earlier runner events still compares by the runner's own numbering.
    assert await runner.emit(cid, ["b", "c"], start=2) == {"emitted": 3, "sequence": 4}
    read = await runner.read(child)
    assert [(e["sequence"], e["kind"], e.get("text")) for e in read["events"]] == [
        (1, "text", "a"),
        (2, "text", "b"),
        (3, "steer", "go left"),
        (4, "text", "c"),
    ]


async def test_it_stores_events_replayed_after_a_reconnect_once(runner_token, make_client):
    first = await make_client(runner_token)
    await first.open("root-1")
    await first.emit("root-1", ["a", "b", "c"])
    await first.close()
    second = await make_client(runner_token)
    # The runner does not know what was stored and resends everything it emitted.
    assert await second.emit("root-1", ["a", "b", "c", "d", "e"]) == {"emitted": 5, "sequence": 5}
    assert await second.emit("root-1", ["a", "b", "c", "d", "e", "f"]) == {
        "emitted": 6,
        "sequence": 6,
    }
    assert [row[2] for row in await _stream("root-1")] == ["a", "b", "c", "d", "e", "f"]
    assert [row[3] for row in await _stream("root-1")] == [1, 2, 3, 4, 5, 6]


async def test_it_keeps_every_field_of_an_event(runner):
    child = await _child(runner)
    events = [
        {
            "kind": "tool-use",
            "toolName": "grep",
            "toolCallId": "call-1",
            "input": {"pattern": "x", "paths": ["a", "b"], "n": 3, "deep": {"ok": None}},
        },
        {
            "kind": "tool-result",
            "toolCallId": "call-1",
            "toolOutput": [1, "two", {"three": 3.5}],
            "success": False,
        },
        {"kind": "error", "error": "boom"},
        {"kind": "text-delta", "text": ""},
        {"kind": "custom-kind-from-the-open-set"},
        {"kind": "tool-update", "input": "plain string input", "toolOutput": 7},
    ]
    await runner.emit(child["runId"], events)
    # Readers see the same fields, numbered; absent fields stay absent.
    read = await runner.read(child)
    assert read["events"] == [{"sequence": i + 1, **e} for i, e in enumerate(events)]
    # A replay of objects with keys in another order is still the same event.
    reordered = [dict(reversed(list(e.items()))) for e in events]
    assert await runner.emit(child["runId"], reordered) == {"emitted": 6, "sequence": 6}


async def test_it_reports_success_absent_as_unknown_through_child_read(runner):
    child = await _child(runner)
    await runner.emit(
        child["runId"],
        [
            {"kind": "tool-result"},
            {"kind": "tool-result", "success": True},
            {"kind": "tool-result", "success": False},
        ],
    )
    read = await runner.read(child)
    assert [e.get("success", "absent") for e in read["events"]] == ["absent", True, False]


async def test_it_keeps_the_server_event_kinds_for_the_server(runner):
    await runner.open("root-1")
    kinds = ["steer", "cancel-requested", "lease-released", "delegation-refused"]
    cases = [
        ({"runId": "root-1", "from": 1, "events": [ev("ok"), {"kind": kind}]}, kind)
        for kind in kinds
    ]
    await assert_all_refused(runner, "run.event", cases, -32602)


# --- truncation -----------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["text", "error"])
async def test_it_truncates_long_text_fields_at_32_kib_on_a_utf8_boundary(runner, field):
    await runner.open("root-1")
    value = "\u20ac" * 12_000  # 36,000 bytes of three-byte characters
    await runner.emit("root-1", [{"kind": "text", field: value}])
    event = await adb(Event.objects.get)(run__run_id="root-1")
    stored = getattr(event, field)
    assert len(stored.encode("utf-8")) <= 32 * KIB
    assert len(stored.encode("utf-8")) > 32 * KIB - 3
    assert value.startswith(stored)
    assert event.truncated is True


async def test_it_does_not_mark_an_event_of_exactly_32_kib_truncated(runner):
    await runner.open("root-1")
    await runner.emit("root-1", [ev("x" * 32 * KIB)])
    event = await adb(Event.objects.get)(run__run_id="root-1")
    assert event.text == "x" * 32 * KIB and event.truncated is False


@pytest.mark.parametrize("field", ["input", "toolOutput"])
async def test_it_truncates_long_structured_fields_at_32_kib(runner, field):
    await runner.open("root-1")
    value = {"blob": "y" * 40 * KIB}
    await runner.emit("root-1", [{"kind": "tool-use", field: value}])
    event = await adb(Event.objects.get)(run__run_id="root-1")
    stored = event.input if field == "input" else event.tool_output
    assert len(str(stored).encode("utf-8")) <= 32 * KIB + 64
    assert event.truncated is True


async def test_it_compares_a_replay_after_the_same_truncation(runner):
    await runner.open("root-1")
    long_text = "z" * 40 * KIB
    await runner.emit("root-1", [ev(long_text)])
    before = await state()
    # The same event again is a replay ...
    assert await runner.emit("root-1", [ev(long_text)]) == {"emitted": 1, "sequence": 1}
    # ... and so is one that differs only beyond the 32 KiB the server keeps.
    assert await runner.emit("root-1", [ev("z" * 32 * KIB + "different tail")]) == {
        "emitted": 1,
        "sequence": 1,
    }
    assert await state() == before
    # A difference inside the kept part is a conflict.
    error = await runner.error(
        "run.event", {"runId": "root-1", "from": 1, "events": [ev("y" + long_text[1:])]}
    )
    assert error["code"] == -32602


async def test_it_sets_the_output_from_a_result_event_and_keeps_it_whole(runner):
    child = await _child(runner)
    output = "\u00e9" * 40_000  # 80,000 bytes: longer than an event field may be
    await runner.emit(
        child["runId"], [ev("thinking...", kind="thinking"), ev(output, kind="result")]
    )
    read = await runner.read(child)
    assert read["output"] == output
    assert len(read["events"][1]["text"].encode("utf-8")) <= 32 * KIB
    # run.finish without output keeps it; with output replaces it.
    finished = await runner.finish(child["runId"])
    assert finished["output"] == output


async def test_it_keeps_all_events_without_a_window(runner):
    await runner.open("root-1")
    for start in range(1, 1001, 250):
        await runner.emit("root-1", [ev(str(i)) for i in range(start, start + 250)], start=start)
    rows = await _stream("root-1")
    assert [row[0] for row in rows] == list(range(1, 1001))
    assert [row[2] for row in rows] == [str(i) for i in range(1, 1001)]


async def test_it_accepts_an_empty_frame_as_a_status_probe(runner):
    await runner.open("root-1")
    await runner.emit("root-1", ["a"])
    assert await runner.emit("root-1", [], start=2) == {"emitted": 1, "sequence": 1}
    assert await runner.emit("root-1", [], start=1) == {"emitted": 1, "sequence": 1}


# Characters COPY's text format escapes (tab, newline, carriage return, backslash, "\N" as
# text) and others a hand-written insert path gets wrong: quotes, NUL-free control
# characters, astral-plane text, a JSON value that is itself a string of JSON.
AWKWARD = 'tab\there\nnew line\r\\N back\\slash "quoted" \x01\x1f é 漢字 🌳 \\\\t'


async def test_it_keeps_text_the_bulk_insert_must_escape_exactly(runner):
    child = await _child(runner)
    events = [
        {"kind": "text", "text": AWKWARD},
        {"kind": "error", "error": AWKWARD},
        {
            "kind": "tool-use",
            "toolName": AWKWARD,
            "toolCallId": "c\t1",
            "input": {AWKWARD: AWKWARD},
        },
        {"kind": "tool-result", "toolCallId": "c\t1", "toolOutput": [AWKWARD, '{"a": 1}']},
        {"kind": "tool-update", "input": '{"not": "an object"}', "toolOutput": "\\N"},
    ]
    await runner.emit(child["runId"], events)
    read = await runner.read(child)
    assert read["events"] == [{"sequence": i + 1, **e} for i, e in enumerate(events)]
    # What was stored compares equal to the same frame sent again: a replay, not a conflict.
    assert await runner.emit(child["runId"], events) == {"emitted": 5, "sequence": 5}


async def test_it_stores_a_frame_longer_than_one_insert_statement_takes(runner):
    # SQLite binds at most 32,766 values a statement (14 a row): 5,000 events take three.
    await runner.open("root-1")
    await runner.emit("root-1", [ev(f"e{i}") for i in range(5000)])
    rows = await _stream("root-1")
    assert [row[0] for row in rows] == list(range(1, 5001))
    assert [row[2] for row in rows] == [f"e{i}" for i in range(5000)]
    assert [row[3] for row in rows] == list(range(1, 5001))

"""What a run's doorbell carries (``delegation.notify``): its events when they are small, their
size estimated without encoding them (issue 39: encoding every frame's events only to measure
them was a tenth of ingest on SQLite)."""

from __future__ import annotations

import json

from delegation import notify

TEXT = {
    "sequence": 1,
    "kind": "text",
    "text": "hello",
    "truncated": False,
    "actor": "",
    "createdAt": 1_733_312_312_312,
}


def _event(sequence: int, **fields) -> dict:
    return {**TEXT, "sequence": sequence, **fields}


def test_it_estimates_the_json_of_plain_events_from_above():
    for events in (
        [_event(n, text="x" * n) for n in range(1, 200)],
        [_event(n, kind="text-delta", text="hello world " * 4) for n in range(1, 101)],
        [
            _event(n, kind="tool-result", toolCallId="c1", toolOutput=[1], success=False)
            for n in range(1, 101)
        ],
    ):
        real = len(json.dumps(events))
        assert real <= notify.payload_chars(events) <= real * 1.1


def test_it_counts_structured_values_by_their_json():
    small = [_event(1, kind="tool-use", toolName="grep", input={"pattern": "a"})]
    large = [_event(1, kind="tool-use", toolName="grep", input={"pattern": "a" * 20_000})]
    assert notify.payload_chars(large) - notify.payload_chars(small) == 20_000 - 1
    assert notify.payload_chars(large) >= len(json.dumps(large))
    assert notify.payload_chars([_event(1, data={"steer": [1, 2, 3]})]) > notify.payload_chars(
        [_event(1)]
    )


def test_it_carries_small_frames_and_leaves_large_ones_to_be_read(monkeypatch):
    sent = []
    monkeypatch.setattr(notify, "_send", lambda group, message: sent.append((group, message)))
    monkeypatch.setattr(notify.transaction, "on_commit", lambda ring: ring())

    class Run:
        pk, root_id, parent_id, last_sequence, status = 7, None, None, 3, "running"

    notify.run_changed(Run(), events=[_event(1)])
    notify.run_changed(Run(), events=[_event(1, text="x" * notify.MAX_PAYLOAD_CHARS)])
    carried = [message.get("events") for group, message in sent if group == notify.run_group(7)]
    assert carried[0] == [_event(1)] and carried[1] is None

"""A repeated warning is logged once, then counted: a Redis outage that loses 2,000 doorbells
writes two lines, not 2,000 (issue 20, item 4)."""

from __future__ import annotations

import asyncio
import logging

from delegation import layers
from delegation.layers import ResilientRedisChannelLayer
from delegation.lograte import RateLimitedLog

# Nothing listens here: every call of the real channels-redis layer fails to connect.
DOWN = "redis://127.0.0.1:1/0"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_it_logs_the_first_then_one_count_per_window(caplog):
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("t.lograte"), window=10.0, clock=clock)
    caplog.set_level(logging.WARNING, "t.lograte")
    for i in range(1875):
        clock.now += 10.0 / 2000  # all inside one 10 s window
        limited.warning("doorbell lost", "doorbell to %s lost (%s)", f"run-{i}", "refused")
    assert _lines(caplog, "t.lograte") == ["doorbell to run-0 lost (refused)"]
    clock.now += 10.0
    limited.flush()
    assert _lines(caplog, "t.lograte")[1:] == [
        "doorbell lost ×1,874 in 10 s (last: doorbell to run-1874 lost (refused))"
    ]
    # A kind that went quiet is logged at once again the next time; other kinds never waited.
    clock.now += 30.0
    limited.flush()
    limited.warning("doorbell lost", "doorbell to %s lost (%s)", "run-x", "back")
    limited.warning("send lost", "send to %s lost", "c1")
    assert _lines(caplog, "t.lograte")[2:] == ["doorbell to run-x lost (back)", "send to c1 lost"]


def test_it_summarises_a_fault_that_goes_on_once_per_window(caplog):
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("t.lograte"), window=10.0, clock=clock)
    caplog.set_level(logging.WARNING, "t.lograte")
    for _ in range(240):  # 30 s of one warning every 1/8 s
        limited.warning("doorbell lost", "lost")
        clock.now += 0.125
    lines = _lines(caplog, "t.lograte")
    # The first window logs one and counts 79; the next ones count all 80 of theirs.
    assert [line.split(" (")[0] for line in lines] == [
        "lost",
        "doorbell lost ×79 in 10 s",
        "doorbell lost ×80 in 10 s",
    ]


async def test_it_sends_the_summary_when_the_window_ends_without_another_warning(caplog):
    limited = RateLimitedLog(logging.getLogger("t.lograte"), window=0.2)
    caplog.set_level(logging.WARNING, "t.lograte")
    for _ in range(5):
        limited.warning("doorbell lost", "lost")
    await asyncio.sleep(0.5)
    assert _lines(caplog, "t.lograte") == ["lost", "doorbell lost ×4 in 0.2 s (last: lost)"]


async def test_it_keeps_a_real_redis_outage_to_two_lines(caplog, monkeypatch):
    """The real channels-redis layer against a Redis that is down: 2,000 lost doorbells within
    one window (the clock stands still however slow the machine is), then the window ends."""
    clock = Clock()
    monkeypatch.setattr(layers, "faults", RateLimitedLog(layers.log, window=10.0, clock=clock))
    caplog.set_level(logging.WARNING, layers.log.name)
    layer = ResilientRedisChannelLayer(hosts=[DOWN])
    for i in range(2000):
        await layer.group_send(f"run-{i}", {"type": "run.changed"})
    clock.now += 10.0
    layers.faults.flush()
    lines = _lines(caplog, layers.log.name)
    assert len(lines) == 2, lines[:5]
    assert lines[0].startswith("doorbell to run-0 lost (")
    assert lines[1].startswith("doorbell lost ×1,999 in 10 s (last: doorbell to run-1999 lost")

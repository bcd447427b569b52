"""A waiting MCP tool call (``waitSeconds``) sends progress at most every PROGRESS_SECONDS,
however often its child's doorbell rings: each notification becomes a stored progress record
of the waiting agent (a Copilot parent stored 21 in 6 s when every ring sent one)."""

import asyncio

from channels.layers import get_channel_layer

from delegation import notify
from delegation.mcp import waiting


class Recorder:
    def __init__(self):
        self.progress = []

    async def report_progress(self, progress, total, message):
        self.progress.append((progress, message))


async def test_it_sends_progress_at_most_every_progress_seconds_while_the_doorbell_rings(
    monkeypatch,
):
    monkeypatch.setattr(waiting, "PROGRESS_SECONDS", 0.5)
    layer = get_channel_layer()
    ctx, reads = Recorder(), []

    async def read():
        reads.append(1)
        return len(reads)

    async def ring_often():
        for _ in range(40):  # a ring every 25 ms for 1 s: 40 rings
            await asyncio.sleep(0.025)
            await layer.group_send(notify.run_group(77), {"type": "run.changed"})

    ringing = asyncio.ensure_future(ring_often())
    result = await waiting.wait_until(
        ctx, 77, 1.2, "child", read, lambda n: False, caller=(76, 5, "runner-token-hash")
    )
    await ringing
    assert result > 10  # every ring was read ...
    assert 2 <= len(ctx.progress) <= 4, ctx.progress  # ... but progress went out per 0.5 s

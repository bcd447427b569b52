"""Back-pressure of a saturated server process (issue 39), over real TCP WebSockets to a real
daphne: past ``RUN_EVENT_PENDING_MAX`` frames held, a ``run.event`` is answered at once with
−32603, ``data.retryable`` and ``data.retryAfterMs``, nothing of it stored; every frame gets an
answer, and a runner that sends again after the delay has every event stored exactly once.

The limits are set so that any frame arriving while another is in hand is refused (a count
of 1, or a wait of 0 ms); each test first checks that the server really refused some, so it
can fail if none were. How the wait is measured: ``test_it_counts_the_wait_of_the_oldest``.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from asgiref.sync import sync_to_async
from websockets.asyncio.client import connect

from delegation.client import Extension, Preset, RunnerClient, event
from delegation.models import Event
from delegation.runner_socket import pressure
from delegation.services import tokens

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

RUNS = 20
BUSY = -32603


def _stored(run_ids) -> dict[str, list[str]]:
    stored: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
    rows = Event.objects.filter(run__run_id__in=list(run_ids)).order_by("run_id", "sequence")
    for run_id, text in rows.values_list("run__run_id", "text"):
        stored[run_id].append(text)
    return stored


async def _token(name: str) -> str:
    return (await sync_to_async(tokens.create_runner)(name))[1]


class RawRunner:
    """A runner that pipelines frames without waiting, on a plain WebSocket."""

    def __init__(self, ws):
        self.ws, self.ids = ws, iter(range(1, 1_000_000))

    async def call(self, method: str, params: dict) -> dict:
        rpc_id = next(self.ids)
        await self.ws.send(
            json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        )
        while True:
            frame = json.loads(await asyncio.wait_for(self.ws.recv(), 20))
            if frame.get("id") == rpc_id:
                assert "result" in frame, frame
                return frame["result"]

    async def send_events(self, batch: dict[int, tuple[str, str]]) -> None:
        """``batch``: rpc id -> (run id, text), one event at ``from`` 1 each, sent at once."""
        for rpc_id, (run_id, text) in batch.items():
            params = {"runId": run_id, "from": 1, "events": [{"kind": "text", "text": text}]}
            await self.ws.send(
                json.dumps(
                    {"jsonrpc": "2.0", "id": rpc_id, "method": "run.event", "params": params}
                )
            )

    async def answers(self, ids) -> dict[int, dict]:
        wanted, got = set(ids), {}
        while wanted - set(got):
            frame = json.loads(await asyncio.wait_for(self.ws.recv(), 20))
            if frame.get("id") in wanted:
                got[frame["id"]] = frame
        return got


@pytest.mark.parametrize(
    "limit",
    [{"RUN_EVENT_PENDING_MAX": 1}, {"RUN_EVENT_WAIT_MAX_MS": 0}],
    ids=["by-count", "by-wait"],
)
async def test_a_saturated_process_answers_every_frame_at_once_with_a_retry_delay(
    daphne_factory, limit
):
    server = daphne_factory(**limit)
    token = await _token("pressed")
    run_ids = [f"run-{n}" for n in range(RUNS)]
    async with connect(
        server.ws_url, additional_headers={"Authorization": f"Bearer {token}"}
    ) as ws:
        runner = RawRunner(ws)
        await runner.call(
            "runner.register",
            {
                "hostInstanceId": "h",
                "extensions": [{"extensionId": "e", "generation": 1, "presets": []}],
            },
        )
        for run_id in run_ids:
            await runner.call("run.open", {"conversationId": f"c-{run_id}", "runId": run_id})

        waiting = {1000 + n: (run_id, f"event of {run_id}") for n, run_id in enumerate(run_ids)}
        refused_once = 0
        for _round in range(50):
            await runner.send_events(waiting)
            answers = await runner.answers(waiting)  # every frame is answered: none hangs
            busy = {i: a for i, a in answers.items() if "error" in a}
            for rpc_id, answer in answers.items():
                if rpc_id in busy:
                    error = answer["error"]
                    assert error["code"] == BUSY, error
                    assert error["data"]["retryable"] is True
                    assert isinstance(error["data"]["retryAfterMs"], int)
                    assert 50 <= error["data"]["retryAfterMs"] <= 5000
                    assert "server busy" in error["message"]
                else:
                    assert answer["result"] == {"emitted": 1, "sequence": 1}, answer
            refused_once = refused_once or len(busy)
            if not busy:
                break
            # As the SDK does: the refused frames again, after the delay they were given.
            await asyncio.sleep(
                max(a["error"]["data"]["retryAfterMs"] for a in busy.values()) / 1000
            )
            waiting = {rpc_id + 100: waiting[rpc_id] for rpc_id in busy}
        else:
            pytest.fail("frames were still refused after 50 rounds")

    assert refused_once, "no frame was refused: the test saw no back-pressure"
    stored = await sync_to_async(_stored)(run_ids)
    # A refused frame stored nothing, its resend everything: each event exactly once.
    assert stored == {run_id: [f"event of {run_id}"] for run_id in run_ids}


async def test_the_sdk_waits_the_delay_and_sends_again_until_everything_is_stored(
    daphne_factory, caplog
):
    server = daphne_factory(RUN_EVENT_PENDING_MAX=1)
    token = await _token("sdk-pressed")
    run_ids = [f"sdk-run-{n}" for n in range(RUNS)]
    client = RunnerClient(
        server.ws_url,
        token,
        extensions=[Extension("ext", 1, [Preset("worker")])],
        host_instance_id="host-1",
        depth=None,
    )
    caplog.set_level(logging.INFO)
    try:
        await client.connect()
        for run_id in run_ids:
            await client.open_run(f"c-{run_id}", run_id, extension_id="ext")
        # Every run emits at once, three times: frames arrive together, most while another
        # is in hand, and the SDK must resend each refused one after its delay.
        for round_ in range(3):
            await asyncio.gather(
                *(
                    client.emit(run_id, event("text", text=f"{run_id} #{round_}"))
                    for run_id in run_ids
                )
            )
    finally:
        await client.close()

    pauses = [r for r in caplog.records if "server busy" in r.getMessage()]
    assert pauses, "the SDK was never asked to pause: the test saw no back-pressure"
    assert all(r.levelno == logging.INFO for r in pauses)
    stored = await sync_to_async(_stored)(run_ids)
    assert stored == {run_id: [f"{run_id} #{n}" for n in range(3)] for run_id in run_ids}


def test_it_counts_the_wait_of_the_oldest_frame_held(monkeypatch, settings):
    """Saturated once the oldest frame still held has waited RUN_EVENT_WAIT_MAX_MS, however
    few frames are held; not while younger ones are, and never with none."""
    settings.RUN_EVENT_WAIT_MAX_MS, settings.RUN_EVENT_PENDING_MAX = 500, 1000
    now = [100.0]
    monkeypatch.setattr(pressure, "_clock", lambda: now[0])
    held = pressure.FramePressure()
    assert not held.saturated()
    held.took()
    now[0] += 0.4
    held.took()
    assert held.oldest_wait_ms() == pytest.approx(400) and not held.saturated()
    now[0] += 0.1
    assert held.saturated()  # the first has waited 500 ms
    held.answered()
    assert held.oldest_wait_ms() == pytest.approx(100) and not held.saturated()
    held.dropped(1)
    now[0] += 10
    assert held.held == 0 and not held.saturated()
    settings.RUN_EVENT_PENDING_MAX = 2
    held.took(2)
    assert held.saturated()  # the count is a ceiling of its own

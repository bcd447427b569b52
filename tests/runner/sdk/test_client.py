"""The runner SDK against an in-process fake server speaking real WebSocket frames.

The fake server implements just enough of SPEC §5 (register, run.open, the ``from``/``emitted``
numbering with replay skipping, run.finish) and can misbehave on cue: drop a connection after a
frame was stored but before its answer, refuse a token, fence, or stop for a while. That lets
the reconnect/resend logic be tested in isolation from the real engine; tests/runner/sdk/test_e2e.py
repeats the important cases against a real daphne server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from websockets.asyncio.server import serve

from delegation import client as sdk
from delegation import errors as codes
from delegation.client import (
    Extension,
    Preset,
    RunnerClient,
    event,
)

TOKEN = "rt_test-token"


class FakeServer:
    def __init__(self):
        self.server = None
        self.port = None
        self.connections = []  # every ServerConnection, in order
        self.handshakes = []  # request headers of every handshake
        self.frames = []  # every decoded frame received, in order
        self.registrations = []
        self.generation = 0
        self.runs = {}  # runId -> {"events": [...], "finished": params|None}
        self.answers = {}  # command id -> answer frame, from the client
        self.answer_arrived = asyncio.Event()
        self.refuse_token = False
        self.close_code_on_register = None
        # (method, n): close abruptly after the n-th such frame, after storing / before storing
        self.drop_after_storing = {}
        self.drop_before_storing = {}
        self.close_cleanly_every = {}  # method -> n: a clean close instead of every n-th answer
        self.counts = {}
        self.errors = {}  # method -> error member to answer with
        self.results = {}  # method -> result to answer with
        self.on_register = None  # async callback(ws) after answering a register

    @property
    def url(self):
        return f"ws://127.0.0.1:{self.port}/ws/runner/"

    async def start(self):
        self.server = await serve(self._handle, "127.0.0.1", self.port or 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self):
        self.server.close()
        for ws in self.connections:
            ws.transport.abort()
        await self.server.wait_closed()

    def run_events(self, run_id):
        return self.runs[run_id]["events"]

    async def command(self, ws, command_id, method, params):
        await ws.send(
            json.dumps({"jsonrpc": "2.0", "id": command_id, "method": method, "params": params})
        )

    async def wait_answer(self, command_id, timeout=5):
        async with asyncio.timeout(timeout):
            while command_id not in self.answers:
                self.answer_arrived.clear()
                await self.answer_arrived.wait()
        return self.answers[command_id]

    async def _handle(self, ws):
        self.connections.append(ws)
        self.handshakes.append(dict(ws.request.headers))
        if self.refuse_token:
            await ws.close(4401, "bad token")
            return
        async for raw in ws:
            message = json.loads(raw)
            self.frames.append(message)
            if "method" not in message:
                self.answers[message["id"]] = message
                self.answer_arrived.set()
                continue
            method = message["method"]
            self.counts[method] = n = self.counts.get(method, 0) + 1
            if self.drop_before_storing.get(method) == n:
                ws.transport.abort()
                return
            every = self.close_cleanly_every.get(method)
            if every and n % every == 0:
                await ws.close(1001, "going away")  # a clean stop: a close frame, no answer
                return
            answer = self._answer(method, message.get("params", {}))
            if self.drop_after_storing.get(method) == n:
                ws.transport.abort()
                return
            frame = {"jsonrpc": "2.0", "id": message["id"]}
            frame.update(answer)
            await ws.send(json.dumps(frame))
            if method == "runner.register":
                if self.close_code_on_register:
                    await ws.close(self.close_code_on_register, "fenced")
                    return
                if self.on_register:
                    await self.on_register(ws)

    def _answer(self, method, params):
        if method in self.errors:
            return {"error": self.errors[method]}
        if method in self.results:
            return {"result": self.results[method]}
        if method == "runner.register":
            self.generation += 1
            self.registrations.append(params)
            return {"result": {"runnerId": "r1", "connectionGeneration": self.generation}}
        if method == "run.open":
            self.runs[params["runId"]] = {"events": [], "finished": None}
            return {"result": result_frame(run_id=params["runId"], conv=params["conversationId"])}
        if method == "run.event":
            stored = self.runs[params["runId"]]["events"]
            start = params["from"]
            if start > len(stored) + 1:
                return {"error": {"code": -32602, "message": "gap"}}
            for offset, ev in enumerate(params["events"]):
                index = start + offset  # 1-based
                if index <= len(stored):
                    if stored[index - 1] != ev:
                        return {"error": {"code": -32602, "message": "replay differs"}}
                else:
                    stored.append(ev)
            return {"result": {"emitted": len(stored), "sequence": len(stored)}}
        if method == "run.finish":
            self.runs[params["runId"]]["finished"] = params
            return {"result": {}}
        if method == "run.mcpToken":
            run = self.runs.get(params.get("runId"))
            if run is None or run["finished"] is not None:
                return {"error": {"code": -32004, "message": "no running run of this runner"}}
            return {
                "result": {
                    "url": f"http://127.0.0.1:{self.port}/mcp",
                    "token": f"crt_{params['runId']}",
                    "expiresAt": "2026-01-01T00:00:00Z",
                }
            }
        return {"error": {"code": -32601, "message": f"unknown method {method}"}}


def result_frame(run_id="run-1", conv="conv-1", **extra):
    base = {
        "runnerId": "r1",
        "hostInstanceId": "h1",
        "conversationId": conv,
        "runId": run_id,
        "parentConversationId": "",
        "parentRunId": "",
        "extensionId": "",
        "profile": "",
        "done": False,
        "cancelled": False,
        "error": "",
        "output": "",
        "events": [],
        "depth": 0,
        "status": "running",
    }
    base.update(extra)
    return base


@pytest.fixture
async def fake():
    server = FakeServer()
    await server.start()
    yield server
    await server.stop()


EXTENSIONS = [Extension("ext", 7, [Preset("coder", "be careful", {"maxTurns": 3})])]


def make_client(fake, **kwargs):
    kwargs.setdefault("extensions", EXTENSIONS)
    kwargs.setdefault("host_instance_id", "host-a")
    kwargs.setdefault("backoff_initial", 0.02)
    kwargs.setdefault("backoff_max", 0.1)
    kwargs.setdefault("call_timeout", 5)
    kwargs.setdefault("depth", None)
    return RunnerClient(fake.url, TOKEN, **kwargs)


# --- handshake and registration ---------------------------------------------------------


async def test_it_sends_the_token_and_registers_first(fake):
    async with make_client(fake, workspace="/srv/work") as client:
        assert client.registration == sdk.Registration("r1", 1)
    headers = {k.lower(): v for k, v in fake.handshakes[0].items()}
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert "x-pando-delegation-depth" not in headers
    first = fake.frames[0]
    assert first["method"] == "runner.register"
    assert first["jsonrpc"] == "2.0"
    assert first["params"] == {
        "hostInstanceId": "host-a",
        "extensions": [
            {
                "extensionId": "ext",
                "generation": 7,
                "presets": [
                    {"name": "coder", "systemPrompt": "be careful", "options": {"maxTurns": 3}}
                ],
            }
        ],
        "workspace": "/srv/work",
    }


async def test_it_declares_the_level_from_the_environment(fake, monkeypatch):
    monkeypatch.setenv("PANDO_DELEGATION_DEPTH", " +2 ")
    client = RunnerClient(fake.url, TOKEN, host_instance_id="h")
    async with client:
        pass
    headers = {k.lower(): v for k, v in fake.handshakes[0].items()}
    assert headers["x-pando-delegation-depth"] == "2"


async def test_it_declares_nothing_when_the_environment_level_is_invalid(fake, monkeypatch):
    monkeypatch.setenv("PANDO_DELEGATION_DEPTH", "-1")
    async with RunnerClient(fake.url, TOKEN, host_instance_id="h"):
        pass
    headers = {k.lower(): v for k, v in fake.handshakes[0].items()}
    assert "x-pando-delegation-depth" not in headers


async def test_it_prefers_an_explicit_level_over_the_environment(fake, monkeypatch):
    monkeypatch.setenv("PANDO_DELEGATION_DEPTH", "5")
    async with RunnerClient(fake.url, TOKEN, host_instance_id="h", depth=1):
        pass
    headers = {k.lower(): v for k, v in fake.handshakes[0].items()}
    assert headers["x-pando-delegation-depth"] == "1"


async def test_it_declares_a_run_level_through_meta(fake):
    async with make_client(fake) as client:
        result = await client.open_run("conv-1", "run-1", profile="coder", depth=2)
    assert isinstance(result, sdk.Result)
    assert result.run_id == "run-1" and result.child_id == "conv-1"
    sent = [f for f in fake.frames if f.get("method") == "run.open"][0]["params"]
    assert sent == {
        "conversationId": "conv-1",
        "runId": "run-1",
        "profile": "coder",
        "_meta": {"pando:delegationDepth": 2},
    }


async def test_it_stops_for_good_on_a_refused_token(fake):
    fake.refuse_token = True
    client = make_client(fake)
    with pytest.raises(sdk.AuthenticationFailed):
        await client.connect(timeout=3)
    await asyncio.sleep(0.3)
    assert len(fake.handshakes) == 1  # no retry loop against a bad token
    await client.close()


async def test_it_stops_for_good_when_fenced(fake):
    async with make_client(fake) as client:
        fake.close_code_on_register = None
        await client.open_run("conv-1", "run-1")
        # A newer connection of this runner took over: the server closes with 4409.
        await fake.connections[-1].close(4409, "fenced")
        with pytest.raises(sdk.Fenced):
            await client.emit("run-1", event("text", "late"))
        await asyncio.sleep(0.3)
        assert len(fake.handshakes) == 1  # it must not fight the newer connection


async def test_it_waits_for_a_server_that_starts_later():
    server = FakeServer()
    await server.start()
    port = server.port
    await server.stop()
    client = RunnerClient(
        f"ws://127.0.0.1:{port}/ws/runner/",
        TOKEN,
        host_instance_id="h",
        depth=None,
        backoff_initial=0.02,
        backoff_max=0.1,
    )
    connecting = asyncio.create_task(client.connect(timeout=5))
    await asyncio.sleep(0.4)
    assert not connecting.done()
    server.port = port
    await server.start()
    registration = await connecting
    assert registration.runner_id == "r1"
    await client.close()
    await server.stop()


async def test_it_times_out_when_the_server_never_comes(fake):
    port = fake.port
    await fake.stop()
    client = RunnerClient(
        f"ws://127.0.0.1:{port}/ws/runner/",
        TOKEN,
        depth=None,
        backoff_initial=0.02,
        backoff_max=0.05,
    )
    with pytest.raises(sdk.ClientTimeout):
        await client.connect(timeout=0.5)
    await client.close()
    await fake.start()  # so the fixture can stop it


# --- event numbering ---------------------------------------------------------------------


async def test_it_numbers_events_from_one_across_frames(fake):
    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        ack = await client.emit("run-1", event("thinking", "hm"), event("text", "a"))
        assert ack == sdk.EmitAck(emitted=2, sequence=2)
        ack = await client.emit("run-1", event("text", "b"))
        assert ack.emitted == 3
        await client.finish("run-1", output="done")
    frames = [f["params"] for f in fake.frames if f.get("method") == "run.event"]
    assert [(f["from"], len(f["events"])) for f in frames] == [(1, 2), (3, 1)]
    assert all("sequence" not in ev for f in frames for ev in f["events"])
    assert fake.runs["run-1"]["finished"] == {"runId": "run-1", "output": "done"}


async def test_it_refuses_events_the_runner_may_not_send(fake):
    async with make_client(fake) as client:
        stream = client.stream("run-1")
        with pytest.raises(ValueError, match="server's own"):
            stream.append(event("delegation-refused", "x"))
        with pytest.raises(ValueError, match="sequence"):
            stream.append({"kind": "text", "sequence": 4})
        with pytest.raises(ValueError, match="unknown event field"):
            stream.append({"kind": "text", "apiKey": "sk-1"})
        assert stream.unconfirmed == 0


async def test_it_batches_concurrent_emits_without_reordering(fake):
    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        stream = client.stream("run-1")
        await asyncio.gather(*(stream.emit(event("text", str(i))) for i in range(50)))
        await stream.finish()
    stored = [ev["text"] for ev in fake.run_events("run-1")]
    assert stored == [str(i) for i in range(50)]
    froms = [f["params"]["from"] for f in fake.frames if f.get("method") == "run.event"]
    assert froms == sorted(froms) and len(froms) < 50


# --- reconnect and resend ----------------------------------------------------------------


async def test_it_resends_a_frame_whose_answer_was_lost(fake):
    # The server stored frame 2 and then the connection died before the answer came back.
    fake.drop_after_storing["run.event"] = 2
    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        for i in range(5):
            await client.emit("run-1", event("text", f"e{i}"))
        await client.finish("run-1")
        assert client.connections == 2
    assert [ev["text"] for ev in fake.run_events("run-1")] == [f"e{i}" for i in range(5)]
    froms = [f["params"]["from"] for f in fake.frames if f.get("method") == "run.event"]
    assert froms == [1, 2, 2, 3, 4, 5]  # frame 2 sent twice, stored once
    # Re-registered with the same extensions.
    assert fake.registrations[0] == fake.registrations[1]


async def test_it_resends_a_frame_the_server_never_stored(fake):
    fake.drop_before_storing["run.event"] = 3
    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        for i in range(5):
            await client.emit("run-1", event("text", f"e{i}"))
    assert [ev["text"] for ev in fake.run_events("run-1")] == [f"e{i}" for i in range(5)]


async def test_it_queues_calls_while_the_server_is_down(fake):
    async with make_client(fake, call_timeout=10) as client:
        await client.open_run("conv-1", "run-1")
        await client.emit("run-1", event("text", "before"))
        await fake.stop()
        emitting = asyncio.create_task(client.emit("run-1", event("text", "during")))
        await asyncio.sleep(0.5)
        assert not emitting.done()  # waiting for the server, not failed
        assert not client.connected
        await fake.start()
        ack = await emitting
        assert ack.emitted == 2
    assert [ev["text"] for ev in fake.run_events("run-1")] == ["before", "during"]
    assert len(fake.registrations) == 2


async def test_it_flushes_buffered_events_as_soon_as_it_reconnects(fake):
    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        await fake.stop()
        stream = client.stream("run-1")
        stream.append(event("text", "a"), event("text", "b"))  # buffered, nobody waiting
        await fake.start()
        async with asyncio.timeout(5):
            while len(fake.runs["run-1"]["events"]) < 2:
                await asyncio.sleep(0.02)
            # The server stores before it answers: the answer confirms them a moment later.
            while stream.unconfirmed:
                await asyncio.sleep(0.02)
        assert [e["text"] for e in fake.runs["run-1"]["events"]] == ["a", "b"]  # once each


async def test_it_times_out_a_call_when_the_server_stays_down(fake):
    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        await fake.stop()
        with pytest.raises(sdk.ClientTimeout):
            await client.emit("run-1", event("text", "x"), timeout=0.5)
        assert client.stream("run-1").unconfirmed == 1  # kept for the next attempt
        await fake.start()
        ack = await client.stream("run-1").flush()
        assert ack.emitted == 1


async def test_it_survives_many_drops_exactly_once_in_order(fake):
    fake.drop_after_storing["run.event"] = 2

    async def chaos():
        for _ in range(3):
            await asyncio.sleep(0.05)
            fake.connections[-1].transport.abort()

    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        stream = client.stream("run-1")
        dropper = asyncio.create_task(chaos())
        for i in range(60):
            await stream.emit(event("text", f"e{i}"))
            await asyncio.sleep(0.005)
        await dropper
        await stream.finish(output="ok")
        assert client.connections >= 3
    assert [ev["text"] for ev in fake.run_events("run-1")] == [f"e{i}" for i in range(60)]


# --- child methods and typed errors ------------------------------------------------------


async def test_it_returns_typed_results_for_child_calls(fake):
    fake.results["child.start"] = result_frame(
        run_id="child-run",
        conv="child-conv",
        parentRunId="run-1",
        depth=1,
        extensionId="ext",
        profile="coder",
    )
    fake.results["child.read"] = result_frame(
        run_id="child-run",
        conv="child-conv",
        done=True,
        output="42",
        status="succeeded",
        events=[
            {"sequence": 1, "kind": "text", "text": "hi"},
            {"sequence": 2, "kind": "result", "text": "42"},
        ],
    )
    fake.results["child.steer"] = {"outcome": "promptRequired", "reason": "noRunningTurn"}
    fake.results["child.lease.release"] = {"done": True}
    async with make_client(fake) as client:
        started = await client.child_start(
            "run-1",
            "ext",
            7,
            {"requestId": "q1", "profile": "coder", "message": "go"},
            tool_call_id="tc1",
            lease_id="L1",
        )
        assert (started.child_id, started.depth, started.parent_run_id) == (
            "child-conv",
            1,
            "run-1",
        )
        read = await client.child_read("run-1", "ext", 7, "child-conv", after=0)
        assert read.done and read.output == "42" and read.last_sequence == 2
        assert read.events[0] == sdk.Event(sequence=1, kind="text", text="hi")
        outcome = await client.child_steer(
            "run-1", "ext", 7, "child-conv", "faster", request_id="s1"
        )
        assert outcome == sdk.SteerOutcome("promptRequired", "noRunningTurn")
        assert not outcome.injected
        assert await client.lease_release("L1", "ext", 7) == {"done": True}
    sent = {f["method"]: f["params"] for f in fake.frames if "method" in f}
    assert sent["child.start"] == {
        "runId": "run-1",
        "extensionId": "ext",
        "generation": 7,
        "toolCallId": "tc1",
        "leaseId": "L1",
        "request": {"requestId": "q1", "profile": "coder", "message": "go"},
    }
    assert sent["child.read"] == {
        "runId": "run-1",
        "extensionId": "ext",
        "generation": 7,
        "childId": "child-conv",
        "after": 0,
    }
    assert sent["child.steer"]["requestId"] == "s1"
    assert sent["child.lease.release"] == {"leaseId": "L1", "extensionId": "ext", "generation": 7}


@pytest.mark.parametrize(
    "code, error_type",
    [
        (codes.DEPTH_LIMIT, sdk.DepthLimitReached),
        (codes.NOT_OWNED, sdk.NotOwned),
        (codes.ADMISSION_REFUSED, sdk.AdmissionRefused),
        (codes.PRESET_STALE, sdk.PresetStale),
        (codes.INVALID_PARAMS, sdk.InvalidParams),
    ],
)
async def test_it_raises_typed_errors_with_the_spec_code(fake, code, error_type):
    fake.errors["child.start"] = {"code": code, "message": "refused for a reason"}
    async with make_client(fake) as client:
        with pytest.raises(error_type) as caught:
            await client.child_start(
                "run-1", "ext", 7, {"requestId": "q1", "profile": "coder", "message": "go"}
            )
    assert caught.value.code == code
    assert caught.value.message == "refused for a reason"
    assert isinstance(caught.value, codes.RpcError)


async def test_it_resends_a_steer_with_the_same_request_id(fake):
    fake.results["child.steer"] = {"outcome": "injected"}
    fake.drop_after_storing["child.steer"] = 1
    async with make_client(fake) as client:
        outcome = await client.child_steer("run-1", "ext", 7, "c1", "look left")
    assert outcome.injected
    steers = [f["params"] for f in fake.frames if f.get("method") == "child.steer"]
    assert len(steers) == 2 and steers[0]["requestId"] == steers[1]["requestId"]


async def test_it_retries_an_unconfirmed_release_when_asked(fake):
    fake.errors["child.lease.release"] = {"code": codes.RELEASE_UNCONFIRMED, "message": "retry"}
    async with make_client(fake) as client:
        with pytest.raises(sdk.ReleaseUnconfirmed):
            await client.lease_release("L1", "ext", 7)

        async def confirm_later():
            await asyncio.sleep(0.3)
            del fake.errors["child.lease.release"]
            fake.results["child.lease.release"] = {"done": True}

        asyncio.create_task(confirm_later())
        assert await client.lease_release("L1", "ext", 7, retry_until=3) == {"done": True}


# --- server commands ---------------------------------------------------------------------


async def test_it_answers_server_commands_through_handlers(fake):
    seen = []

    async def on_execute(params, client):
        command = sdk.ExecuteCommand.from_wire(params)
        seen.append(command)
        return {}

    async with make_client(fake) as client:
        client.on("child.execute", on_execute)

        @client.on("run.steer")
        async def on_steer(params, client):
            return {"outcome": "injected"}

        ws = fake.connections[-1]
        params = {
            "identity": {
                "runnerId": "r1",
                "hostInstanceId": "host-a",
                "conversationId": "c2",
                "runId": "r2",
                "parentConversationId": "c1",
                "parentRunId": "r1",
                "extensionId": "ext",
                "profile": "coder",
            },
            "request": {"requestId": "q", "profile": "coder", "message": "do it"},
            "preset": {"name": "coder", "systemPrompt": "be careful"},
            "depth": 2,
        }
        await fake.command(ws, "srv-1", "child.execute", params)
        await fake.command(
            ws, "srv-2", "run.steer", {"runId": "r2", "requestId": "s", "message": "m"}
        )
        await fake.command(ws, "srv-3", "lease.revoked", {"leaseId": "L"})
        assert (await fake.wait_answer("srv-1"))["result"] == {}
        assert (await fake.wait_answer("srv-2"))["result"] == {"outcome": "injected"}
        assert (await fake.wait_answer("srv-3"))["error"]["code"] == codes.METHOD_NOT_FOUND
    assert seen[0].run_id == "r2" and seen[0].depth == 2 and seen[0].message == "do it"
    assert seen[0].preset == Preset("coder", "be careful")
    assert seen[0].identity.parent_run_id == "r1"


async def test_it_answers_a_redelivered_command_without_running_it_twice(fake):
    calls = []

    async def on_execute(params, client):
        calls.append(params["identity"]["runId"])
        return {}

    params = {"identity": {"runId": "r9"}, "request": {}, "preset": {"name": "p"}, "depth": 1}

    async def redeliver(ws):
        if len(fake.registrations) == 2:
            await fake.command(ws, "srv-5", "child.execute", params)

    fake.on_register = redeliver
    async with make_client(fake) as client:
        client.on("child.execute", on_execute)
        await fake.command(fake.connections[-1], "srv-5", "child.execute", params)
        await fake.wait_answer("srv-5")
        fake.answers.clear()
        await client.drop_connection()
        answer = await fake.wait_answer("srv-5")
    assert answer["result"] == {}
    assert calls == ["r9"]


async def test_it_turns_a_handler_refusal_into_an_error_answer(fake):
    async def on_cancel(params, client):
        raise codes.RpcError(codes.NO_SUCH_RUN, "no such run here")

    async with make_client(fake) as client:
        client.on("run.cancel", on_cancel)
        await fake.command(
            fake.connections[-1], "srv-1", "run.cancel", {"runId": "x", "reason": "r"}
        )
        answer = await fake.wait_answer("srv-1")
    assert answer["error"] == {"code": codes.NO_SUCH_RUN, "message": "no such run here"}


def test_it_has_no_django_import():
    # Run in a fresh interpreter: an agent host without Django must be able to import the SDK
    # and the reference runner (python -m delegation.runner).
    code = (
        "import sys; import delegation.client, delegation.runner.cli; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'channels', "
        "'pydantic')); print(bad); sys.exit(1 if bad else 0)"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        # The checkout's root (sdk is delegation/client/__init__.py), so this checkout is imported.
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(sdk.__file__))),
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def test_it_does_not_spin_when_the_server_closes_cleanly_under_load(fake):
    # A close frame makes sends fail at once, before the reader has seen the close. A client
    # that retried on that connection without yielding would hang the loop (pytest-timeout).
    fake.close_cleanly_every["run.event"] = 7
    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        stream = client.stream("run-1")

        async def burst(tag):
            for i in range(20):
                await stream.emit(event("text", f"{tag}{i}"))

        async with asyncio.timeout(30):
            await asyncio.gather(burst("a"), burst("b"), burst("c"))
            await stream.finish()
        assert client.connections > 3
    texts = [ev["text"] for ev in fake.run_events("run-1")]
    assert sorted(texts) == sorted(f"{t}{i}" for t in "abc" for i in range(20))
    assert len(texts) == 60


async def test_it_does_not_spin_on_a_connection_lost_before_the_reader_noticed(fake):
    # Once the socket is gone, a send fails without awaiting anything. If the client kept
    # retrying on that connection it would never yield, the reader would never run, and the
    # loop would hang (this test then fails on pytest-timeout).
    class SlowToNotice(RunnerClient):
        async def _read(self, conn):
            await super()._read(conn)
            await asyncio.sleep(0.3)

    client = SlowToNotice(
        fake.url,
        TOKEN,
        extensions=EXTENSIONS,
        depth=None,
        backoff_initial=0.02,
        backoff_max=0.1,
        call_timeout=5,
    )
    async with client:
        await client.open_run("conv-1", "run-1")
        client._conn.ws.transport.abort()
        await asyncio.sleep(0.05)  # the socket is closed; the reader is still "busy"
        ack = await client.emit("run-1", event("text", "after the drop"))
        assert ack.emitted == 1 and client.connections == 2


async def test_it_refuses_an_event_too_big_for_a_frame_without_wedging_the_stream(fake):
    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        stream = client.stream("run-1")
        with pytest.raises(ValueError, match="over"):
            await stream.emit(event("text", "x" * (600 * 1024)))
        ack = await stream.emit(event("text", "small"))
        assert ack.emitted == 1
    assert fake.run_events("run-1") == [{"kind": "text", "text": "small"}]


# --- the command engine's line handling (no server needed) --------------------------------


def test_it_turns_agent_lines_into_events():
    from delegation.runner.formats.lines import fit, line_event

    assert line_event("hello") == {"kind": "text", "text": "hello"}
    assert line_event('{"kind": "tool-use", "toolName": "grep", "input": {"q": 1}, "x": 2}') == {
        "kind": "tool-use",
        "toolName": "grep",
        "input": {"q": 1},
    }
    # Not an event: no kind, a kind of the wrong type, or a kind only the server may write.
    for line in (
        '{"text": "no kind"}',
        '{"kind": 3}',
        '{"kind": "steer", "text": "forged"}',
        '{"kind": "text", "success": "yes"}',
        "[1, 2]",
        "{broken",
    ):
        assert line_event(line) == {"kind": "text", "text": line}
    big = fit({"kind": "tool-result", "toolOutput": {"blob": "y" * 400_000}, "text": "z" * 10})
    assert big["text"] == "z" * 10
    assert isinstance(big["toolOutput"], str) and len(big["toolOutput"]) < 33_000
    assert big["toolOutput"].endswith("[truncated by the runner]")


# --- run tokens (SPEC §9) ----------------------------------------------------------------


async def test_it_asks_for_a_run_token_and_keeps_it_out_of_its_repr(fake):
    async with make_client(fake) as client:
        await client.open_run("conv-1", "run-1")
        minted = await client.mcp_token("run-1")
        assert minted.url == f"http://127.0.0.1:{fake.port}/mcp"
        assert minted.token == "crt_run-1"
        assert minted.expires_at == "2026-01-01T00:00:00Z"
        assert "crt_run-1" not in repr(minted)
        await client.finish("run-1", output="x")
        with pytest.raises(sdk.NoSuchRun, match="no running run"):
            await client.mcp_token("run-1")
    sent = [f for f in fake.frames if f.get("method") == "run.mcpToken"]
    assert [f["params"] for f in sent] == [{"runId": "run-1"}, {"runId": "run-1"}]


async def test_it_refuses_a_run_token_answer_without_a_token(fake):
    fake.results["run.mcpToken"] = {"url": "http://x/mcp", "expiresAt": "soon"}
    async with make_client(fake) as client:
        with pytest.raises(sdk.RpcError, match="without a 'token'"):
            await client.mcp_token("run-1")

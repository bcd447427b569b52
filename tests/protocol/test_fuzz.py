"""Property-based conformance (issue 2): random and mutated frames never crash the runner
consumer, always get a JSON-RPC error with a SPEC code or a valid result, and a refused frame
never changes state a later read could observe.

Each property drives a real runner socket (a WebsocketCommunicator on its own event loop,
so hypothesis can call a plain function per example). After every fuzzed frame a sentinel
request follows on the same socket: its answer proves the consumer is alive and marks the end
of whatever the fuzzed frame produced.

Every example starts from the same state: when an example changed what a later read could
observe (or the socket closed), the runner's tables are emptied and the tree built again on
a new socket. The ids the server makes up (child runs and sessions) appear in the generated
frames as placeholders, filled in as the frame is sent, so an example means the same thing
on a rebuilt tree and reproduces alone (``HYPOTHESIS_PROFILE=ci`` prints its blob).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json

import pytest
from django.apps import apps
from django.core.management.color import no_style
from django.db import connection
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from delegation.services import tokens
from tests.support.rpc import RpcClient, communicator
from tests.support.state import observable_state

pytestmark = pytest.mark.django_db(transaction=True)

SPEC_CODES = {
    -32700,
    -32600,
    -32601,
    -32602,
    -32001,
    -32002,
    -32003,
    -32004,
    -32010,
    -32011,
    -32012,
    -32013,
    -32014,
    -32015,
    -32016,
    -32017,
}
METHODS = [
    "runner.register",
    "run.open",
    "run.event",
    "run.finish",
    "tool.end",
    "child.start",
    "child.read",
    "child.cancel",
    "child.steer",
    "child.lease.release",
]
FIELD_NAMES = [
    "runId",
    "toolCallId",
    "extensionId",
    "generation",
    "request",
    "childId",
    "childRunId",
    "message",
    "requestId",
    "leaseId",
    "after",
    "conversationId",
    "from",
    "events",
    "hostInstanceId",
    "extensions",
    "_meta",
    "profile",
    "options",
    "apiKey",
]
FUZZ_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)

MUTATION_SETTINGS = settings(FUZZ_SETTINGS, max_examples=200)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
    | st.sampled_from(["", "root-1", "ext", "worker", "..", "a/b", "L1", "fresh", "fork", "1"])
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=12) | st.sampled_from(FIELD_NAMES), inner, max_size=4)
    ),
    max_leaves=12,
)


# Placeholders for the server-made ids of the tree, in generated frames.
CHILD = {"runId": "@child-run@", "conversationId": "@child-conv@"}
LEASED = {"runId": "@leased-run@", "conversationId": "@leased-conv@"}


class FuzzSocket:
    """One registered runner with a tree to aim at: a root run, a child, a leased child."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.sentinels = itertools.count(1)
        self.rebuilds = 0
        self._build()

    def _build(self):
        _runner, token = tokens.create_runner("runner-a")
        self.client: RpcClient = self.run(self._connect(token))
        self.child, self.leased = self.run(self._populate())
        self.ids = {
            CHILD["runId"]: self.child["runId"],
            CHILD["conversationId"]: self.child["conversationId"],
            LEASED["runId"]: self.leased["runId"],
            LEASED["conversationId"]: self.leased["conversationId"],
        }
        self.baseline = observable_state()

    def fresh(self):
        """The built tree, as it was after building it: rebuilt if an example changed it."""
        if not self.client.ws.future.done() and observable_state() == self.baseline:
            return
        self.rebuilds += 1
        self._close_client()
        tables = [model._meta.db_table for model in apps.get_app_config("delegation").get_models()]
        connection.ops.execute_sql_flush(
            connection.ops.sql_flush(no_style(), tables, allow_cascade=True)
        )
        self._build()

    def resolve(self, text: str) -> str:
        for placeholder, value in self.ids.items():
            text = text.replace(placeholder, value)
        return text

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    async def _connect(self, token):
        client = RpcClient(communicator(token))
        connected, _ = await client.connect()
        assert connected
        await client.register()
        return client

    async def _populate(self):
        c = self.client
        await c.open("root-1")
        child = await c.start()
        leased = await c.start(request_id="bg", lease="L1")
        await c.emit(child["runId"], ["a", "b"])
        await c.open("deep", _meta={"pando:delegationDepth": 3})  # may not spawn (max 3)
        await c.open("done")
        await c.finish("done")
        await c.wait_command("child.execute")
        return child, leased

    def identifiers(self) -> list:
        """Values that mean something on this runner, to swap into valid frames."""
        child, leased = CHILD, LEASED
        return [
            "root-1",
            "deep",
            "done",
            "ghost",
            child["runId"],
            child["conversationId"],
            leased["runId"],
            leased["conversationId"],
            "conv-root-1",
            "L1",
            "L9",
            "ext",
            "ext2",
            "worker",
            "reviewer",
            "req-1",
            "bg",
            "s",
            1,
            2,
            3,
            0,
        ]

    def templates(self) -> list[dict]:
        c, child, leased = self.client, CHILD, LEASED
        return [
            {"method": "run.open", "params": {"conversationId": "conv-new", "runId": "run-new"}},
            {
                "method": "run.event",
                "params": {
                    "runId": child["runId"],
                    "from": 3,
                    "events": [{"kind": "text", "text": "c"}],
                },
            },
            {"method": "run.finish", "params": {"runId": "run-new", "output": "o"}},
            {"method": "tool.end", "params": {"runId": "root-1", "toolCallId": "call-9"}},
            {
                "method": "child.start",
                "params": c.start_params(request_id="fz", options={"maxTokens": 5}),
            },
            {"method": "child.start", "params": c.start_params(request_id="fz-l", lease="L1")},
            {"method": "child.start", "params": c.start_params("deep", request_id="fz-d")},
            {"method": "child.start", "params": c.start_params(request_id="fz-r", resume="ghost")},
            {"method": "child.read", "params": c.on_child(child, after=1)},
            {"method": "child.read", "params": c.on_child(leased, None, leaseId="L1")},
            {"method": "child.cancel", "params": c.on_child(child, childRunId=child["runId"])},
            {"method": "child.steer", "params": c.on_child(child, message="m", requestId="s")},
            {
                "method": "child.lease.release",
                "params": {"leaseId": "L9", "extensionId": "ext", "generation": 1},
            },
            {
                "method": "runner.register",
                "params": {
                    "hostInstanceId": "host-1",
                    "extensions": [
                        {
                            "extensionId": "ext",
                            "generation": 1,
                            "presets": [
                                {"name": "worker", "systemPrompt": "You work."},
                                {"name": "reviewer", "options": {"maxTokens": 1000}},
                            ],
                        }
                    ],
                },
            },
        ]

    def exchange(self, send, late_id=None) -> tuple[list[dict], dict]:
        """Send one fuzzed frame, then a sentinel; return the frames before the sentinel's answer.

        ``child.lease.release`` may answer after later frames (it waits for the lease's children
        aside): with ``late_id``, reading goes on until that answer has arrived too.
        """
        sentinel = f"sentinel-{next(self.sentinels)}"

        async def go():
            await send(self.client.ws, self.resolve)
            await self.client.send_raw(
                json.dumps({"jsonrpc": "2.0", "id": sentinel, "method": "fuzz.ping"})
            )
            frames, answer = [], None
            while True:
                frame = await self.client.receive(timeout=20)
                if "method" in frame:
                    await self.client._note_command(frame)
                    continue
                if frame.get("id") == sentinel:
                    answer = frame
                else:
                    frames.append(frame)
                late_pending = late_id is not None and not any(
                    f.get("id") in (late_id, None) for f in frames
                )
                if answer is not None and not late_pending:
                    return frames, answer

        return self.run(go())

    def _close_client(self):
        # A socket the server closed has a finished application: nothing left to close.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            self.run(self.client.close())

    def close(self):
        try:
            self._close_client()
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()


@pytest.fixture
def fuzz(transactional_db):
    socket = FuzzSocket()
    yield socket
    socket.close()


def check_exchange(fuzz: FuzzSocket, send, rpc_id=..., is_notification=False, late=False):
    """The shared property: a SPEC answer, a live consumer, and no change when refused."""
    fuzz.fresh()
    before = observable_state()
    frames, sentinel = fuzz.exchange(send, late_id=rpc_id if late else None)
    # The consumer survived and still answers in order.
    assert sentinel["error"]["code"] == -32601, sentinel
    assert len(frames) <= 1, frames
    changed_allowed = False
    for frame in frames:
        assert frame.get("jsonrpc") == "2.0", frame
        assert set(frame) in ({"jsonrpc", "id", "result"}, {"jsonrpc", "id", "error"}), frame
        if rpc_id is not ...:
            assert frame["id"] in (rpc_id, None), (rpc_id, frame)
        event("result" if "result" in frame else f"error {frame['error'].get('code')}")
        if "error" in frame:
            error = frame["error"]
            assert error["code"] in SPEC_CODES, frame
            assert isinstance(error["message"], str) and error["message"].strip(), frame
            assert set(error) <= {"code", "message", "data"}, frame
            if error["code"] in (-32010, -32016):
                # The delegation-refused event; a release revokes first, then may time out
                # waiting for the children it cancelled.
                changed_allowed = True
        else:
            changed_allowed = True
    if not frames:
        event("no answer")
    if not frames and is_notification:
        changed_allowed = True  # a valid notification is applied without an answer
    if not changed_allowed:
        assert observable_state() == before


def _text_sender(text: str):
    async def send(ws, resolve):
        await ws.send_to(text_data=resolve(text))

    return send


# --- the properties -------------------------------------------------------------------------


def test_it_survives_random_text_frames(fuzz):
    @FUZZ_SETTINGS
    @given(st.text(min_size=1, max_size=300) | st.from_regex(r"\A[\[\]{}\",:0-9a-z ]{1,60}\Z"))
    def prop(text):
        check_exchange(fuzz, _text_sender(text), is_notification=True)

    prop()


def test_it_survives_random_json_values(fuzz):
    @FUZZ_SETTINGS
    @given(json_values)
    def prop(value):
        check_exchange(fuzz, _text_sender(json.dumps(value)), is_notification=True)

    prop()


def test_it_survives_random_binary_frames(fuzz):
    @settings(FUZZ_SETTINGS, max_examples=30)
    @given(st.binary(min_size=1, max_size=100))
    def prop(data):
        async def send(ws, resolve):
            await ws.send_to(bytes_data=data)

        check_exchange(fuzz, send)

    prop()


def test_it_answers_random_envelopes_with_spec_codes(fuzz):
    envelopes = st.fixed_dictionaries(
        {
            "jsonrpc": st.sampled_from(["2.0", "2.0", "2.0", "1.0", 2]),
            "id": st.integers(min_value=0, max_value=2**40) | st.text(min_size=1, max_size=10),
            "method": st.sampled_from(METHODS) | st.text(max_size=15),
        },
        optional={
            "params": st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=6)
            | json_values
        },
    )

    @FUZZ_SETTINGS
    @given(envelopes)
    def prop(frame):
        late = frame["method"] == "child.lease.release"
        check_exchange(fuzz, _text_sender(json.dumps(frame)), rpc_id=frame["id"], late=late)

    prop()


# --- mutations of valid frames ---------------------------------------------------------------


def _paths(value, prefix=()):
    """Every path to a value inside ``value`` (dict keys and list indexes)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _get(value, path):
    for step in path:
        value = value[step]
    return value


@st.composite
def mutated_frames(draw, templates, identifiers):
    template = copy.deepcopy(draw(st.sampled_from(templates)))
    rpc_id = draw(st.integers(min_value=1, max_value=10**6))
    frame = {"jsonrpc": "2.0", "id": rpc_id, **template}
    paths = [p for p in _paths(frame["params"]) if p]
    kind = draw(
        st.sampled_from(
            ["swap", "swap", "swap", "replace", "drop", "add", "case", "null", "number"]
            + ["text-dup", "text-trailing", "text-cut"]
        )
    )
    params = frame["params"]
    if kind in ("swap", "replace", "drop", "case", "null", "number") and paths:
        path = draw(st.sampled_from(paths))
        parent, last = _get(params, path[:-1]), path[-1]
        if kind == "swap":
            parent[last] = draw(st.sampled_from(identifiers))
        elif kind == "replace":
            parent[last] = draw(json_values)
        elif kind == "null":
            parent[last] = None
        elif kind == "number":
            parent[last] = draw(
                st.sampled_from([0, -1, 1.5, "1", True, 2**63, 2**64, -(2**63), 10**30])
            )
        elif kind == "drop":
            del parent[last]
        elif kind == "case" and isinstance(last, str) and last:
            parent[last.swapcase()] = parent.pop(last)
    elif kind == "add":
        containers = [p for p in _paths(params) if isinstance(_get(params, p), dict)]
        target = _get(params, draw(st.sampled_from(containers)))
        key = draw(
            st.sampled_from(["apiKey", "baseUrl", "endpoint", "systemPromptPath", "x"])
            | st.text(max_size=8)
        )
        if key not in target:
            target[key] = draw(json_values)
    text = json.dumps(frame, ensure_ascii=draw(st.booleans()))
    if kind == "text-dup" and paths:
        # Repeat the first key of params textually: a duplicate key.
        first = next(iter(params), None)
        if first is not None:
            repeated = f"{json.dumps(first)}: {json.dumps(params[first])}, "
            text = text.replace('"params": {', '"params": {' + repeated, 1)
    elif kind == "text-trailing":
        text += draw(st.sampled_from(["x", "{}", "]", ",", "\x00", " null", '{"jsonrpc":"2.0"}']))
    elif kind == "text-cut":
        text = text[: draw(st.integers(min_value=1, max_value=max(1, len(text) - 1)))]
    return rpc_id, text


def test_it_answers_mutated_valid_frames_with_spec_codes(fuzz, settings):
    settings.LEASE_RELEASE_WAIT_SECONDS = 0.1  # a valid release of L1 would wait for bg
    templates = fuzz.templates()

    @MUTATION_SETTINGS
    @given(mutated_frames(templates, fuzz.identifiers()))
    def prop(case):
        rpc_id, text = case
        late = '"child.lease.release"' in text
        check_exchange(fuzz, _text_sender(text), rpc_id=rpc_id, late=late)

    prop()


def test_it_never_stores_an_unknown_field_anywhere_in_a_child_start(fuzz):
    """Credential-free requests: an unknown field at any level is refused, nothing stored."""
    base = fuzz.client.start_params(
        request_id="cf", options={"maxTokens": 5, "allowedTools": ["read"]}, systemPrompt="p"
    )
    containers = [p for p in _paths(base) if isinstance(_get(base, p), dict)]

    @FUZZ_SETTINGS
    @given(
        st.sampled_from(containers),
        st.sampled_from(
            ["apiKey", "baseUrl", "endpoint", "provider", "token", "RequestId", "runid"]
        )
        | st.text(min_size=1, max_size=10),
        json_values,
    )
    def prop(path, key, value):
        params = copy.deepcopy(base)
        target = _get(params, path)
        if key in target:
            return
        target[key] = value
        frame = {"jsonrpc": "2.0", "id": 42, "method": "child.start", "params": params}
        fuzz.fresh()
        before = observable_state()
        frames, _ = fuzz.exchange(_text_sender(json.dumps(frame)))
        assert len(frames) == 1 and frames[0]["error"]["code"] == -32602, frames
        assert observable_state() == before

    prop()

"""Shared fixtures: personas, runner tokens, and a JSON-RPC runner over a real WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os

import hypothesis
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from delegation.services import tokens
from tests.live_server import _module_daphne  # noqa: F401  (fixture behind daphne_server)
from tests.personas import (  # noqa: F401  (fixtures)
    admin,
    operator,
    operator_token,
    outsider,
    people,
    viewer,
)

# `.ci/run` sets this: a skipped test is a test that did not run, so in CI it fails, except a
# test marked ``postgres`` on a pass without the backends it names (the SQLite pass).
NO_SKIPS = "CANOPY_NO_SKIPS"


def on_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def missing_backends(item) -> str | None:
    """Why ``item`` cannot run here, if it is marked ``postgres`` and a backend is missing."""
    marker = item.get_closest_marker("postgres")
    if marker is None:
        return None
    if not on_postgres():
        return "needs PostgreSQL: set DATABASE_URL=postgres://... (.ci/run's second pass does)"
    if marker.kwargs.get("redis") and not settings.REDIS_URL:
        return "needs PostgreSQL and Redis: set REDIS_URL too (.ci/run's second pass does)"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = missing_backends(item)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def _skip_forbidden(report, item=None) -> bool:
    if not os.environ.get(NO_SKIPS) or not report.skipped or hasattr(report, "wasxfail"):
        return False
    return item is None or missing_backends(item) is None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _skip_forbidden(report, item):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under {NO_SKIPS} (every test must run here): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A module skipped as a whole (importorskip, allow_module_level) is caught here.
    outcome = yield
    report = outcome.get_result()
    if _skip_forbidden(report):
        report.outcome = "failed"
        report.longrepr = f"module skipped under {NO_SKIPS}: {report.longrepr}"


@pytest.fixture(scope="session", autouse=True)
def _drop_leftover_sessions(request, django_db_blocker):
    """Before the PostgreSQL test database is dropped, end every other session on it: one
    left open (a test thread's connection, a server killed mid-request) would keep it from
    being dropped, and with a per-process name nothing would ever drop it."""
    if not on_postgres():
        yield
        return
    request.getfixturevalue("django_db_setup")  # torn down after this fixture
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True)
def _no_name_lookups_off_the_machine(monkeypatch):
    """Webhook targets are resolved when saved and before every send. In the suite no name
    leaves the machine: IP literals and localhost resolve for real, any other name does not
    resolve (a test that needs one patches ``alerts.resolve_host`` itself)."""
    from delegation.services import alerts

    monkeypatch.setattr(alerts, "resolve_host", local_names_only(alerts.resolve_host))


def local_names_only(resolve):
    import ipaddress
    import socket

    def resolve_locally(host: str, port: int) -> list[str]:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if host != "localhost":
                raise socket.gaierror(
                    socket.EAI_NONAME, f"{host}: not looked up in tests"
                ) from None
        return resolve(host, port)

    return resolve_locally


# Hypothesis: "dev" (the default) explores fresh examples each run; "ci" (HYPOTHESIS_PROFILE=ci,
# set by .ci/run) is derandomised, so a CI failure reproduces on any machine, and prints the
# blob that replays the failing example (@reproduce_failure).
hypothesis.settings.register_profile("dev", print_blob=True)
hypothesis.settings.register_profile("ci", derandomize=True, print_blob=True, database=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "own_server: the test restarts its server, so it gets one of its own"
    )
    config.addinivalue_line(
        "markers",
        "postgres(redis=False): needs PostgreSQL (and Redis with redis=True); skipped, and "
        "reported, on the SQLite pass, and the only skip CANOPY_NO_SKIPS allows",
    )
    # The in-process sweep would race the tests' own explicit sweeps and DB teardown.
    settings.UPKEEP_IN_PROCESS = False
    if on_postgres():
        # The process id in the name: two runs on one server (CI, several checkouts) never
        # create, use or drop each other's test database.
        test = settings.DATABASES["default"].setdefault("TEST", {})
        test["NAME"] = f"{test.get('NAME') or 'canopy_test'}_{os.getpid()}"
    # Persistent connections held by async-to-sync worker threads would block dropping the
    # PostgreSQL test database at the end of the session.
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0


# SPEC §6 Result, written out from the SPEC rather than taken from the code under test.
RESULT_KEYS = frozenset(
    {
        "runnerId",
        "hostInstanceId",
        "conversationId",
        "runId",
        "parentConversationId",
        "parentRunId",
        "extensionId",
        "profile",
        "done",
        "cancelled",
        "error",
        "output",
        "events",
        "depth",
        "status",
    }
)


class RpcClient:
    """A runner speaking JSON-RPC over a real WebSocket into the ASGI application."""

    def __init__(self, communicator: WebsocketCommunicator):
        self.ws = communicator
        self.ids = itertools.count(1)
        self.commands: list[dict] = []  # server-to-runner requests seen so far
        self.answer_commands = True
        # Responses that arrived while waiting for another id (e.g. a pending release).
        self.stash: dict = {}

    async def connect(self):
        connected, code = await self.ws.connect(timeout=10)
        return connected, code

    async def send_raw(self, text: str):
        await self.ws.send_to(text_data=text)

    async def receive(self, timeout: float = 10) -> dict:
        return json.loads(await self.ws.receive_from(timeout=timeout))

    async def _note_command(self, frame: dict):
        self.commands.append(frame)
        if self.answer_commands:
            result = {"outcome": "injected"} if frame["method"] == "run.steer" else {}
            await self.ws.send_to(
                text_data=json.dumps({"jsonrpc": "2.0", "id": frame["id"], "result": result})
            )

    async def reply_to(self, rpc_id, timeout: float = 10) -> dict:
        """The next response with ``rpc_id``, recording server commands on the way.

        Responses to other (non-null) ids are kept in ``stash`` for a later ``reply_to``.
        """
        if rpc_id is not None and rpc_id in self.stash:
            return self.stash.pop(rpc_id)
        while True:
            frame = await self.receive(timeout)
            if "method" in frame:
                await self._note_command(frame)
                continue
            if frame.get("id") == rpc_id:
                return frame
            if frame.get("id") is not None:
                self.stash[frame["id"]] = frame

    async def next_response(self, timeout: float = 10) -> dict:
        """The next response of any id (commands on the way are handled as usual)."""
        while True:
            frame = await self.receive(timeout)
            if "method" in frame:
                await self._note_command(frame)
                continue
            return frame

    async def raw_call(self, text: str, rpc_id) -> dict:
        await self.send_raw(text)
        return await self.reply_to(rpc_id)

    async def call(self, method: str, params=None, **kw) -> dict:
        rpc_id = next(self.ids)
        frame = {"jsonrpc": "2.0", "id": rpc_id, "method": method}
        if params is not None:
            frame["params"] = params
        await self.send_raw(json.dumps(frame))
        return await self.reply_to(rpc_id, **kw)

    async def ok(self, method: str, params=None) -> dict:
        frame = await self.call(method, params)
        assert "result" in frame, frame
        return frame["result"]

    async def error(self, method: str, params=None) -> dict:
        frame = await self.call(method, params)
        assert "error" in frame, frame
        return frame["error"]

    async def wait_command(self, method: str, timeout: float = 5, **match) -> dict:
        """Wait until the server has sent a command of ``method`` whose params match."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for frame in self.commands:
                params = frame["params"]
                if frame["method"] == method and all(params.get(k) == v for k, v in match.items()):
                    return frame
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no {method} {match} in {self.commands}")
            try:
                frame = await self.receive(timeout=remaining)
            except TimeoutError:
                continue
            if "method" in frame:
                await self._note_command(frame)

    async def send(self, method: str, params=None, rpc_id=None):
        """Send a request without waiting; returns its id (answer it with ``reply_to``)."""
        rpc_id = next(self.ids) if rpc_id is None else rpc_id
        frame = {"jsonrpc": "2.0", "id": rpc_id, "method": method}
        if params is not None:
            frame["params"] = params
        await self.send_raw(json.dumps(frame))
        return rpc_id

    async def notify(self, method: str, params=None):
        """A JSON-RPC notification: no id, so the server never answers it."""
        frame = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            frame["params"] = params
        await self.send_raw(json.dumps(frame))

    async def closed_with(self, timeout: float = 5) -> int | None:
        """Read until the server closes the socket; returns the close code.

        Text frames met on the way are recorded (commands) or stashed (responses).
        """
        while True:
            output = await self.ws.receive_output(timeout)
            if output["type"] == "websocket.close":
                return output.get("code")
            if output["type"] == "websocket.send" and output.get("text"):
                frame = json.loads(output["text"])
                if "method" in frame:
                    self.commands.append(frame)
                elif frame.get("id") is not None:
                    self.stash[frame["id"]] = frame
                else:
                    self.stash.setdefault("__null__", []).append(frame)

    async def quiet(self, seconds: float = 0.3) -> list[dict]:
        """Text frames the server sends within ``seconds``.

        Commands among them are handled as usual (recorded, answered if ``answer_commands``);
        responses are also stashed. Unlike ``receive_from``, waiting here never cancels the
        application when nothing arrives.
        """
        frames = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            if self.ws.future.done():
                self.ws.future.result()  # surface a crashed consumer
            if self.ws.output_queue.empty():
                if loop.time() >= deadline:
                    return frames
                await asyncio.sleep(0.01)
                continue
            output = self.ws.output_queue.get_nowait()
            if output["type"] != "websocket.send" or not output.get("text"):
                frames.append(output)
                continue
            frame = json.loads(output["text"])
            frames.append(frame)
            if "method" in frame:
                await self._note_command(frame)
            elif frame.get("id") is not None:
                self.stash[frame["id"]] = frame

    async def until_answered(self, timeout: float = 10) -> None:
        """Handle server commands until every stored command has its answer recorded."""
        from delegation.models import Command

        pending = adb(Command.objects.filter(answered_at__isnull=True).exists)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await pending():
            if loop.time() >= deadline:
                raise AssertionError(f"commands still unanswered after {timeout} s")
            await self.quiet(0.05)

    def commands_of(self, method: str, **match) -> list[dict]:
        return [
            frame
            for frame in self.commands
            if frame["method"] == method
            and all(frame["params"].get(k) == v for k, v in match.items())
        ]

    async def close(self):
        await self.ws.disconnect()

    # --- conveniences ---------------------------------------------------------------------

    async def register(self, extensions=None, host="host-1", workspace=None) -> dict:
        params = {"hostInstanceId": host, "extensions": extensions or [DEFAULT_EXTENSION]}
        if workspace is not None:
            params["workspace"] = workspace
        return await self.ok("runner.register", params)

    async def open(self, run_id="root-1", conversation_id=None, **extra) -> dict:
        params = {"conversationId": conversation_id or f"conv-{run_id}", "runId": run_id}
        params.update(extra)
        return await self.ok("run.open", params)

    def child_params(self, run_id="root-1", request_id="req-1", profile="worker", **req):
        request = {"requestId": request_id, "profile": profile, "message": "do the thing"}
        request.update(req)
        return {"runId": run_id, "extensionId": "ext", "generation": 1, "request": request}

    def start_params(
        self,
        run_id="root-1",
        request_id="req-1",
        profile="worker",
        *,
        lease=None,
        tool_call=None,
        **req,
    ) -> dict:
        """child_params, with ``lease`` set on both Params and Request, and ``toolCallId``."""
        params = self.child_params(run_id, request_id, profile, **req)
        if lease is not None:
            params["leaseId"] = lease
            params["request"]["leaseId"] = lease
        if tool_call is not None:
            params["toolCallId"] = tool_call
        if run_id is None:
            del params["runId"]
        return params

    async def start(self, run_id="root-1", request_id="req-1", profile="worker", **kw) -> dict:
        """child.start that must succeed; returns the child's Result."""
        return await self.ok("child.start", self.start_params(run_id, request_id, profile, **kw))

    async def emit(self, run_id: str, events: list, start: int = 1) -> dict:
        """run.event that must succeed: ``events`` may be kinds (str) or Event objects."""
        events = [{"kind": "text", "text": e} if isinstance(e, str) else e for e in events]
        return await self.ok("run.event", {"runId": run_id, "from": start, "events": events})

    async def finish(self, run_id: str, **fields) -> dict:
        return await self.ok("run.finish", {"runId": run_id, **fields})

    @staticmethod
    def on_child(child, run_id="root-1", **fields) -> dict:
        """Params addressing ``child`` (a Result or a childId) from ``run_id``."""
        child_id = child["conversationId"] if isinstance(child, dict) else child
        params = {"extensionId": "ext", "generation": 1, "childId": child_id}
        if run_id is not None:
            params["runId"] = run_id
        params.update(fields)
        return params

    async def read(self, child, run_id="root-1", **fields) -> dict:
        return await self.ok("child.read", self.on_child(child, run_id, **fields))


DEFAULT_EXTENSION = {
    "extensionId": "ext",
    "generation": 1,
    "presets": [
        {"name": "worker", "systemPrompt": "You work."},
        {"name": "reviewer", "options": {"maxTokens": 1000, "allowedTools": ["read", "grep"]}},
    ],
}


def application():
    from canopy.asgi import application as app

    return app


def communicator(token: str | None, depth: str | None = None) -> WebsocketCommunicator:
    headers = []
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if depth is not None:
        headers.append((b"x-pando-delegation-depth", depth.encode()))
    return WebsocketCommunicator(application(), "/ws/runner/", headers=headers)


@pytest.fixture
def runner_token(db):
    _runner, token = tokens.create_runner("runner-a")
    return token


@pytest.fixture
async def make_client(db):
    """Open runner connections; each is closed at the end of the test.

    Depends on ``db`` so the sockets close (and their consumers finish) before the database
    is flushed: a consumer still locking rows would deadlock PostgreSQL's TRUNCATE.
    """
    opened: list[RpcClient] = []

    async def make(token: str | None, depth: str | None = None, register=True, **kw):
        client = RpcClient(communicator(token, depth))
        connected, _ = await client.connect()
        assert connected
        opened.append(client)
        if register and token is not None:
            await client.register(**kw)
        return client

    yield make
    for client in opened:
        # A socket the server already closed (fenced, refused) has a finished, maybe
        # cancelled, application task: nothing left to close.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await client.close()


@pytest.fixture
async def runner(runner_token, make_client):
    return await make_client(runner_token)


async def create_runner_async(name: str) -> str:
    _runner, token = await database_sync_to_async(tokens.create_runner)(name)
    return token


# --- Stored-state helpers for conformance tests ------------------------------------------

adb = database_sync_to_async


def observable_state() -> dict:
    """Everything a later read could observe, to prove a refused frame changed nothing."""
    from delegation import models as m

    return {
        "counts": {
            model.__name__: model.objects.count()
            for model in (
                m.Runner,
                m.ExtensionPreset,
                m.Lease,
                m.Session,
                m.Run,
                m.Event,
                m.SteerReceipt,
                m.Command,
                m.AuditEntry,
            )
        },
        "runners": list(
            m.Runner.objects.order_by("pk").values_list(
                "name", "connection_generation", "host_instance_id", "workspace", "revoked_at"
            )
        ),
        "presets": sorted(
            (p.runner_id, p.extension_id, p.generation, p.name, repr(p.options), p.system_prompt)
            for p in m.ExtensionPreset.objects.all()
        ),
        "runs": list(
            m.Run.objects.order_by("pk").values_list(
                "run_id",
                "status",
                "done",
                "cancelled",
                "error",
                "output",
                "last_sequence",
                "emitted",
                "cancel_requested_at",
            )
        ),
        "leases": list(
            m.Lease.objects.order_by("pk").values_list("lease_id", "state", "expires_at")
        ),
        # Which commands exist; when the runner answers them is its business (the test
        # client answers asynchronously), so answered_at is left out.
        "commands": list(m.Command.objects.order_by("pk").values_list("pk", "method")),
    }


async def state() -> dict:
    return await adb(observable_state)()


def _short(value, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)"


async def assert_all_refused(client: RpcClient, method: str, cases, code: int) -> None:
    """Each ``(params, field)`` case must be refused with ``code`` naming ``field`` (if not None)
    and leave the observable state unchanged. All cases run; every mismatch is reported."""
    problems = []
    for params, field in cases:
        before = await state()
        frame = await client.call(method, params)
        error = frame.get("error")
        if error is None or error.get("code") != code:
            problems.append(f"{_short(params)} -> {_short(frame, 400)} (wanted {code})")
        elif field is not None and field not in error.get("message", ""):
            problems.append(f"{_short(params)} -> message {error.get('message')!r} lacks {field!r}")
        elif await state() != before:
            problems.append(f"{_short(params)} -> refused but changed the stored state")
    assert not problems, "\n".join(problems)


async def assert_all_raw_refused(client: RpcClient, texts, code: int) -> None:
    """Raw frames that must each be answered with ``code`` (whatever id) and change nothing."""
    problems = []
    for text in texts:
        before = await state()
        await client.send_raw(text)
        frame = await client.next_response()
        error = frame.get("error")
        if error is None or error.get("code") != code:
            problems.append(f"{_short(text)} -> {_short(frame, 400)} (wanted {code})")
        elif await state() != before:
            problems.append(f"{_short(text)} -> refused but changed the stored state")
    assert not problems, "\n".join(problems)

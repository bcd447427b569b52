"""A runner speaking JSON-RPC over a real WebSocket into the ASGI application (SPEC §5, §6).

``RpcClient`` is the test side of the runner socket: calls, notifications, the server's
commands recorded (and answered) on the way, and conveniences for the common frames. The
``runner`` and ``make_client`` fixtures (``tests.support.fixtures``) hand out connected ones.
"""

from __future__ import annotations

import asyncio
import itertools
import json

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from delegation.services import tokens

adb = database_sync_to_async


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
        "conclusion",
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


# The default presets, each able to fork (SPEC §14: canFork on registration).
FORKING_EXTENSION = {
    **DEFAULT_EXTENSION,
    "presets": [{**p, "canFork": True} for p in DEFAULT_EXTENSION["presets"]],
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


async def create_runner_async(name: str) -> str:
    _runner, token = await adb(tokens.create_runner)(name)
    return token

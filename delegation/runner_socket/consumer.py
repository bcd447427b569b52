"""The runner WebSocket (SPEC §5): JSON-RPC 2.0 frames in, service calls, answers out.

Thin on purpose: it authenticates the handshake, checks each frame's envelope once
(``envelope``), dispatches each method to ``methods`` (which validates params and calls the
typed services) and sends
server-to-runner commands from the outbox. Frames are handled one at a time in arrival order,
which is what makes ``run.event`` numbering meaningful; only the wait of
``child.lease.release`` runs aside, because the children it waits for finish through frames
on this very connection. Every ``run.event`` frame (with those already waiting behind it, or
alone as a group of one) goes to the process's group commit (``frame_groups``) and is still
answered one by one, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from delegation import depth as depthlib
from delegation import layers, metrics, notify, upkeep
from delegation.errors import (
    INTERNAL_ERROR,
    NOT_REGISTERED,
    STALE_CONNECTION,
    RpcError,
)
from delegation.protocol import CLOSE_FENCED, CLOSE_UNAUTHORIZED, bearer_token
from delegation.runner_socket import envelope, fences, keepalive, methods
from delegation.runner_socket.database_calls import claim, collecting, on_database
from delegation.runner_socket.frame_groups import frame_groups
from delegation.runner_socket.pressure import frame_pressure
from delegation.services import answers, outbox, run_actions, runners, tokens
from delegation.wire import dumps

log = logging.getLogger(__name__)


def _header(scope, name: str) -> str | None:
    wanted = name.lower().encode("latin-1")
    for key, value in scope.get("headers", []):
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


def _base_url(scope) -> str:
    """The server as this socket reached it: what an agent on the runner's side can reach."""
    scheme = "https" if scope.get("scheme") == "wss" else "http"
    host = _header(scope, "host")
    if not host:
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"{server[0]}:{server[1]}"
    return f"{scheme}://{host}"


class RunnerSocketConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        upkeep.ensure_started()
        self.inbox: deque[str | None] = deque()
        self.popped = 0  # frames taken from the inbox for the frame in hand (pressure)
        self.frame_loop: asyncio.Task | None = None
        self.conn = None
        self.runner_group = None
        self.fenced = False
        self.outbox_lock = asyncio.Lock()
        self.background: set[asyncio.Task] = set()
        runner = await on_database(tokens.authenticate_runner)(
            bearer_token(self.scope.get("headers", []))
        )
        await self.accept()
        if runner is None:
            metrics.refused(CLOSE_UNAUTHORIZED)
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.conn = runners.Connection(
            runner_pk=runner.pk,
            declared_depth=depthlib.parse(_header(self.scope, depthlib.HEADER) or ""),
            channel_name=self.channel_name,
            base_url=_base_url(self.scope),
            credential=runner.token_hash,
        )
        # Joined before runner.register, so a revocation reaches this socket even then.
        self.runner_group = notify.runner_group(runner.pk)
        await self.channel_layer.group_add(self.runner_group, self.channel_name)
        if keepalive.per_process():
            keepalive.watch(self)
        else:
            self._spawn(keepalive.per_socket(self))

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, layers.from_socket(receive), send)
        finally:
            # Whatever ended the consumer (a close, a crash, a cancelled task), nothing it
            # started may outlive it: a leftover poll would keep a dead runner "seen".
            await self._shut_down()

    async def dispatch(self, message):
        """An unexpected error closes a handshake; a frame's answers -32603 (``_take_frames``).

        channels' own dispatch first hops to the database thread to close obsolete
        connections, once a message; every database call here goes through
        database_sync_to_async, which does that around the call itself, so the hop (half
        the thread switches of a run.event) is left out."""
        if layers.forged_socket_message(message):
            log.warning(
                "runner socket: dropped a %s sent through the channel layer", message["type"]
            )
            return
        try:
            handler = getattr(self, get_handler_name(message), None)
            if handler is None:
                raise ValueError(f"no handler for message type {message['type']}")
            await handler(message)
        except (StopConsumer, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("runner socket: %s failed", message.get("type"))
            if message.get("type") == "websocket.receive":
                await self._reply_error(None, RpcError(INTERNAL_ERROR, "internal error"))
            elif message.get("type") == "websocket.connect":
                await self.close(code=1011)

    async def disconnect(self, code):
        # Frames that arrived before the close are still handled, in order, as they were when
        # channels queued them ahead of the disconnect.
        if self.frame_loop is not None and not self.frame_loop.done():
            await asyncio.wait([self.frame_loop])
        await self._shut_down()

    async def _shut_down(self):
        if getattr(self, "_shut", False):
            return
        self._shut = True
        fences.forget(self)
        keepalive.forget(self)
        for task in [*getattr(self, "background", ()), getattr(self, "frame_loop", None)]:
            if task is not None:
                task.cancel()
        if getattr(self, "runner_group", None):
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(self.runner_group, self.channel_name)
        conn = getattr(self, "conn", None)
        if conn is not None and conn.generation:
            try:
                await self._call(runners.runner_disconnected, conn)
            except Exception:
                # The silent-runner sweep still starts its grace period from last_seen_at.
                log.warning("could not record runner %s disconnect", conn.runner_pk, exc_info=True)
        inbox = getattr(self, "inbox", None)
        if inbox:  # frames the socket took and will never answer
            frame_pressure().dropped(len(inbox))
            inbox.clear()

    # --- frames in ----------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None):
        if self.conn is None:
            return
        # Frames wait their turn in the inbox: the frame loop takes them in arrival order,
        # so the frames that arrive meanwhile are there for a group commit to take. A
        # saturated process answers a run.event at once instead (``pressure``).
        pressure = frame_pressure()
        if pressure.saturated() and await self._refused_busy(text_data, pressure):
            return
        pressure.took()
        self.inbox.append(text_data)
        if self.frame_loop is None or self.frame_loop.done():
            self.frame_loop = asyncio.ensure_future(self._take_frames())

    async def _take_frames(self):
        pressure = frame_pressure()
        while self.inbox:
            text_data = self._pop()
            try:
                await self._on_frame(text_data)
            except Exception:
                log.exception("runner socket: a frame failed")
                await self._reply_error(None, RpcError(INTERNAL_ERROR, "internal error"))
            finally:
                pressure.answered(self.popped)
                self.popped = 0

    def _pop(self) -> str | None:
        self.popped += 1
        return self.inbox.popleft()

    async def _refused_busy(self, text_data: str | None, pressure) -> bool:
        """Whether the frame is a run.event request this saturated process answered at once
        with a retry delay; anything else waits its turn."""
        if not self.conn.generation or self.fenced:
            return False
        frame = envelope.read(text_data, fenced=False, methods=methods.METHODS)
        if not (
            isinstance(frame, envelope.Request)
            and frame.method == "run.event"
            and frame.has_id
            and frame.params_error is None
        ):
            return False
        await self._reply_error(frame.rpc_id, pressure.busy())
        return True

    async def _on_frame(self, text_data: str | None):
        frame = envelope.read(text_data, fenced=self.fenced, methods=methods.METHODS)
        if isinstance(frame, envelope.Refusal):
            await self._reply_error(frame.rpc_id, frame.error)
        elif isinstance(frame, envelope.Answer):
            await self._on_answer(frame)
        elif isinstance(frame, envelope.Request):
            await self._on_request(frame)

    async def _on_request(self, request: envelope.Request):
        rpc_id, has_id, method = request.rpc_id, request.has_id, request.method
        if method == "run.event" and request.params_error is None and self.conn.generation:
            # Every run.event goes the one way: a group commit, of one if need be.
            await self._append_group(self._run_events_waiting(request))
            return
        commands: list = []
        try:
            if request.params_error is not None:
                raise request.params_error
            if method == "runner.register":
                result = await self._register(request.params)
            elif not self.conn.generation:
                raise RpcError(
                    NOT_REGISTERED, "not registered: the first call must be runner.register"
                )
            elif method == "child.lease.release":
                await self._release(rpc_id, request.params)
                return
            else:
                result, commands = await self._run(
                    methods.HANDLERS[method], self.conn, request.params, claim=True
                )
        except RpcError as exc:
            await self._reply_error(rpc_id if has_id else None, exc, notify_only=not has_id)
            if exc.code == STALE_CONNECTION:
                self.fenced = True
                await self.close(code=CLOSE_FENCED)
            return
        except Exception:
            log.exception("runner method %s failed", method)
            await self._reply_error(rpc_id, RpcError(INTERNAL_ERROR, "internal error"))
            return
        if has_id:
            await self._send({"jsonrpc": "2.0", "id": rpc_id, "result": result})
        # What the call queued for this runner goes out on this socket at once, after the
        # answer: never on the doorbell or the poll, and never as a second answer.
        await self._send_commands(commands)

    def _run_events_waiting(self, first: envelope.Request) -> list[envelope.Request]:
        """This ``run.event`` and the ones right behind it in the inbox (at most
        RUN_EVENT_GROUP_MAX); a frame that is anything else stays for its own turn."""
        group = [first]
        limit = settings.RUN_EVENT_GROUP_MAX
        while self.inbox and len(group) < limit:
            frame = envelope.read(self.inbox[0], fenced=self.fenced, methods=methods.METHODS)
            if not (
                isinstance(frame, envelope.Request)
                and frame.method == "run.event"
                and frame.params_error is None
            ):
                break
            self._pop()
            group.append(frame)
        return group

    async def _append_group(self, requests: list[envelope.Request]):
        # Committed with what other sockets of this process hand in meanwhile (frame_groups).
        try:
            outcomes, commands = await frame_groups().append(
                self.conn, [request.params for request in requests]
            )
        except Exception:
            log.exception("runner socket: a group of %d run.event frames failed", len(requests))
            outcomes, commands = [RpcError(INTERNAL_ERROR, "internal error")] * len(requests), []
        for request, outcome in zip(requests, outcomes, strict=True):
            if isinstance(outcome, RpcError):
                await self._reply_error(request.rpc_id, outcome, notify_only=not request.has_id)
                self.fenced = self.fenced or outcome.code == STALE_CONNECTION
            elif request.has_id:
                await self._send({"jsonrpc": "2.0", "id": request.rpc_id, "result": outcome})
        if self.fenced:
            await self.close(code=CLOSE_FENCED)
            return
        await self._send_commands(commands)

    async def _call(self, function, *args):
        result, _commands = await self._run(function, *args)
        return result

    async def _run(self, function, *args, claim: bool = False):
        """Run a service function on a database thread, then ring its doorbells here; with
        ``claim``, also answers the commands it queued for this runner, claimed there.

        On PostgreSQL each call takes any free thread of the pool (and that thread's own
        connection), so one runner's commit does not wait behind another's; a socket's own
        frames still run one after another, in order, as the consumer awaits each. SQLite has
        one writer: its calls share one thread, as channels does by default."""
        result, error, bells, commands = await on_database(collecting)(
            function, *args, claim_for=self.conn if claim else None
        )
        if bells:
            await notify.ring_collected(bells)
        if error is not None:
            raise error
        return result, commands

    async def _register(self, params):
        result, generation, fenced = await self._call(methods.register, self.conn, params)
        self.conn = runners.Connection(
            runner_pk=self.conn.runner_pk,
            generation=generation,
            declared_depth=self.conn.declared_depth,
            channel_name=self.channel_name,
            base_url=self.conn.base_url,
            credential=self.conn.credential,
        )
        if fenced:
            await self.channel_layer.send(fenced, {"type": "runner.fenced"})
        fences.watch(self)
        # Answer first, then redeliver what the runner has not acknowledged.
        self._spawn(self._flush_outbox())
        return result

    async def _release(self, rpc_id, params):
        (lease_pk, pending), commands = await self._run(
            methods.child_lease_release, self.conn, params, claim=True
        )
        await self._send_commands(commands)
        if not pending:
            await self._send({"jsonrpc": "2.0", "id": rpc_id, "result": {"done": True}})
            return
        # Aside from the frame loop: the children finish through frames on this socket.
        self._spawn(self._await_release(rpc_id, lease_pk))

    async def _await_release(self, rpc_id, lease_pk):
        try:
            result = await run_actions.await_release(lease_pk)
        except RpcError as error:
            await self._reply_error(rpc_id, error)
            return
        await self._send({"jsonrpc": "2.0", "id": rpc_id, "result": result})

    async def _on_answer(self, answer: envelope.Answer):
        if not self.conn.generation or self.fenced:
            return
        await self._call(
            answers.command_answered, self.conn, answer.command_pk, answer.result, answer.error
        )

    # --- frames out ---------------------------------------------------------------------

    async def _send(self, message: dict):
        with contextlib.suppress(Exception):
            await self.send(text_data=dumps(message))

    async def _reply_error(self, rpc_id, error: RpcError, notify_only: bool = False):
        metrics.refused(error.code)
        if notify_only:
            return
        await self._send({"jsonrpc": "2.0", "id": rpc_id, "error": error.wire()})

    async def _send_claimed(self, commands: list):
        """Claimed commands as requests, in claim order (the lock keeps two senders' batches
        from interleaving)."""
        async with self.outbox_lock:
            for command in commands:
                await self._send(
                    {
                        "jsonrpc": "2.0",
                        "id": command.rpc_id,
                        "method": command.method,
                        "params": command.wire_params(),
                    }
                )

    async def _send_commands(self, commands: list):
        if not commands:
            return
        await self._send_claimed(commands)
        if len(commands) >= outbox.CLAIM_LIMIT:
            await self._flush_outbox()  # more were waiting than one claim takes

    async def _flush_outbox(self):
        """Send every unsent command; a failure is logged, never answered (the next doorbell
        or poll tries again)."""
        if self.conn is None or not self.conn.generation or self.fenced:
            return
        while True:
            commands = await on_database(claim)(self.conn)
            await self._send_claimed(commands)
            if len(commands) < outbox.CLAIM_LIMIT:
                return

    def _spawn(self, coroutine):
        task = asyncio.ensure_future(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # --- channel layer messages ---------------------------------------------------------

    async def outbox_ring(self, message):
        await self._flush_outbox()

    async def runner_fenced(self, message):
        """A doorbell, never an authority (SPEC §13): the record says whether to close."""
        await fences.recheck(self)

    async def runner_revoked(self, message):
        """The runner's credential was revoked or rotated (``runners.fence_runner``), if the
        record agrees: anyone who can write to Redis could have sent this."""
        await fences.recheck(self)

    async def close_fenced(self):
        """Another socket registered as this runner (``fences`` read it)."""
        self.fenced = True
        await self.close(code=CLOSE_FENCED)

    async def close_revoked(self):
        """The runner's credential was revoked or rotated (``fences`` read it)."""
        self.fenced = True
        for task in list(self.background):
            task.cancel()
        await self.close(code=CLOSE_UNAUTHORIZED)

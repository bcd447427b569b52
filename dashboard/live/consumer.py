"""The live socket's ASGI handler: the handshake (credential, per-user cap, ``hello``), client
frames in, doorbells in, and the end of the socket. What a socket follows and sends lives in
its ``Connection`` (the protocol is described in ``dashboard.live``)."""

from __future__ import annotations

import asyncio
import logging
import time

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from dashboard.live import caps
from dashboard.live.connection import Connection
from dashboard.live.frames import FrameError, Ping, Unsubscribe, parse_client_frame
from dashboard.live.gate import authorise, can_act
from delegation import layers, metrics
from delegation.protocol import (
    CLOSE_FORBIDDEN,
    CLOSE_TOO_MANY,
    CLOSE_UNAUTHORIZED,
    bearer_token,
)
from delegation.wire import dumps

log = logging.getLogger(__name__)


class LiveConsumer(AsyncWebsocketConsumer):
    connection: Connection | None = None
    counted_user: int | None = None

    async def connect(self):
        token = bearer_token(self.scope.get("headers", []))
        user, role = await database_sync_to_async(authorise)(self.scope.get("user"), token)
        await self.accept()
        if user is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        if role is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        refusal = caps.claim_socket(user.pk)
        if refusal is not None:
            await self.send(
                text_data=dumps({"type": "error", "code": "limit", "field": "", "message": refusal})
            )
            await self.close(code=CLOSE_TOO_MANY)
            return
        self.counted_user = user.pk
        metrics.LIVE_SOCKETS.inc()
        session = self.scope.get("session")
        self.connection = Connection(
            self,
            user=user,
            session_key=None if token else getattr(session, "session_key", None),
            token=token,
            heartbeat_seconds=float(settings.LIVE_HEARTBEAT_SECONDS),
        )
        await self.connection.send(
            {
                "type": "hello",
                "heartbeatSeconds": self.connection.heartbeat_seconds,
                "serverTime": int(time.time() * 1000),
                "user": user.get_username(),
                "role": role,
                "canAct": await database_sync_to_async(can_act)(user),
            }
        )
        self.connection.start()

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, layers.from_socket(receive), send)
        finally:
            # However the consumer ends (a close, a crash), its worker and heartbeat end too:
            # a leftover heartbeat would keep querying for a socket nobody holds.
            await self._shut_down()

    async def dispatch(self, message):
        # A doorbell type this socket does not know (a newer engine) must not close it, and a
        # websocket.* message the channel layer brings is not the browser's (SPEC §13).
        if getattr(self, get_handler_name(message), None) is None:
            return
        if layers.forged_socket_message(message):
            log.warning("live socket: dropped a %s sent through the channel layer", message["type"])
            return
        try:
            await super().dispatch(message)
        except (StopConsumer, asyncio.CancelledError):
            raise
        except Exception:
            # The frame boundary: an unexpected error answers an error frame, the socket lives.
            log.exception("live socket: %s failed", message.get("type"))
            if message.get("type") == "websocket.receive" and self.connection is not None:
                await self.connection.reply(
                    {
                        "type": "error",
                        "code": "internal",
                        "field": "",
                        "message": "internal error; the frame was not handled",
                    }
                )
            elif message.get("type") == "websocket.connect":
                await self.close(code=1011)

    async def disconnect(self, code):
        await self._shut_down()

    async def _shut_down(self):
        if getattr(self, "_shut", False):
            return
        self._shut = True
        if self.counted_user is not None:
            metrics.LIVE_SOCKETS.dec()
            caps.release_socket(self.counted_user)
            self.counted_user = None
        if self.connection is not None:
            await self.connection.stop()

    # --- frames in -------------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None):
        conn = self.connection
        if conn is None:
            return
        if text_data is None:
            await conn.reply_error("", "frame: binary frames are refused")
            return
        if len(text_data) > caps.MAX_CLIENT_FRAME_CHARS:
            await conn.reply_error(
                "", f"frame: too large (max {caps.MAX_CLIENT_FRAME_CHARS} characters)"
            )
            return
        try:
            frame = parse_client_frame(text_data)
        except FrameError as exc:
            await conn.reply_error(exc.field, exc.message, exc.code)
            return
        if isinstance(frame, Ping):
            await conn.reply({"type": "pong"})
        elif len(conn.jobs) >= caps.MAX_PENDING_JOBS:
            await conn.reply_error(
                "",
                f"frame: {caps.MAX_PENDING_JOBS} subscriptions are still pending; wait for them",
                "limit",
            )
        elif isinstance(frame, Unsubscribe):
            conn.schedule(lambda: conn.unsubscribe(frame))
        else:
            conn.schedule(lambda: conn.subscribe(frame))

    # --- doorbells on this socket's own channel (LIVE_FANOUT=socket; else dashboard.live.hub)

    async def run_changed(self, message):
        if self.connection is not None:
            metrics.LIVE_DOORBELLS.inc()
            self.connection.ring_run(message)

    async def runner_changed(self, message):
        if self.connection is not None:
            self.connection.ring_runners()

    async def approvals_changed(self, message):
        if self.connection is not None:
            self.connection.ring_approvals()

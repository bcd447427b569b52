"""Server commands (``child.execute``, ``run.execute``, ``run.cancel``, ...): the handlers a
host registers, and answering each command id once even when the server redelivers it."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from delegation import errors as codes
from delegation.client.connection import Handler, _Conn
from delegation.client.shapes import Registration
from delegation.errors import RpcError


class CommandHandlers:
    """The server-command half of :class:`RunnerClient` (state kept by ``Connection``)."""

    def on(self, method: str, handler: Handler | None = None):
        """Register the handler of a server command; usable as a decorator.

        A handler gets ``(params, client)`` and returns the JSON result (``None`` → ``{}``);
        raising :class:`RpcError` answers with that error. Unhandled commands are answered
        with −32601.
        """
        if handler is None:

            def decorator(fn: Handler) -> Handler:
                self._handlers[method] = fn
                return fn

            return decorator
        self._handlers[method] = handler
        return handler

    def on_connect(self, callback: Callable[[Registration], Awaitable[None]]) -> None:
        """Run ``callback(registration)`` after every successful (re-)registration."""
        self._on_connect.append(callback)

    def _on_command(self, conn: _Conn, message: dict) -> None:
        method = message.get("method")
        command_id = message.get("id")
        if command_id is None:
            self.log.info("server notification %s ignored", method)
            return
        key = json.dumps(command_id)
        answer = self._answers.get(key)
        if answer is not None:
            # Redelivered after a reconnect: the earlier answer was lost with its connection.
            self._spawn(self._send(conn, answer))
            return
        if key in self._running_commands:
            return  # still being handled; its answer goes out on whatever connection is live
        task = self._spawn(self._handle_command(key, command_id, method, message.get("params")))
        self._running_commands[key] = task

    async def _handle_command(self, key: str, command_id, method, params) -> None:
        try:
            handler = self._handlers.get(method)
            if handler is None:
                answer = {
                    "jsonrpc": "2.0",
                    "id": command_id,
                    "error": {"code": codes.METHOD_NOT_FOUND, "message": f"no handler: {method}"},
                }
            else:
                try:
                    result = await handler(params if isinstance(params, dict) else {}, self)
                    answer = {
                        "jsonrpc": "2.0",
                        "id": command_id,
                        "result": {} if result is None else result,
                    }
                except RpcError as exc:
                    answer = {"jsonrpc": "2.0", "id": command_id, "error": exc.wire()}
                except Exception as exc:
                    self.log.exception("handler of %s failed", method)
                    answer = {
                        "jsonrpc": "2.0",
                        "id": command_id,
                        "error": {"code": codes.INTERNAL_ERROR, "message": str(exc)},
                    }
            self._answers[key] = answer
            while len(self._answers) > 4096:
                self._answers.popitem(last=False)
        finally:
            self._running_commands.pop(key, None)
        conn = self._conn
        if conn is not None:
            await self._send(conn, answer)
        # Otherwise the server redelivers the command after the reconnect, and the stored
        # answer goes out then.

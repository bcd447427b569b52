"""The runner methods of :class:`RunnerClient`: runs, events, tokens and the five child
methods, each an idempotent call the connection resends when an answer is lost."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

from delegation import depth as depth_mod
from delegation import errors as codes
from delegation.client.commands import CommandHandlers
from delegation.client.connection import Connection
from delegation.client.errors import ReleaseUnconfirmed
from delegation.client.joins import JoinMethods
from delegation.client.shapes import EmitAck, McpToken, Result, SteerOutcome
from delegation.client.streams import RunStream
from delegation.errors import RpcError


class RunnerClient(CommandHandlers, JoinMethods, Connection):
    """An authenticated, self-healing runner connection.

    ``depth`` is the level this runner declares on the handshake; by default it is read from
    ``PANDO_DELEGATION_DEPTH`` (an invalid value means "not declared"); pass ``None`` to
    declare nothing.
    """

    # -- runs and events ---------------------------------------------------------------

    def stream(self, run_id: str, emitted: int = 0) -> RunStream:
        """The outgoing stream of ``run_id`` (created on first use).

        ``emitted`` seeds the numbering for a run this process did not start (e.g. a runner
        restarted and continuing a run the server already holds events for).
        """
        stream = self._streams.get(run_id)
        if stream is None:
            stream = self._streams[run_id] = RunStream(self, run_id, emitted)
        return stream

    async def open_run(
        self,
        conversation_id: str,
        run_id: str,
        *,
        profile: str | None = None,
        extension_id: str | None = None,
        depth: int | None = None,
        meta: Mapping[str, Any] | None = None,
        budget: Mapping[str, Any] | None = None,
        message: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        """``run.open``: a top-level run; ``message`` is its task (shown as its name). ``depth`` is declared through ``_meta``; ``budget``
        (SPEC §10: ``maxRuns``, ``maxLive``, ``maxTokens``, ``maxCostUsd``, ``maxSeconds``)
        bounds its subtree, and opening it again may only narrow that budget."""
        params: dict[str, Any] = {"conversationId": conversation_id, "runId": run_id}
        if budget is not None:
            params["budget"] = dict(budget)
        if profile is not None:
            params["profile"] = profile
        if message is not None:
            params["message"] = message
        if extension_id is not None:
            params["extensionId"] = extension_id
        if depth is not None:
            meta = depth_mod.meta(depth, meta)
        if meta is not None:
            params["_meta"] = dict(meta)
        result = Result.from_wire(await self.call("run.open", params, timeout=timeout))
        self.stream(run_id)
        return result

    async def emit(self, run_id: str, *events: Mapping[str, Any], timeout=None) -> EmitAck:
        return await self.stream(run_id).emit(*events, timeout=timeout)

    async def finish(
        self,
        run_id: str,
        output: str | None = None,
        error: str | None = None,
        cancelled: bool | None = None,
        timeout: float | None = None,
    ) -> Any:
        return await self.stream(run_id).finish(output, error, cancelled, timeout=timeout)

    async def tool_end(self, run_id: str, tool_call_id: str, timeout=None) -> Any:
        return await self.call(
            "tool.end", {"runId": run_id, "toolCallId": tool_call_id}, timeout=timeout
        )

    async def mcp_token(self, run_id: str, timeout: float | None = None) -> McpToken:
        """``run.mcpToken``: a token that lets an agent act as ``run_id`` on ``/mcp``."""
        result = await self.call("run.mcpToken", {"runId": run_id}, timeout=timeout)
        return McpToken.from_wire(result)

    # -- the five child methods --------------------------------------------------------

    async def child_start(
        self,
        run_id: str,
        extension_id: str,
        generation: int,
        request: Mapping[str, Any],
        *,
        tool_call_id: str | None = None,
        lease_id: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        params: dict[str, Any] = {
            "runId": run_id,
            "extensionId": extension_id,
            "generation": generation,
            "request": dict(request),
        }
        if tool_call_id is not None:
            params["toolCallId"] = tool_call_id
        if lease_id is not None:
            params["leaseId"] = lease_id
        return Result.from_wire(await self.call("child.start", params, timeout=timeout))

    async def child_read(
        self,
        run_id: str,
        extension_id: str,
        generation: int,
        child_id: str,
        *,
        child_run_id: str | None = None,
        after: int | None = None,
        lease_id: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        params = self._child_params(run_id, extension_id, generation, child_id, child_run_id)
        if after is not None:
            params["after"] = after
        if lease_id is not None:
            params["leaseId"] = lease_id
        return Result.from_wire(await self.call("child.read", params, timeout=timeout))

    async def child_cancel(
        self,
        run_id: str,
        extension_id: str,
        generation: int,
        child_id: str,
        *,
        child_run_id: str | None = None,
        lease_id: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        params = self._child_params(run_id, extension_id, generation, child_id, child_run_id)
        if lease_id is not None:
            params["leaseId"] = lease_id
        return Result.from_wire(await self.call("child.cancel", params, timeout=timeout))

    async def child_steer(
        self,
        run_id: str,
        extension_id: str,
        generation: int,
        child_id: str,
        message: str,
        *,
        request_id: str | None = None,
        child_run_id: str | None = None,
        lease_id: str | None = None,
        timeout: float | None = None,
    ) -> SteerOutcome:
        params = self._child_params(run_id, extension_id, generation, child_id, child_run_id)
        params["message"] = message
        # Chosen once, before the first attempt, so a resent steer stays one steer.
        params["requestId"] = request_id or f"steer-{uuid.uuid4().hex}"
        if lease_id is not None:
            params["leaseId"] = lease_id
        result = await self.call("child.steer", params, timeout=timeout)
        if not isinstance(result, Mapping):
            raise RpcError(codes.INTERNAL_ERROR, f"child.steer answered {result!r}")
        return SteerOutcome(str(result.get("outcome", "")), str(result.get("reason", "") or ""))

    async def lease_release(
        self,
        lease_id: str,
        extension_id: str,
        generation: int,
        *,
        retry_until: float | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``child.lease.release``; with ``retry_until`` seconds, retries −32016 until then."""
        params = {"leaseId": lease_id, "extensionId": extension_id, "generation": generation}
        loop = asyncio.get_running_loop()
        deadline = None if retry_until is None else loop.time() + retry_until
        while True:
            try:
                return await self.call("child.lease.release", params, timeout=timeout)
            except ReleaseUnconfirmed:
                if deadline is None or loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.2)

    @staticmethod
    def _child_params(run_id, extension_id, generation, child_id, child_run_id) -> dict:
        params: dict[str, Any] = {
            "runId": run_id,
            "extensionId": extension_id,
            "generation": generation,
            "childId": child_id,
        }
        if child_run_id is not None:
            params["childRunId"] = child_run_id
        return params

"""The runner's end of Canopy's ``kodelet``: a local socket the shim asks for child runs.

The hosted extension starts ``kodelet acp``; that process (:mod:`.acp`) holds no credential.
It connects to this socket (a path in a directory only the runner's account can enter) and
asks, one JSON object a line: ``start``, ``read``, ``cancel``, ``steer``. Each becomes the §6
child method on behalf of the run that hosts the extension, under the lease the extension
holds, so depth, caps, budgets and approvals apply exactly as to any other child. The socket
outlives a ``kodelet`` process: a follow-up's new process finds the conversation it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from delegation.client import RpcError

if TYPE_CHECKING:
    from delegation.runner.host import RunContext
    from delegation.runner.kodelet.leases import LeaseBook

log = logging.getLogger("canopy.runner.kodelet")


@dataclass
class SessionRecord:
    """One ACP session of a ``kodelet``: a Canopy child (``childId``) and its latest run."""

    session_id: str
    profile: str
    child_id: str = ""
    child_run_id: str = ""
    lease_id: str | None = None
    cwd: str | None = None
    runs: list[str] = field(default_factory=list)
    # A fork (``kodelet.conversation.fork``): its first turn starts the child with
    # ``contextMode: "fork"``, a copy of the hosting run's agent conversation (SPEC §14).
    fork: bool = False


class Bridge:
    """Serves one run's ``kodelet`` processes."""

    def __init__(self, ctx: RunContext, leases: LeaseBook, path: str, default_profile: str):
        self.ctx = ctx
        self.leases = leases
        self.path = path
        self.default_profile = default_profile
        self.sessions: dict[str, SessionRecord] = {}
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for task in list(self._clients):
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(asyncio.current_task())
        try:
            while line := await reader.readline():
                try:
                    ask = json.loads(line)
                    result = {"id": ask.get("id"), "result": await self.answer(ask)}
                except RpcError as exc:
                    result = {
                        "id": ask.get("id"),
                        "error": {"code": exc.code, "message": exc.message},
                    }
                except (ValueError, KeyError, TypeError) as exc:
                    result = {"id": None, "error": {"code": -32602, "message": str(exc)}}
                writer.write(json.dumps(result).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._clients.discard(asyncio.current_task())
            writer.close()

    def fork(self, profile: str, cwd: str | None) -> str:
        """A session that is a fork of the hosting run's conversation: its id is what
        ``kodelet.conversation.fork`` answers, and the ``session/load`` of it by the
        extension's ``kodelet`` finds it here. The child (and the copy of the conversation)
        starts with the session's first prompt: a Canopy child needs its message."""
        record = SessionRecord(
            session_id=f"kodelet-fork-{uuid.uuid4().hex[:16]}", profile=profile, cwd=cwd, fork=True
        )
        self.sessions[record.session_id] = record
        return record.session_id

    async def answer(self, ask: dict) -> Any:
        op = ask["op"]
        if op == "new":
            record = SessionRecord(
                session_id=f"kodelet-{uuid.uuid4().hex[:16]}",
                profile=str(ask.get("profile") or self.default_profile),
                cwd=ask.get("cwd"),
            )
            self.sessions[record.session_id] = record
            return {"sessionId": record.session_id}
        record = self.sessions.get(str(ask.get("sessionId", "")))
        if record is None:
            raise RpcError(-32003, f"no session {ask.get('sessionId')!r} of this run")
        if op == "load":
            return {"sessionId": record.session_id}
        if op == "prompt":
            return await self._prompt(record, str(ask["message"]))
        if op == "read":
            return await self._read(record, int(ask.get("after", 0)))
        if op == "cancel":
            if record.child_id:
                result = await self.ctx.client.child_cancel(
                    **self._owner(record),
                    child_id=record.child_id,
                    child_run_id=record.child_run_id,
                )
                return {"done": result.done}
            return {"done": True}
        if op == "steer":
            if not record.child_id:
                return {"outcome": "promptRequired", "reason": "noRunningTurn"}
            outcome = await self.ctx.client.child_steer(
                **self._owner(record),
                child_id=record.child_id,
                message=str(ask["message"]),
                child_run_id=record.child_run_id,
            )
            answer = {"outcome": outcome.outcome}
            if outcome.reason:
                answer["reason"] = outcome.reason
            return answer
        raise ValueError(f"unknown op {op!r}")

    def _owner(self, record: SessionRecord) -> dict:
        """The caller of a §6 method about this session's child: the run, plus its lease
        while the lease lives (it keeps the child reachable after the run ends)."""
        lease = record.lease_id if self.leases.is_live(record.lease_id) else None
        return {
            "run_id": self.ctx.run_id,
            "extension_id": self.ctx.host.extension_id,
            "generation": self.ctx.host.generation,
            "lease_id": lease,
        }

    async def _prompt(self, record: SessionRecord, message: str) -> dict:
        """A turn: the session's first is a new child; a later one resumes the same child."""
        record.lease_id = self.leases.current()
        request: dict[str, Any] = {
            "requestId": f"{record.session_id}-{len(record.runs) + 1}",
            "profile": record.profile,
            "message": message,
        }
        if record.child_id:
            request["resume"] = record.child_id
        elif record.fork:
            request["contextMode"] = "fork"
        if record.cwd:
            request["cwd"] = record.cwd
        if record.lease_id:
            request["leaseId"] = record.lease_id
        result = await self.ctx.client.child_start(
            self.ctx.run_id,
            self.ctx.host.extension_id,
            self.ctx.host.generation,
            request,
            lease_id=record.lease_id,
        )
        record.child_id, record.child_run_id = result.conversation_id, result.run_id
        record.runs.append(result.run_id)
        return {"childId": result.conversation_id, "childRunId": result.run_id}

    async def _read(self, record: SessionRecord, after: int) -> dict:
        result = await self.ctx.client.child_read(
            **self._owner(record),
            child_id=record.child_id,
            child_run_id=record.child_run_id,
            after=after,
        )
        return {
            "events": [e.raw for e in result.events],
            "lastSequence": result.last_sequence or after,
            "done": result.done,
            "cancelled": result.cancelled,
            "error": result.error,
            "output": result.output,
        }

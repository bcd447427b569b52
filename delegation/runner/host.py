"""The reference runner's host: server commands in, engine executions out.

An engine turns one run into events (``scripted`` simulates an agent, ``command`` drives a
subprocess). The host does everything around it, the same way for both engines:

- ``child.execute`` → accept (``{}``) and start the engine on a :class:`RunContext`; a command
  redelivered after a reconnect for a run already known is accepted again without starting
  a second execution (idempotent by ``runId``); ``run.execute`` (a top-level run an operator
  launched) is handled the same way;
- ``run.steer`` → queue the message on the running execution (``injected``), or answer
  ``promptRequired`` when there is no running turn; idempotent by ``requestId``;
- ``run.cancel`` → signal the execution; if it has not stopped by its grace period it is torn
  down; either way the run is finished with ``cancelled: true``;
- ``run.pause`` / ``run.resume`` (SPEC §14) → the engine stops / continues the agent's
  processes (its ``pause``/``resume`` hooks), and nothing the run emits goes out until it is
  resumed (or cancelled); idempotent by ``runId``;
- ``lease.revoked`` → acknowledged (the server cancels the lease's children itself);
- every execution ends with exactly one ``run.finish``, retried across reconnects.

Top-level runs are opened by the host itself (:meth:`RunnerHost.open_root`), e.g. by the demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from delegation import errors as codes
from delegation.client import (
    ClientClosed,
    ClientError,
    ExecuteCommand,
    Extension,
    Fenced,
    Preset,
    Result,
    RpcError,
    RunnerClient,
    event,
)

log = logging.getLogger("canopy.runner")


class Cancelled(Exception):
    """Raised inside an engine when its run was cancelled (the host finishes it cancelled)."""


@dataclass
class Outcome:
    output: str | None = None
    error: str | None = None
    cancelled: bool = False


class Engine(Protocol):
    name: str
    cancel_grace: float  # seconds an execution may take to stop after a cancel

    def presets(self) -> list[Preset]: ...

    def check(self, command: ExecuteCommand, host: RunnerHost) -> None:
        """Refuse a child up front (raise RpcError): the server then fails the child."""

    async def run(self, ctx: RunContext) -> Outcome: ...


@dataclass
class RunContext:
    """One execution: what to do, and the means to report, delegate and be steered."""

    host: RunnerHost
    run_id: str
    conversation_id: str
    depth: int
    message: str
    profile: str = ""
    preset: Preset | None = None
    request: Mapping[str, Any] = field(default_factory=dict)
    identity: Any = None
    lease_id: str | None = None
    cwd: str | None = None
    fork_from: Mapping[str, Any] | None = None  # SPEC §14 fork from here (run.execute)
    steers: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel_event: asyncio.Event = field(default_factory=asyncio.Event)
    # Set while the run is not paused (SPEC §14); emit waits on it.
    running: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: str = ""
    steer_ids: dict[str, str] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    finished: bool = False
    data: dict = field(default_factory=dict)  # engine-private state (e.g. a subprocess)

    @property
    def client(self) -> RunnerClient:
        return self.host.client

    def __post_init__(self) -> None:
        self.running.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    @property
    def paused(self) -> bool:
        return not self.running.is_set()

    async def wait_running(self) -> None:
        """Return once the run is not paused, or is cancelled (a cancel ends a pause)."""
        if self.running.is_set() or self.cancelled:
            return
        cancelled = asyncio.ensure_future(self.cancel_event.wait())
        resumed = asyncio.ensure_future(self.running.wait())
        try:
            await asyncio.wait({cancelled, resumed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
            resumed.cancel()

    @property
    def stream(self):
        return self.client.stream(self.run_id)

    async def emit(self, *events: Mapping[str, Any]):
        # A paused run emits nothing (SPEC §14): what its agent said just before it stopped
        # goes out once it is resumed.
        await self.wait_running()
        return await self.stream.emit(*events)

    def append(self, *events: Mapping[str, Any]) -> None:
        """Buffer events; they go out with the next emit or flush."""
        self.stream.append(*events)

    def take_steers(self) -> list[str]:
        out = []
        while not self.steers.empty():
            out.append(self.steers.get_nowait())
        return out

    def check_cancel(self) -> None:
        if self.cancelled:
            raise Cancelled(self.cancel_reason)

    async def sleep(self, seconds: float) -> None:
        """Sleep, waking at once (with :class:`Cancelled`) if the run is cancelled."""
        self.check_cancel()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0)):
                await self.cancel_event.wait()
        self.check_cancel()

    # -- approvals (SPEC §11), on behalf of this run --------------------------------------

    async def ask_approval(
        self,
        tool_call_id: str,
        tool_name: str,
        input: Any,
        kind: str = "",
        title: str = "",
        can_edit: bool = True,
    ) -> dict:
        """Ask Canopy whether a tool use may run: ``{decision, message?, updatedInput?}``.

        Policy may decide at once; otherwise this waits for the ``approval.decided`` command
        (stored and resent by the server, so a reconnect loses nothing), or for a cancel,
        which is answered ``{"decision": "cancelled"}``.
        """
        params = {"runId": self.run_id, "toolCallId": tool_call_id, "toolName": tool_name}
        params["input"] = input
        if kind:
            params["kind"] = kind
        if title:
            params["title"] = title[:1024]
        if not can_edit:
            # An engine that cannot run an edited input says so; absent, the server offers
            # the operator an edit (SPEC §11 as written).
            params["canEdit"] = False
        answer = await self.client.call("approval.request", params)
        if answer.get("status") == "decided":
            return answer
        decided = self.host.approval_future(answer["approvalId"])
        cancelled = asyncio.ensure_future(self.cancel_event.wait())
        try:
            await asyncio.wait({decided, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if decided.done():
            self.host.approvals.pop(answer["approvalId"], None)
            return decided.result()
        return {"decision": "cancelled"}

    # -- delegation, on behalf of this run ---------------------------------------------

    async def child_start(self, request: Mapping[str, Any], tool_call_id: str | None = None):
        return await self.client.child_start(
            self.run_id,
            self.host.extension_id,
            self.host.generation,
            request,
            tool_call_id=tool_call_id,
        )

    async def child_read(self, child_id: str, after: int = 0) -> Result:
        return await self.client.child_read(
            self.run_id, self.host.extension_id, self.host.generation, child_id, after=after
        )

    async def child_cancel(self, child_id: str) -> Result:
        return await self.client.child_cancel(
            self.run_id, self.host.extension_id, self.host.generation, child_id
        )

    async def child_steer(self, child_id: str, message: str, request_id: str | None = None):
        return await self.client.child_steer(
            self.run_id,
            self.host.extension_id,
            self.host.generation,
            child_id,
            message,
            request_id=request_id,
        )


class RunnerHost:
    """Runs an :class:`Engine` for every child the server dispatches to this runner."""

    def __init__(
        self,
        url: str,
        token: str,
        engine: Engine,
        *,
        extension_id: str = "reference-runner",
        generation: int | None = None,
        host_instance_id: str | None = None,
        workspace: str | None = None,
        depth: Any = None,
        client_options: Mapping[str, Any] | None = None,
    ):
        self.engine = engine
        self.extension_id = extension_id
        # A process generation is never 0; milliseconds since the epoch differ per start.
        self.generation = generation or int(time.time() * 1000)
        self.workspace = workspace
        options = dict(client_options or {})
        if depth is not None:
            options["depth"] = depth
        self.client = RunnerClient(
            url,
            token,
            extensions=[Extension(extension_id, self.generation, engine.presets())],
            host_instance_id=host_instance_id,
            workspace=workspace,
            **options,
        )
        self.runs: dict[str, RunContext] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.finished: set[str] = set()
        self.revoked_leases: set[str] = set()
        self._background: set[asyncio.Task] = set()
        self._root_counter = 0
        self.stopping = False
        self._last_command_at = 0.0
        self.client.on("child.execute", self._on_execute)
        # An operator's launch (SPEC §9): a top-level run, executed exactly like a child.
        self.client.on("run.execute", self._on_execute)
        self.client.on("run.cancel", self._on_cancel)
        self.client.on("run.steer", self._on_steer)
        self.client.on("lease.revoked", self._on_lease_revoked)
        self.client.on("run.pause", self._on_pause)
        self.client.on("run.resume", self._on_resume)
        # approvalId -> the decision's future; decisions arrive as commands (SPEC §11).
        self.approvals: dict[str, asyncio.Future] = {}
        self.client.on("approval.decided", self._on_approval_decided)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, timeout: float | None = None):
        return await self.client.connect(timeout=timeout)

    async def stop(self, cancel_running: bool = True, drain: float = 2.0) -> None:
        """Stop executions (finishing them cancelled while the server is reachable), close.

        Finishing a parent makes the server cancel its children, including ones it admitted a
        moment ago that this host has not started yet; for ``drain`` seconds (while commands
        keep coming) those are confirmed cancelled too, so a shutdown leaves nothing running.
        """
        loop = asyncio.get_running_loop()
        self.stopping = True
        if cancel_running:
            for ctx in list(self.runs.values()):
                if not ctx.finished:
                    self.cancel(ctx.run_id, "runner shutting down")
            pending = [t for t in self.tasks.values() if not t.done()]
            if pending:
                await asyncio.wait(pending, timeout=self.engine.cancel_grace + 3)
            deadline = loop.time() + drain
            while loop.time() < deadline and (
                loop.time() - self._last_command_at < 0.5 or self._background
            ):
                await asyncio.sleep(0.05)
        for task in list(self.tasks.values()) + list(self._background):
            task.cancel()
        for task in list(self.tasks.values()) + list(self._background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.client.close()

    async def __aenter__(self) -> RunnerHost:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def wait(self, run_id: str, timeout: float | None = None) -> None:
        task = self.tasks.get(run_id)
        if task is not None:
            async with asyncio.timeout(timeout):
                await asyncio.shield(task)

    # -- top-level runs ----------------------------------------------------------------

    async def open_root(
        self,
        message: str,
        *,
        profile: str | None = None,
        conversation_id: str | None = None,
        run_id: str | None = None,
        depth: int | None = None,
        budget: dict | None = None,
    ) -> RunContext:
        """``run.open`` a top-level run and execute the engine on it in the background;
        ``budget`` (SPEC §10) bounds its whole tree."""
        self._root_counter += 1
        stamp = f"{self.generation}-{self._root_counter}"
        conversation_id = conversation_id or f"root-{stamp}"
        run_id = run_id or f"run-{stamp}"
        presets = {p.name: p for p in self.engine.presets()}
        profile = profile or next(iter(presets), None)
        if profile is not None and profile not in presets:
            raise ValueError(f"no preset {profile!r} (this runner offers {', '.join(presets)})")
        result = await self.client.open_run(
            conversation_id,
            run_id,
            profile=profile,
            extension_id=self.extension_id if profile else None,
            depth=depth,
            budget=budget,
            message=message,
        )
        ctx = RunContext(
            host=self,
            run_id=run_id,
            conversation_id=conversation_id,
            depth=result.depth,
            message=message,
            profile=profile or "",
            preset=presets.get(profile) if profile else None,
            request={"message": message},
        )
        self._launch(ctx)
        return ctx

    # -- server commands ---------------------------------------------------------------

    async def _on_execute(self, params: dict, client: RunnerClient) -> dict:
        self._last_command_at = asyncio.get_running_loop().time()
        command = ExecuteCommand.from_wire(params)
        run_id = command.run_id
        if not run_id:
            raise RpcError(codes.INVALID_PARAMS, "identity.runId: required")
        if run_id in self.runs or run_id in self.finished:
            return {}  # a redelivery: this run is already executing (or done)
        if self.stopping:
            # Admitted just before its parent was stopped: confirm it cancelled, do not start.
            self.finished.add(run_id)
            self._spawn(self._finish(run_id, Outcome(cancelled=True)))
            return {}
        self.engine.check(command, self)
        ctx = RunContext(
            host=self,
            run_id=run_id,
            conversation_id=command.identity.conversation_id,
            depth=command.depth,
            message=command.message,
            profile=command.identity.profile or command.preset.name,
            preset=command.preset,
            request=command.request,
            identity=command.identity,
            lease_id=command.lease_id,
            cwd=command.request.get("cwd"),
            fork_from=command.raw.get("forkFrom"),
        )
        self._launch(ctx)
        return {}

    async def _on_cancel(self, params: dict, client: RunnerClient) -> dict:
        self._last_command_at = asyncio.get_running_loop().time()
        run_id = params.get("runId", "")
        if run_id in self.runs:
            self.cancel(run_id, params.get("reason", ""))
        elif run_id not in self.finished and run_id:
            # Not ours any more (e.g. this process restarted): confirm it as cancelled.
            self.finished.add(run_id)
            self._spawn(self._finish(run_id, Outcome(cancelled=True)))
        return {}

    async def _on_steer(self, params: dict, client: RunnerClient) -> dict:
        run_id = params.get("runId", "")
        request_id = str(params.get("requestId", ""))
        message = params.get("message", "")
        ctx = self.runs.get(run_id)
        if ctx is None or ctx.finished:
            return {"outcome": "promptRequired", "reason": "noRunningTurn"}
        if request_id in ctx.steer_ids:
            return {"outcome": ctx.steer_ids[request_id]}
        if ctx.cancelled:
            return {"outcome": "promptRequired", "reason": "noRunningTurn"}
        outcome = await self._deliver_steer(ctx, message)
        ctx.steer_ids[request_id] = outcome
        if outcome == "injected":
            return {"outcome": outcome}
        return {"outcome": outcome, "reason": "noRunningTurn"}

    async def _deliver_steer(self, ctx: RunContext, message: str) -> str:
        deliver = getattr(self.engine, "steer", None)
        if deliver is not None:
            return await deliver(ctx, message)
        ctx.steers.put_nowait(message)
        return "injected"

    def approval_future(self, approval_id: str) -> asyncio.Future:
        future = self.approvals.get(approval_id)
        if future is None:
            future = self.approvals[approval_id] = asyncio.get_running_loop().create_future()
        return future

    async def _on_approval_decided(self, params: dict, client: RunnerClient) -> dict:
        # Idempotent: a resent decision finds its future already resolved.
        future = self.approval_future(str(params.get("approvalId", "")))
        if not future.done():
            future.set_result(dict(params))
        return {}

    async def _on_pause(self, params: dict, client: RunnerClient) -> dict:
        ctx = self.runs.get(params.get("runId", ""))
        if ctx is not None and not ctx.finished and not ctx.paused:
            ctx.running.clear()
            hook = getattr(self.engine, "pause", None)
            if hook is not None:
                hook(ctx)
            log.info("run %s paused: %s", ctx.run_id, params.get("reason", ""))
        return {}

    async def _on_resume(self, params: dict, client: RunnerClient) -> dict:
        ctx = self.runs.get(params.get("runId", ""))
        if ctx is not None and ctx.paused:
            hook = getattr(self.engine, "resume", None)
            if hook is not None:
                hook(ctx)
            ctx.running.set()
            log.info("run %s resumed", ctx.run_id)
        return {}

    async def _on_lease_revoked(self, params: dict, client: RunnerClient) -> dict:
        lease_id = params.get("leaseId", "")
        self.revoked_leases.add(lease_id)
        log.info("lease %s revoked by the server", lease_id)
        return {}

    # -- executions --------------------------------------------------------------------

    def cancel(self, run_id: str, reason: str = "") -> None:
        ctx = self.runs.get(run_id)
        if ctx is None or ctx.cancelled:
            return
        ctx.cancel_reason = reason or "cancelled"
        ctx.cancel_event.set()
        self._spawn(self._enforce_cancel(ctx))

    async def _enforce_cancel(self, ctx: RunContext) -> None:
        """An engine that ignores its cancel is torn down after its grace period."""
        task = self.tasks.get(ctx.run_id)
        if task is None:
            return
        done, _ = await asyncio.wait([task], timeout=self.engine.cancel_grace)
        if not done:
            log.warning(
                "run %s ignored its cancel for %.1fs; stopping it",
                ctx.run_id,
                self.engine.cancel_grace,
            )
            ctx.data["torn_down"] = True
            task.cancel()

    def _launch(self, ctx: RunContext) -> None:
        self.runs[ctx.run_id] = ctx
        self.tasks[ctx.run_id] = asyncio.create_task(
            self._execute(ctx), name=f"canopy-run-{ctx.run_id}"
        )

    async def _execute(self, ctx: RunContext) -> None:
        try:
            try:
                outcome = await self.engine.run(ctx)
            except Cancelled:
                outcome = Outcome(cancelled=True)
            except asyncio.CancelledError:
                if not ctx.cancelled:
                    raise  # the host itself is stopping
                # Torn down after ignoring its cancel: go on to report it, uncancelled, so
                # the timeouts inside run.finish still work.
                asyncio.current_task().uncancel()
                outcome = Outcome(cancelled=True)
            except (ClientClosed, Fenced):
                raise
            except RpcError as exc:
                outcome = Outcome(error=f"{exc.message} (code {exc.code})")
            except Exception as exc:
                log.exception("run %s failed", ctx.run_id)
                outcome = Outcome(error=f"{type(exc).__name__}: {exc}")
            if ctx.cancelled and not outcome.cancelled:
                # A cancel won the race against a normal end: report what was asked.
                outcome = Outcome(cancelled=True, output=outcome.output)
            await self._finish(ctx.run_id, outcome)
        finally:
            ctx.finished = True
            self.finished.add(ctx.run_id)
            self.runs.pop(ctx.run_id, None)

    async def _finish(self, run_id: str, outcome: Outcome) -> None:
        """Finish once; survive reconnects (the call waits and resends)."""
        while True:
            try:
                await self.client.finish(
                    run_id,
                    output=outcome.output,
                    error=outcome.error,
                    cancelled=True if outcome.cancelled else None,
                )
                return
            except (ClientClosed, Fenced):
                log.warning("run %s not finished: the connection is gone for good", run_id)
                return
            except ClientError as exc:
                log.warning("finishing run %s failed (%s); retrying", run_id, exc)
                await asyncio.sleep(1)
            except RpcError as exc:
                log.warning("server refused run.finish of %s: %s", run_id, exc)
                return

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def text_event(text: str) -> dict:
    return event("text", text)

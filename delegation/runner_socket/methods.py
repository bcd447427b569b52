"""The runner protocol's methods (SPEC §5–§6): decode and validate each method's params with
the wire schemas, then call the typed service.

The consumer frames, authenticates and dispatches here; the services never see raw params,
so any other transport can call them with the same typed arguments.
"""

from __future__ import annotations

import time

from delegation import metrics
from delegation.errors import RpcError
from delegation.services import approval_doors, children, run_tokens, runners, streams
from delegation.services.identity import Caller, Connection
from delegation.wire import (
    Params,
    RegisterParams,
    RunEventParams,
    RunFinishParams,
    RunOpenParams,
    RunTokenParams,
    ToolEndParams,
    parse_model,
)
from delegation.wire.approvals import ApprovalRequestParams


def register(conn: Connection, raw_params) -> tuple[dict, int, str]:
    return runners.register(conn, parse_model(RegisterParams, raw_params))


def open_run(conn: Connection, raw_params) -> dict:
    return streams.open_run(conn, parse_model(RunOpenParams, raw_params))


def append_event_frames_of(calls: list[tuple[Connection, list]]) -> list[list[dict | RpcError]]:
    """Several sockets' ``run.event`` frames in one commit: for each call, each frame's
    answer or refusal, in order (a frame whose params do not decode is refused on its own)."""
    parsed: list[tuple[Connection, list[RunEventParams]]] = []
    decoded: list[list[RpcError | None]] = []
    for conn, raw_frames in calls:
        frames, refusals = [], []
        for raw in raw_frames:
            try:
                frames.append(parse_model(RunEventParams, raw))
                refusals.append(None)
            except RpcError as exc:
                refusals.append(exc)
        parsed.append((conn, frames))
        decoded.append(refusals)
    started = time.perf_counter()
    stored = streams.append_event_frames_of(parsed)
    took = time.perf_counter() - started
    answers = []
    for refusals, outcomes in zip(decoded, stored, strict=True):
        for _outcome in outcomes:
            metrics.INGEST_SECONDS.observe(took)  # every frame of the group waited for its commit
        outcomes = iter(outcomes)
        answers.append([next(outcomes) if refusal is None else refusal for refusal in refusals])
    return answers


def append_event_frame(conn: Connection, raw_params) -> dict:
    """One ``run.event`` frame as a group of one, for callers off the socket (the bench seed,
    tests): the same way in as every socket frame, its refusal raised."""
    [[outcome]] = append_event_frames_of([(conn, [raw_params])])
    if isinstance(outcome, RpcError):
        raise outcome
    return outcome


def finish_run(conn: Connection, raw_params) -> dict:
    return streams.finish_run(conn, parse_model(RunFinishParams, raw_params))


def end_tool(conn: Connection, raw_params) -> dict:
    return streams.end_tool(conn, parse_model(ToolEndParams, raw_params))


def _child_params(raw_params, *required: str) -> Params:
    params = parse_model(Params, raw_params)
    params.require(*required)
    return params


def child_start(conn: Connection, raw_params) -> dict:
    params = _child_params(raw_params, "extension_id", "generation", "request")
    return children.start_child(Caller(conn), params)


def child_read(conn: Connection, raw_params) -> dict:
    return children.read_child(Caller(conn), _child_params(raw_params))


def child_cancel(conn: Connection, raw_params) -> dict:
    return children.cancel_child(Caller(conn), _child_params(raw_params))


def child_steer(conn: Connection, raw_params) -> dict:
    return children.steer_child(Caller(conn), _child_params(raw_params, "message", "request_id"))


def mcp_token(conn: Connection, raw_params) -> dict:
    return run_tokens.issue_run_token(conn, parse_model(RunTokenParams, raw_params))


def child_lease_release(conn: Connection, raw_params) -> tuple[int, list[str]]:
    params = _child_params(raw_params, "lease_id", "extension_id", "generation")
    return children.release_child_lease(conn, params)


def approval_request(conn: Connection, raw_params) -> dict:
    return approval_doors.request_approval(conn, parse_model(ApprovalRequestParams, raw_params))


# method -> function taking (connection, raw params) and returning the JSON result.
HANDLERS = {
    "run.open": open_run,
    "run.finish": finish_run,
    "tool.end": end_tool,
    "child.start": child_start,
    "child.read": child_read,
    "child.cancel": child_cancel,
    "child.steer": child_steer,
    "run.mcpToken": mcp_token,
    "approval.request": approval_request,
}
# Methods the consumer handles itself around the call: register swaps the connection,
# release answers only once the lease's children have stopped, and every run.event goes
# through the process's group commit (``frame_groups`` -> ``append_event_frames_of``).
METHODS = frozenset(HANDLERS) | {"runner.register", "child.lease.release", "run.event"}

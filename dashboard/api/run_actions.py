"""Acting on runs: launch, cancel, steer and budgets, on the runs resource's router. Each calls
the one service of that action, which checks the role and writes the audit entry."""

from dashboard.api.core import ACT, NoParams, actor_for, strict_query
from dashboard.api.rows import find_run

# The runs resource has one router: ninja answers 405 for a path two routers share.
from dashboard.api.runs import router
from dashboard.api.schemas.runs import (
    CancelBody,
    CancelReport,
    LaunchBody,
    PauseBody,
    PauseReport,
    RelaunchBody,
    RunResult,
    SteerBody,
    SteerOutcome,
)
from dashboard.api.schemas.usage import BudgetBody, BudgetOut
from delegation import selectors
from delegation.services import budgets, pause, run_actions
from delegation.services.launch import Launch, do_launch_run, do_relaunch_run


@router.post(
    "/runs",
    response={201: RunResult, **ACT},
    summary="Launch a top-level run on a connected runner",
    description="Needs the operator role. Stores the session and run at depth 0, sends the "
    "runner `run.execute` (the params of child.execute) and audits the launch; answers the "
    "run's Result. A runner that is unknown or not connected, or has no such preset, is 409 "
    "with the reason (rpcCode −32001 / −32012); a preset offered by several extensions needs "
    "`extensionId` (422).",
)
@strict_query(NoParams)
def launch_run(request, body: LaunchBody):
    launch = Launch(
        runner=body.runner,
        profile=body.profile,
        message=body.message,
        extension_id=body.extension_id,
        cwd=body.cwd,
        budget=body.budget.limits() if body.budget is not None else None,
        approvals=body.approvals.plain() if body.approvals is not None else None,
    )
    return 201, do_launch_run(actor_for(request), launch)


@router.post(
    "/runs/{runId}/relaunch",
    response={201: RunResult, **ACT},
    summary="Relaunch a run: a new top-level run from its preset and (edited) message",
    description="Needs the operator role. Launches on the run's runner with its preset, "
    "working directory and budget, and its message unless `message` replaces it; the new "
    "run records `relaunchedFrom`. Refused like a launch (409 when the runner is not "
    "connected or lost the preset); audited as a launch.",
)
@strict_query(NoParams)
def relaunch_run(request, runId: str, body: RelaunchBody = RelaunchBody()):  # noqa: N803, B008
    run = find_run(runId)
    message = body.message if body is not None else None
    return 201, do_relaunch_run(actor_for(request), run, message=message)


@router.post(
    "/runs/{runId}/cancel",
    response={200: CancelReport, **ACT},
    summary="Cancel a run (optionally its whole subtree)",
    description="Needs the operator role (a refusal is audited). Through the engine's "
    "do_cancel_run, the same path as child.cancel: records `cancel-requested` and tells the "
    "runner; `done && cancelled` appear once the runner confirms. Idempotent. The body may be "
    "omitted.",
)
@strict_query(NoParams)
def cancel_run(request, runId: str, body: CancelBody = CancelBody()):  # noqa: N803, B008
    run = find_run(runId)
    body = body or CancelBody()
    return run_actions.do_cancel_run(
        actor_for(request), run, reason=body.reason, cascade=body.cascade
    )


PAUSE_DOC = (
    "Needs the operator role (a refusal is audited). SPEC §14, through the one pause service the "
    "run page and the admin use: the runner gets `run.pause` and stops the agent's processes "
    "(status `paused`, a `paused` event, no events until resumed; time paused does not count "
    "toward `maxSeconds`; pending approvals keep waiting); `/resume` sends `run.resume` (status "
    "`running`, a `resumed` event). With `subtree`, every live run below it too, each reported. "
    "Idempotent; the body may be omitted."
)


@router.post(
    "/runs/{runId}/pause",
    response={200: PauseReport, **ACT},
    summary="Pause a run (optionally its whole subtree)",
    description=PAUSE_DOC,
)
@strict_query(NoParams)
def pause_run(request, runId: str, body: PauseBody = PauseBody()):  # noqa: N803, B008
    return _pause_or_resume(request, run_id=runId, body=body, act=pause.do_pause_run)


@router.post(
    "/runs/{runId}/resume",
    response={200: PauseReport, **ACT},
    summary="Resume a paused run (optionally its whole subtree)",
    description=PAUSE_DOC,
)
@strict_query(NoParams)
def resume_run(request, runId: str, body: PauseBody = PauseBody()):  # noqa: N803, B008
    return _pause_or_resume(request, run_id=runId, body=body, act=pause.do_resume_run)


def _pause_or_resume(request, *, run_id: str, body: PauseBody | None, act) -> dict:
    """The one body of both endpoints; they stay two declared operations so each keeps its
    own path, summary and operationId in the OpenAPI document."""
    body = body or PauseBody()  # an omitted body means the defaults
    return act(actor_for(request), find_run(run_id), reason=body.reason, subtree=body.subtree)


@router.post(
    "/runs/{runId}/steer",
    response={200: SteerOutcome, **ACT},
    exclude_unset=True,
    summary="Steer a running run",
    description="Needs the operator role. Same rules and idempotency as child.steer: "
    "`injected` when the run is running (a `steer` event is recorded and the runner gets "
    "run.steer), else `promptRequired`/`noRunningTurn`. A reused requestId with another "
    "message is 409 (rpcCode −32013); the 129th receipt of a child is 409 (−32011).",
)
@strict_query(NoParams)
def steer_run(request, runId: str, body: SteerBody):  # noqa: N803
    run = find_run(runId)
    return run_actions.do_steer_run(
        actor_for(request), run, request_id=body.request_id, message=body.message
    )


BUDGET_DOC = (
    "Needs the operator role (a refusal is audited); the change is audited with the limits "
    "before and after. The budget bounds the run's whole subtree: a `child.start` beyond "
    "`maxRuns`/`maxLive`, or once tokens or cost are used up, is refused with −32017; crossing "
    "`maxTokens`, `maxCostUsd` or `maxSeconds` cancels the subtree (`budget-exceeded`), and 80% "
    "stores one `budget-warning`. Setting a budget re-arms both, and a limit set below what is "
    "already used stops the subtree at once."
)


@router.put(
    "/runs/{runId}/budget",
    response={200: BudgetOut, **ACT},
    summary="Set a run's budget (exactly these limits)",
    description=BUDGET_DOC,
)
@strict_query(NoParams)
def put_budget(request, runId: str, body: BudgetBody):  # noqa: N803
    run = find_run(runId)
    budgets.do_set_budget(actor_for(request), run, body.limits(), replace=True, reason=body.reason)
    return selectors.usage_of_run(find_run(runId))[1]


@router.patch(
    "/runs/{runId}/budget",
    response={200: BudgetOut, **ACT},
    summary="Change some limits of a run's budget",
    description=BUDGET_DOC,
)
@strict_query(NoParams)
def patch_budget(request, runId: str, body: BudgetBody):  # noqa: N803
    run = find_run(runId)
    budgets.do_set_budget(actor_for(request), run, body.limits(), replace=False, reason=body.reason)
    return selectors.usage_of_run(find_run(runId))[1]

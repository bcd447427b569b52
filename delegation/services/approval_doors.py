"""The runner protocol's door to approvals (SPEC §11 ``approval.request``): the runner's
own running run, on its current connection, then the one approvals service."""

from __future__ import annotations

from delegation.errors import NO_SUCH_RUN, RpcError
from delegation.models import Run
from delegation.selectors.approvals import rpc_answer
from delegation.services import approvals
from delegation.services.identity import Connection
from delegation.services.runners import current_runner
from delegation.wire.approvals import ApprovalRequestParams


def request_approval(conn: Connection, params: ApprovalRequestParams) -> dict:
    runner = current_runner(conn, lock=False)
    run = Run.objects.filter(run_id=params.run_id, runner=runner).first()
    if run is None:
        raise RpcError(NO_SUCH_RUN, f"runId: no run {params.run_id!r} of this runner")
    use = approvals.ToolUse(
        tool_name=params.tool_name,
        input=params.input,
        tool_call_id=params.tool_call_id,
        kind=params.kind or "",
        title=params.title or "",
        can_edit=params.can_edit is not False,
    )
    approval = approvals.do_request_approval(
        run=run, use=use, via=approvals.VIA_RUNNER, actor_label=f"runner:{runner.name}"
    )
    return rpc_answer(approval)

"""Fork from here (SPEC §14): ``POST /api/runs/{runId}/fork`` on the runs resource's router,
through the one fork service the run page and ``manage.py launch --fork-from`` use."""

from typing import Annotated

from pydantic import BeforeValidator, Field, field_validator

from dashboard.api.core import ACT, NoParams, actor_for, strict_query
from dashboard.api.rows import find_run

# The runs resource has one router: ninja answers 405 for a path two routers share.
from dashboard.api.runs import router
from dashboard.api.schemas.common import NOT_BLANK_NO_NUL, not_blank_no_nul
from dashboard.api.schemas.runs import RunResult
from dashboard.api.schemas.usage import _integral
from delegation.services.forks import do_fork_run
from delegation.wire import MAX_MESSAGE_BYTES, Strict


class ForkBody(Strict):
    """Continue a finished run's agent conversation at one of its steps, with a new message."""

    message: str = Field(
        min_length=1,
        max_length=MAX_MESSAGE_BYTES,
        description="The new instruction, non-blank, at most 512 KiB of UTF-8.",
        json_schema_extra={"pattern": NOT_BLANK_NO_NUL},
    )
    sequence: Annotated[int, Field(ge=1, le=2**62), BeforeValidator(_integral)] = Field(
        default=None,
        description="The step (event sequence) to fork at: the conversation up to and "
        "including the agent message that event came from. Omit it to fork from the end.",
    )

    _checks = field_validator("message")(classmethod(lambda cls, value: not_blank_no_nul(value)))


@router.post(
    "/runs/{runId}/fork",
    response={201: RunResult, **ACT},
    summary="Fork a finished run from one of its steps, with a new message",
    description="Needs the operator role (a refusal is audited). SPEC §14: a new top-level "
    "run of the same preset, on the same runner, working directory and budget, that resumes "
    "the run's agent session (Claude Code: `--resume <session> --fork-session "
    "--resume-session-at <entry>`) up to the step's agent message and then takes `message`. "
    "The new run's detail has `forkedFrom {runId, sequence}`, the original's `forks` lists it. "
    "A preset that cannot fork is 409 (rpcCode −32012, `preset P cannot fork`); a run still "
    "live, whose agent reported no session, or a step outside its events or before anything "
    "its agent said is 409 (rpcCode −32011). Audited as a launch with `forkedFrom`.",
)
@strict_query(NoParams)
def fork_run(request, runId: str, body: ForkBody):  # noqa: N803
    run = find_run(runId)
    return 201, do_fork_run(actor_for(request), run, message=body.message, sequence=body.sequence)

"""Fan out and join (SPEC §9): ``await_children`` waits once on many children; ``conclude``
states what the caller's own run achieved.

One ``await_children`` call replaces a polling loop of ``read_child`` calls (each one a model
turn): it waits on every awaited child's doorbell with one channel, holding no thread and no
database connection, and answers every child's ``Result`` when the join holds or the wait
ends.
"""

from __future__ import annotations

from typing import Annotated, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from delegation.errors import RpcError
from delegation.mcp.calls import call_service, child_params, ok, refused
from delegation.mcp.waiting import wait_seconds, wait_until
from delegation.services import children, conclusions, joins
from delegation.services.identity import Caller
from delegation.services.run_tokens import RunCaller

JOIN_INSTRUCTIONS = (
    " To run several children at once, delegate each (without waitSeconds) and then call "
    "await_children once with all their childIds (mode all, any, or quorum n) instead of "
    "polling read_child. Before you finish, call conclude with your status and a summary of "
    "what you achieved; your parent reads it."
)


def _read_many(run_caller: RunCaller, caller: Caller, child_ids: tuple[str, ...]):
    many = [child_params(run_caller, childId=child_id) for child_id in child_ids]
    return children.read_children(caller, many)


def _conclude(run_caller: RunCaller, caller: Caller, raw: dict) -> dict:
    return conclusions.conclude(caller, run_pk=run_caller.run_pk, raw=raw)


def add_join_tools(server: MCPServer) -> None:
    _add_await_children(server)
    _add_conclude(server)


def _add_await_children(server: MCPServer) -> None:
    @server.tool(
        name="await_children",
        description=(
            "Wait for several of your children at once, in one call: `mode` 'all' (every one "
            "finished), 'any' (the first to finish) or 'quorum' (`quorum` of them finished). "
            "Answers {done, results}: `done` true when the join holds, false when "
            "`waitSeconds` ran out first; `results` holds every awaited child's Result in the "
            "order of `childIds` (status, done, output, error, conclusion; events stay with "
            "read_child). Call it again with the same ids to keep waiting."
        ),
    )
    async def await_children(
        ctx: Context,
        childIds: Annotated[  # noqa: N803
            list[str],
            Field(description="1 to 64 childIds of your own children, each named once."),
        ],
        mode: Annotated[
            Literal["all", "any", "quorum"],
            Field(description="'all', 'any', or 'quorum' (then give `quorum`)."),
        ],
        quorum: Annotated[
            int | None,
            Field(description="With mode 'quorum': how many children must finish (1..n)."),
        ] = None,
        waitSeconds: Annotated[  # noqa: N803
            float | None,
            Field(
                description="Seconds (0-50) to wait for the join before answering with "
                "done false. Omit or 0 to answer at once."
            ),
        ] = None,
    ) -> CallToolResult:
        try:
            wait = wait_seconds(waitSeconds)
            join = joins.check_join(childIds, mode, quorum)
            results, run_pks = await call_service(_read_many, ctx, join.child_ids)
            if wait and not join.holds(results):

                async def read():
                    return (await call_service(_read_many, ctx, join.child_ids))[0]

                label = f"{join.quorum} of {len(join.child_ids)} children ({join.mode})"
                results = await wait_until(ctx, run_pks, wait, label, read, join.holds)
            return ok({"done": join.holds(results), "results": results})
        except RpcError as error:
            return refused(error)


def _add_conclude(server: MCPServer) -> None:
    @server.tool(
        name="conclude",
        description=(
            "State what you achieved, once your work is finished (call it again to replace "
            "it): `status` 'done', 'partial', 'blocked' or 'failed', a short `summary`, and "
            "optionally `artifacts` (files you wrote, by `path` in your workspace, or `url`s, "
            "each with a `description`), `followUp` (what is left to do) and `confidence` "
            "(0 to 1). Your parent agent and the operators read it. Answers {}."
        ),
    )
    async def conclude(
        ctx: Context,
        status: Annotated[
            Literal["done", "partial", "blocked", "failed"],
            Field(description="'done', 'partial', 'blocked' or 'failed'."),
        ],
        summary: Annotated[str, Field(description="What you achieved, in a few sentences.")],
        artifacts: Annotated[
            list[dict] | None,
            Field(
                description="What you produced: [{path or url, description}]; a path is "
                "a file in your workspace, a url an http(s) address."
            ),
        ] = None,
        followUp: Annotated[  # noqa: N803
            list[str] | None,
            Field(description="What is left to do, one item per entry."),
        ] = None,
        confidence: Annotated[
            float | None,
            Field(description="How sure you are that the work is right, from 0 to 1."),
        ] = None,
    ) -> CallToolResult:
        raw: dict = {"status": status, "summary": summary}
        for key, value in (
            ("artifacts", artifacts),
            ("followUp", followUp),
            ("confidence", confidence),
        ):
            if value is not None:
                raw[key] = value
        try:
            return ok(await call_service(_conclude, ctx, raw))
        except RpcError as error:
            return refused(error)

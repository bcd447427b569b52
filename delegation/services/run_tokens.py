"""Run tokens (SPEC §9): a runner asks for one per running run; an agent presents it to /mcp.

Issued once and stored hashed. A token is checked at every use, not only at issue: it is dead
once its run is no longer running, after its expiry, and once the runner's own token was
rotated or revoked (the runner token it was issued under is remembered by hash).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from delegation.errors import NO_SUCH_RUN, PARENT_NOT_RUNNING, RpcError
from delegation.models import (
    ExtensionPreset,
    Run,
    RunStatus,
    RunToken,
    hash_token,
    new_token,
)
from delegation.selectors import RESULT_RELATED
from delegation.services.identity import Connection
from delegation.services.locks import retry_conflicts
from delegation.services.runners import current_runner
from delegation.wire import RunTokenParams

MCP_PATH = "/mcp"


@retry_conflicts
def issue_run_token(conn: Connection, params: RunTokenParams) -> dict:
    """``run.mcpToken``: a token for one running run of the caller, on its current connection."""
    with transaction.atomic():
        runner = current_runner(conn)
        run = Run.objects.filter(run_id=params.run_id, runner=runner).first()
        if run is None:
            raise RpcError(NO_SUCH_RUN, f"runId: no run {params.run_id!r} of this runner")
        if run.status != RunStatus.RUNNING:
            raise RpcError(
                PARENT_NOT_RUNNING,
                f"runId: run {params.run_id!r} is {run.status}; run tokens are for running runs",
            )
        token = new_token("cnt")
        expires_at = timezone.now() + timedelta(seconds=settings.RUN_TOKEN_TTL_SECONDS)
        RunToken.objects.create(
            run=run,
            token_hash=hash_token(token),
            token_prefix=token[:12],
            runner_token_hash=runner.token_hash,
            expires_at=expires_at,
        )
    base = settings.CANOPY_PUBLIC_URL or conn.base_url
    return {"url": base + MCP_PATH, "token": token, "expiresAt": expires_at.isoformat()}


@dataclass(frozen=True)
class RunCaller:
    """What a live run token stands for: its run, that run's runner and connection generation,
    and the extension (with its current generation) the run's children are started under."""

    run_pk: int
    run_id: str
    runner_pk: int
    generation: int
    extension_id: str
    extension_generation: int | None
    # The runner token the run token was issued under: a rotation or revocation moves the
    # runner's own hash away from it, and the run token stops holding.
    runner_token_hash: str = ""


def authenticate_run_token(token: str) -> RunCaller | None:
    """The run a token authorises, or None when it is missing, wrong or dead."""
    if not token:
        return None
    found = (
        RunToken.objects.select_related("run", "run__runner")
        .filter(token_hash=hash_token(token))
        .first()
    )
    if found is None:
        return None
    run, runner = found.run, found.run.runner
    if (
        # A paused run is live (SPEC §14): its agent's pending calls (a wait on a child)
        # carry on once it is resumed, rather than failing while it is stopped.
        run.status not in (RunStatus.RUNNING, RunStatus.PAUSED)
        or found.expires_at <= timezone.now()
        or runner.revoked_at is not None
        or runner.token_hash != found.runner_token_hash
    ):
        return None
    extension_id, generation = _extension_of(run)
    return RunCaller(
        run_pk=run.pk,
        run_id=run.run_id,
        runner_pk=runner.pk,
        generation=runner.connection_generation,
        extension_id=extension_id,
        extension_generation=generation,
        runner_token_hash=found.runner_token_hash,
    )


def _extension_of(run: Run) -> tuple[str, int | None]:
    """The run's extension and its registered generation; a run opened without one uses the
    runner's only extension (with several, there is no way to tell which one is meant)."""
    presets = ExtensionPreset.objects.filter(runner_id=run.runner_id)
    if run.extension_id:
        generation = (
            presets.filter(extension_id=run.extension_id)
            .values_list("generation", flat=True)
            .first()
        )
        return run.extension_id, generation
    extensions = set(presets.values_list("extension_id", "generation"))
    if len(extensions) == 1:
        return next(iter(extensions))
    return "", None


def run_of(caller: RunCaller) -> Run | None:
    return Run.objects.select_related(*RESULT_RELATED).filter(pk=caller.run_pk).first()

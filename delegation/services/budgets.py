"""Budgets (SPEC §10): limits on a run's subtree, set by runners, operators or at launch;
admission of children against every ancestor's budget; and the stop when usage or time
crosses a limit.

Locks, in the order every path takes them: run rows (ancestors before descendants), then
budget rows in pk order, then rollup rows (``rollups``). Admission locks the budget rows of the
parent's chain, so concurrent ``child.start`` calls under one budget are serialised and never
overshoot ``maxRuns``/``maxLive``. A crossing is noticed in the transaction that committed
the usage and acted on right after it (``enforce``), in transactions of its own that lock
the budget's run first: stopping a subtree takes run locks, which the usage transaction,
holding rollup rows, must not wait for.

``record_budget_event`` is the one function that stores ``budget-warning`` and
``budget-exceeded``: alerts hook there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from delegation.errors import BUDGET_EXHAUSTED, INVALID_PARAMS, RpcError
from delegation.models import AuditEntry, Budget, Event, Run, RunRollup, RunStatus
from delegation.selectors import live_descendants
from delegation.services import approvals, budget_pause, rollups, webhooks
from delegation.services.audit import audit, require_operator
from delegation.services.base import lock_run, store_server_event
from delegation.services.identity import Actor
from delegation.services.locks import retry_conflicts
from delegation.services.pause import request_resume
from delegation.services.run_actions import request_cancel
from delegation.wire import BudgetLimits, parse_model

log = logging.getLogger(__name__)

WARN_FRACTION = 0.8
BUDGET_ACTOR = Actor(label="budget", via=AuditEntry.Via.SYSTEM)

# wire name -> model column
COLUMNS = {
    "maxRuns": "max_runs",
    "maxLive": "max_live",
    "maxTokens": "max_tokens",
    "maxCostUsd": "max_cost_nanos",
    "maxSeconds": "max_seconds",
}


def limits_of(limits: BudgetLimits) -> dict[str, int]:
    """The limits a wire budget sets, as model columns (costs in nano-dollars)."""
    out = {}
    for name, value in limits.wire().items():
        if name not in COLUMNS:
            continue  # onLimit: not a limit (see on_limit_of)
        out[COLUMNS[name]] = rollups.cost_nanos(value) if name == "maxCostUsd" else value
    return out


def budget_wire(budget: Budget | None) -> dict | None:
    """A budget as every transport shows it: its limits (absent when unbounded) and state."""
    if budget is None:
        return None
    out = {}
    for name, column in COLUMNS.items():
        value = getattr(budget, column)
        if value is not None:
            out[name] = value / rollups.NANOS_PER_USD if name == "maxCostUsd" else value
    return {
        "limits": out,
        "setBy": budget.set_by,
        "warnedAt": budget.warned_at,
        "exceededAt": budget.exceeded_at,
        "exceededReason": budget.exceeded_reason,
        "onLimit": budget.on_limit,
    }


# --- Setting a budget -----------------------------------------------------------------------


def _ancestor_budgets(run: Run) -> list[Budget]:
    return list(Budget.objects.filter(run_id__in=run.ancestry).order_by("run_id"))


def set_runner_budget(run: Run, limits: BudgetLimits, where: str, runner_label: str) -> Budget:
    """A runner's budget (``run.open``'s ``budget``, ``request.options.budget``): it may only
    narrow, never exceed an ancestor's limit or raise (or drop) one already set on the run.

    The caller holds ``run`` locked and refuses the call on error (nothing written).
    """
    wanted = limits_of(limits)
    for ancestor in _ancestor_budgets(run):
        for column, value in wanted.items():
            cap = getattr(ancestor, column)
            if cap is not None and value > cap:
                raise RpcError(
                    INVALID_PARAMS,
                    f"{where}.{_name(column)}: {_show(column, value)} exceeds the budget of run "
                    f"{_run_id(ancestor.run_id)} ({_show(column, cap)}); a runner may only narrow",
                )
    existing = Budget.objects.select_for_update().filter(run=run).first()
    if existing is not None:
        for column in COLUMNS.values():
            current = getattr(existing, column)
            value = wanted.get(column)
            if current is not None and (value is None or value > current):
                raise RpcError(
                    INVALID_PARAMS,
                    f"{where}.{_name(column)}: may not raise or drop the run's "
                    f"{_show(column, current)}; only an operator can raise a budget",
                )
        for column, value in wanted.items():
            setattr(existing, column, value)
        if limits.on_limit is not None:
            existing.on_limit = limits.on_limit
        existing.set_by = runner_label
        existing.updated_at = timezone.now()
        existing.save()
        return existing
    budget = Budget.objects.create(
        run=run, set_by=runner_label, on_limit=limits.on_limit or "cancel", **wanted
    )
    RunRollup.objects.filter(pk=run.pk).update(budgeted=True)
    return budget


def launch_budget(run: Run, limits: BudgetLimits, actor: Actor) -> Budget:
    """The budget an operator sets when launching ``run`` (a new top-level run: no ancestor
    budget to respect). The caller holds the operator role and the launch's transaction."""
    budget = Budget.objects.create(
        run=run, set_by=actor.label, on_limit=limits.on_limit or "cancel", **limits_of(limits)
    )
    RunRollup.objects.filter(pk=run.pk).update(budgeted=True)
    return budget


def _name(column: str) -> str:
    return next(n for n, c in COLUMNS.items() if c == column)


def _show(column: str, value: int) -> str:
    if column == "max_cost_nanos":
        return f"${value / rollups.NANOS_PER_USD:g}"
    return str(value)


def _run_id(pk: int) -> str:
    return Run.objects.filter(pk=pk).values_list("run_id", flat=True).first() or str(pk)


@retry_conflicts
def do_set_budget(actor: Actor, run: Run, limits: BudgetLimits, *, replace: bool, reason=""):
    """An operator sets (``replace``: exactly these limits) or changes (merge) a run's budget.

    Needs the operator role, audited; the budget is re-armed (a new warning and stop may
    follow) and checked at once, so a limit lowered below what is used stops the subtree.
    """
    require_operator(actor, "budget", "run", run.run_id, reason)
    wanted = limits_of(limits)
    with transaction.atomic():
        run = lock_run(run.pk)
        budget = Budget.objects.select_for_update().filter(run=run).first()
        before = budget_wire(budget)["limits"] if budget is not None else {}
        if budget is None:
            budget = Budget(run=run)
        for column in COLUMNS.values():
            if replace or column in wanted:
                setattr(budget, column, wanted.get(column))
        if limits.on_limit is not None or replace:
            budget.on_limit = limits.on_limit or "cancel"
        budget.set_by = actor.label
        budget.warned_at = None
        budget.exceeded_at = None
        budget.exceeded_reason = ""
        budget.updated_at = timezone.now()
        budget.save()
        RunRollup.objects.filter(pk=run.pk).update(budgeted=True)
        after = budget_wire(budget)["limits"]
        audit(
            actor,
            "budget",
            "run",
            run.run_id,
            "set",
            reason=reason,
            detail={"before": before, "after": after},
        )
        # The tree rows show budgets: touch the run so live views pick the change up.
        Run.objects.filter(pk=run.pk).update(updated_at=timezone.now())
    enforce([run.pk])
    return budget_wire(budget)


# --- Admission ------------------------------------------------------------------------------


@dataclass
class Exhausted:
    budget_run_id: str
    limit: str
    message: str

    def error(self) -> RpcError:
        return RpcError(
            BUDGET_EXHAUSTED,
            self.message,
            data={"budgetRunId": self.budget_run_id, "limit": self.limit},
        )


def admit_child(parent: Run) -> Exhausted | None:
    """Whether one more descendant may start under ``parent``, against every budget on its
    chain. Locks those budget rows (pk order) until the caller commits, so the rollup counts
    read here cannot change under a concurrent start."""
    # Long because each limit (runs, live, tokens, cost) is checked in turn against
    # the same locked rows; a refusal names the first one exhausted.
    chain = rollups.chain_of(parent)
    budgets = list(Budget.objects.select_for_update().filter(run_id__in=chain).order_by("run_id"))
    if not budgets:
        return None
    pks = [b.run_id for b in budgets]
    tallies = {
        row["pk"]: row
        for row in RunRollup.objects.filter(pk__in=pks).values(
            "pk",
            "sub_running",
            "sub_succeeded",
            "sub_failed",
            "sub_cancelled",
            "sub_lost",
            "sub_tokens_in",
            "sub_tokens_out",
            "sub_cost_nanos",
            "run__status",
            "run__run_id",
        )
    }
    for budget in budgets:
        tally = tallies.get(budget.run_id)
        if tally is None:
            continue
        run_id = tally["run__run_id"]
        # A paused run is live too (it counts in sub_running).
        self_running = 1 if tally["run__status"] in (RunStatus.RUNNING, RunStatus.PAUSED) else 0
        runs = sum(tally[c] for c in set(rollups.STATUS_COLUMNS.values())) - 1
        live = tally["sub_running"] - self_running
        tokens = tally["sub_tokens_in"] + tally["sub_tokens_out"]
        if budget.exceeded_at is not None:
            return Exhausted(
                run_id,
                "exceeded",
                f"budget exhausted: the budget of run {run_id} was exceeded "
                f"({budget.exceeded_reason})",
            )
        if budget.max_runs is not None and runs + 1 > budget.max_runs:
            return Exhausted(
                run_id,
                "maxRuns",
                f"budget exhausted: run {run_id} allows {budget.max_runs} descendants "
                f"(maxRuns) and {runs} have started",
            )
        if budget.max_live is not None and live + 1 > budget.max_live:
            return Exhausted(
                run_id,
                "maxLive",
                f"budget exhausted: run {run_id} allows {budget.max_live} live descendants "
                f"(maxLive) and {live} are running",
            )
        if budget.max_tokens is not None and tokens >= budget.max_tokens:
            return Exhausted(
                run_id,
                "maxTokens",
                f"budget exhausted: run {run_id} allows {budget.max_tokens} tokens "
                f"(maxTokens) and its subtree used {tokens}",
            )
        if budget.max_cost_nanos is not None and tally["sub_cost_nanos"] >= budget.max_cost_nanos:
            return Exhausted(
                run_id,
                "maxCostUsd",
                f"budget exhausted: run {run_id} allows "
                f"${budget.max_cost_nanos / rollups.NANOS_PER_USD:g} (maxCostUsd) and its "
                f"subtree cost ${tally['sub_cost_nanos'] / rollups.NANOS_PER_USD:g}",
            )
    return None


# --- Crossing a limit -----------------------------------------------------------------------


def budgets_to_check(chain: list[int]) -> list[int]:
    """After usage on ``chain`` (inside the usage transaction, after the rollup update): the
    budget runs on it that have reached 80% or all of a usage limit and still need a warning
    or a stop. One indexed query, raw because it runs on every frame with usage; nothing is
    locked."""
    budget = connection.ops.quote_name(Budget._meta.db_table)
    rollup = connection.ops.quote_name(RunRollup._meta.db_table)
    marks = ", ".join(["%s"] * len(chain))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT b.run_id, b.max_tokens, b.max_cost_nanos, b.warned_at, r.sub_tokens_in, "
            f"r.sub_tokens_out, r.sub_cost_nanos FROM {budget} b JOIN {rollup} r "
            f"ON r.run_id = b.run_id WHERE b.run_id IN ({marks}) AND b.exceeded_at IS NULL "
            "AND (b.max_tokens IS NOT NULL OR b.max_cost_nanos IS NOT NULL)",
            list(chain),
        )
        rows = cursor.fetchall()
    due = []
    for pk, max_tokens, max_cost, warned_at, tokens_in, tokens_out, cost in rows:
        fraction = max(_fraction(tokens_in + tokens_out, max_tokens), _fraction(cost, max_cost))
        if fraction >= 1 or (fraction >= WARN_FRACTION and warned_at is None):
            due.append(pk)
    return due


def _fraction(used, cap) -> float:
    if cap is None:
        return 0.0
    return used / cap if cap else 1.0


def record_budget_event(run: Run, kind: str, text: str, data: dict) -> Event:
    """Store ``budget-warning`` or ``budget-exceeded`` on the budget's run (held locked by the
    caller). The one place these events are written: alerts and metrics hook here."""
    assert kind in ("budget-warning", "budget-exceeded"), kind
    event = store_server_event(run, kind, actor=BUDGET_ACTOR.label, text=text, data=data)
    # Stored in the same transaction as the event: the alert commits (or not) with it.
    webhooks.enqueue_alert(kind, {**webhooks.run_payload(run), "reason": text, "budget": data})
    return event


def _usage_state(budget: Budget, rollup: RunRollup | None, run: Run, now) -> list[tuple]:
    """(limit name, used, cap, fraction) for each limit that can be crossed."""
    states = []
    tokens = (rollup.sub_tokens_in + rollup.sub_tokens_out) if rollup else 0
    cost = rollup.sub_cost_nanos if rollup else 0
    # SPEC §14: time the budget's run spent paused does not count.
    seconds = (now - run.created_at).total_seconds() - run.paused_for(now)
    for name, used, cap in (
        ("maxTokens", tokens, budget.max_tokens),
        ("maxCostUsd", cost, budget.max_cost_nanos),
        ("maxSeconds", seconds, budget.max_seconds),
    ):
        if cap is None:
            continue
        fraction = used / cap if cap else 1.0
        states.append((name, used, cap, fraction))
    return states


def _show_used(name: str, value) -> str:
    if name == "maxCostUsd":
        return f"${value / rollups.NANOS_PER_USD:.6g}"
    if name == "maxSeconds":
        return f"{value:.0f}s"
    return f"{value}"


def _in_dollars(name: str, value):
    """Event and webhook data give money in dollars, as REST and the wire do (nanos stay inside)."""
    return value / rollups.NANOS_PER_USD if name == "maxCostUsd" else value


def enforce(budget_run_pks, now=None) -> list[str]:
    """Warn at 80% (once) and stop the subtree at 100% of a budget's tokens, cost or time.

    Runs after the transaction that committed the usage, one transaction per budget, each
    re-checked under its run's lock (safe from every process at once). Returns the runIds of
    the budgets that stopped their subtree here.
    """
    stopped = []
    for pk in sorted(set(budget_run_pks)):
        try:
            if _enforce_one(pk, now):
                stopped.append(pk)
        except Exception:  # one budget's failure must not keep the others from stopping
            log.exception("budget enforcement of run %s failed", pk)
    return stopped


@retry_conflicts
def _enforce_one(pk: int, now=None) -> bool:
    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).filter(pk=pk).first()
        if run is None:
            return False
        budget = Budget.objects.filter(run=run).first()
        if budget is None or budget.exceeded_at is not None:
            return False
        rollup = RunRollup.objects.filter(pk=pk).first()
        if rollup is not None and rollup.sub_running == 0:
            return False  # nothing left to stop: a finished tree does not cross anything
        now = now or timezone.now()
        states = _usage_state(budget, rollup, run, now)
        # The warning first, also when one usage event jumps past 80% and 100% at once:
        # an alert rule on warnings must fire before the stop it announces.
        warn = [s for s in states if s[3] >= WARN_FRACTION]
        if warn and budget.warned_at is None:
            _warn(run, budget, *warn[0], now=now)
        crossed = [s for s in states if s[3] >= 1]
        if crossed:
            _exceed(run, budget, rollup, *crossed[0][:3], now=now)
            return True
        return False


def _warn(run: Run, budget: Budget, name: str, used, cap, fraction, *, now) -> None:
    cap_text = _show_used(name, cap) if name != "maxSeconds" else f"{cap}s"
    record_budget_event(
        run,
        "budget-warning",
        f"budget warning: {fraction:.0%} of {name} {cap_text} used",
        {
            "limit": name,
            "cap": _in_dollars(name, cap),
            "used": _in_dollars(name, used),
            "budgetRunId": run.run_id,
        },
    )
    Budget.objects.filter(pk=budget.pk).update(warned_at=now, updated_at=now)


def _exceed(run: Run, budget: Budget, rollup, name: str, used, cap, *, now) -> None:
    cap_text = _show_used(name, cap) if name != "maxSeconds" else f"{cap}s"
    reason = f"budget exceeded: {name} {cap_text} (used {_show_used(name, used)})"
    record_budget_event(
        run,
        "budget-exceeded",
        f"{reason}; stopping run {run.run_id} and its subtree",
        {
            "limit": name,
            "cap": _in_dollars(name, cap),
            "used": _in_dollars(name, used),
            "budgetRunId": run.run_id,
            "tokens": (rollup.sub_tokens_in + rollup.sub_tokens_out) if rollup else 0,
            "costUsd": _in_dollars("maxCostUsd", rollup.sub_cost_nanos if rollup else 0),
        },
    )
    if budget.on_limit == "pause":
        budget_pause.pause_at_limit(run, budget, reason, name, used, cap)
    else:
        _stop_subtree(run, reason)
    Budget.objects.filter(pk=budget.pk).update(
        exceeded_at=now, exceeded_reason=reason, updated_at=now
    )


def _stop_subtree(run: Run, reason: str) -> None:
    """Cancel the budget's run and every live descendant, top-down, audited as ``budget``.

    Listed again after each pass: a child admitted while this transaction waited for its
    parent's lock is stopped too.
    """
    report = {"runId": run.run_id, "outcome": request_cancel(BUDGET_ACTOR, run, reason)}
    descendants = []
    seen = set()
    for _ in range(3):
        fresh = [d for d in live_descendants(run) if d.pk not in seen]
        if not fresh:
            break
        for descendant in fresh:
            seen.add(descendant.pk)
            descendants.append(
                {
                    "runId": descendant.run_id,
                    "depth": descendant.depth,
                    "outcome": request_cancel(BUDGET_ACTOR, descendant, reason),
                }
            )
    report["descendants"] = descendants
    audit(
        BUDGET_ACTOR,
        "cancel-subtree",
        "run",
        run.run_id,
        report["outcome"],
        reason=reason,
        detail=report,
    )


def _budget_decided(actor: Actor, approval, run: Run, decision: str, updated_input) -> None:
    """SPEC §14: allowing a budget's approval raises its limits (``updatedInput.limits``)
    and resumes the subtree; denying it cancels the subtree. Under the decision's locks."""
    budget = Budget.objects.select_for_update().get(run=run)
    if decision != "allow":
        _stop_subtree(
            run, f"{budget.exceeded_reason or 'budget exceeded'}; cancelled by {actor.label}"
        )
        return
    raw = updated_input.get("limits") if isinstance(updated_input, dict) else None
    if raw is not None:
        for column, value in limits_of(
            parse_model(BudgetLimits, raw, "updatedInput.limits")
        ).items():
            setattr(budget, column, value)
    budget.warned_at = budget.exceeded_at = None
    budget.exceeded_reason = ""
    budget.set_by = actor.label
    budget.updated_at = timezone.now()
    budget.save()
    for each in [run, *live_descendants(run)]:
        request_resume(actor, each)


approvals.DECISION_HOOKS[budget_pause.KIND] = _budget_decided


def sweep_budgets(now=None) -> list[int]:
    """The upkeep's share: budgets whose time is at 80% or past ``maxSeconds`` (usage limits
    are enforced as usage commits). Returns the budget runs stopped."""
    now = now or timezone.now()
    rows = Budget.objects.filter(
        max_seconds__isnull=False, exceeded_at__isnull=True, run__rollup__sub_running__gt=0
    ).select_related("run")
    due = []
    for budget in rows:
        pk, max_seconds, warned_at = budget.run_id, budget.max_seconds, budget.warned_at
        elapsed = (now - budget.run.created_at).total_seconds() - budget.run.paused_for(now)
        if elapsed >= max_seconds or (warned_at is None and elapsed >= WARN_FRACTION * max_seconds):
            due.append(pk)
    return enforce(due, now) if due else []

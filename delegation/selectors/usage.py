"""Reads of rollups and budgets (SPEC §10), in the one shape every view shows.

The figures are read from the rollup and budget rows kept current by
``services.rollups``/``services.budgets``, joined into the query that reads the runs: never a
scan of the subtree. A run without a rollup row (data written before rollups existed) shows
zeros.
"""

from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import F
from django.utils import timezone

NANOS_PER_USD = 1_000_000_000

_ROLLUP = (
    "own_tokens_in",
    "own_tokens_out",
    "own_cache_read",
    "own_cache_write",
    "own_cost_nanos",
    "own_usage_events",
    "own_unpriced_usage",
    "sub_unpriced_usage",
    "sub_tokens_in",
    "sub_tokens_out",
    "sub_cache_read",
    "sub_cache_write",
    "sub_cost_nanos",
    "sub_running",
    "sub_succeeded",
    "sub_failed",
    "sub_cancelled",
    "sub_lost",
    "sub_last_finished_at",
)
_BUDGET = (
    "max_runs",
    "max_live",
    "max_tokens",
    "max_cost_nanos",
    "max_seconds",
    "set_by",
    "warned_at",
    "exceeded_at",
    "exceeded_reason",
    "on_limit",
)
_PREFIX = "_u_"
_BPREFIX = "_b_"


def usage_values(prefix: str = "") -> dict:
    """Named expressions for ``QuerySet.values()``: the rollup and budget of each run (a
    join each). ``prefix`` is the path to the run (``"parent__"`` and the like)."""
    fields = {f"{_PREFIX}{name}": F(f"{prefix}rollup__{name}") for name in _ROLLUP}
    fields.update({f"{_BPREFIX}{name}": F(f"{prefix}budget__{name}") for name in _BUDGET})
    fields[f"{_BPREFIX}pk"] = F(f"{prefix}budget__run_id")
    return fields


def _usd(nanos) -> float:
    return (nanos or 0) / NANOS_PER_USD


def usage_shape(rollup: dict, created_at, finished_at, now=None) -> dict:
    """``usage``: the run's own figures and its subtree's (itself included)."""
    get = lambda name: rollup.get(name) or 0  # noqa: E731
    runs = {
        "running": get("sub_running"),
        "succeeded": get("sub_succeeded"),
        "failed": get("sub_failed"),
        "cancelled": get("sub_cancelled"),
        "lost": get("sub_lost"),
    }
    runs["total"] = sum(runs.values())
    # Wall time of the subtree: from this run's start to its subtree's last end, or to now
    # while any run of it is live.
    end = rollup.get("sub_last_finished_at") or finished_at
    if runs["running"] or end is None:
        end = now or timezone.now()
    wall = max(0.0, (end - created_at).total_seconds()) if created_at is not None else 0.0
    return {
        "own": {
            "inputTokens": get("own_tokens_in"),
            "outputTokens": get("own_tokens_out"),
            "cacheReadTokens": get("own_cache_read"),
            "cacheWriteTokens": get("own_cache_write"),
            "costUsd": _usd(get("own_cost_nanos")),
            "usageEvents": get("own_usage_events"),
            # Usage events with tokens but no cost and no price: costUsd leaves them out.
            "unpricedEvents": get("own_unpriced_usage"),
        },
        "subtree": {
            "inputTokens": get("sub_tokens_in"),
            "outputTokens": get("sub_tokens_out"),
            "cacheReadTokens": get("sub_cache_read"),
            "cacheWriteTokens": get("sub_cache_write"),
            "costUsd": _usd(get("sub_cost_nanos")),
            "unpricedEvents": get("sub_unpriced_usage"),
            "runs": runs,
            "live": runs["running"],
            "wallSeconds": round(wall, 3),
        },
    }


def budget_shape(budget: dict | None, usage: dict, created_at, now=None) -> dict | None:
    """``budget``: its limits (absent = unbounded), what each has used, and its state."""
    if budget is None:
        return None
    now = now or timezone.now()
    sub = usage["subtree"]
    used = {
        "maxRuns": sub["runs"]["total"] - 1,
        "maxLive": sub["live"] - (1 if budget.get("self_running") else 0),
        "maxTokens": sub["inputTokens"] + sub["outputTokens"],
        "maxCostUsd": sub["costUsd"],
        "maxSeconds": round(max(0.0, (now - created_at).total_seconds()), 3)
        if created_at is not None
        else 0,
    }
    limits = {}
    for name, column in (
        ("maxRuns", "max_runs"),
        ("maxLive", "max_live"),
        ("maxTokens", "max_tokens"),
        ("maxCostUsd", "max_cost_nanos"),
        ("maxSeconds", "max_seconds"),
    ):
        value = budget.get(column)
        if value is None:
            continue
        cap = _usd(value) if name == "maxCostUsd" else value
        limits[name] = {
            "limit": cap,
            "used": max(0, used[name]),
            "fraction": round(min(used[name] / cap, 9.99), 4) if cap else 1.0,
        }
    # Some of the subtree's usage has no price: the cost used is a lower bound only.
    unbounded = ""
    if "maxCostUsd" in limits and sub.get("unpricedEvents"):
        unbounded = (
            f"cannot bound cost: {sub['unpricedEvents']} usage event(s) of this subtree "
            "have no cost and no price for their model"
        )
    return {
        "limits": limits,
        "costUnbounded": unbounded,
        "setBy": budget.get("set_by") or "",
        "warnedAt": budget.get("warned_at"),
        "exceededAt": budget.get("exceeded_at"),
        "exceededReason": budget.get("exceeded_reason") or "",
        "onLimit": budget.get("on_limit") or "cancel",
    }


def pop_usage(row: dict, created_at, finished_at, status: str, now=None) -> tuple[dict, dict]:
    """Take the ``usage_values`` keys out of a values() row; return (usage, budget)."""
    rollup = {name: row.pop(f"{_PREFIX}{name}", None) for name in _ROLLUP}
    budget = {name: row.pop(f"{_BPREFIX}{name}", None) for name in _BUDGET}
    has_budget = row.pop(f"{_BPREFIX}pk", None) is not None
    usage = usage_shape(rollup, created_at, finished_at, now)
    if not has_budget:
        return usage, None
    budget["self_running"] = status in ("running", "paused")  # a paused run is live
    return usage, budget_shape(budget, usage, created_at, now)


def usage_rows(run_pks) -> list[dict]:
    """``{"pk", "task", "usage", "budget"}`` of each run, one query (for the export)."""
    from delegation.models import Run

    now = timezone.now()
    rows = []
    for row in (
        Run.objects.filter(pk__in=list(run_pks))
        .order_by("pk")
        .values("pk", "task", "created_at", "finished_at", "status", **usage_values())
    ):
        created, finished, status = row.pop("created_at"), row.pop("finished_at"), row.pop("status")
        usage, budget = pop_usage(row, created, finished, status, now)
        rows.append({"pk": row["pk"], "task": row["task"], "usage": usage, "budget": budget})
    return rows


def _related(run, name):
    try:
        return getattr(run, name)
    except ObjectDoesNotExist:
        return None


def usage_of_run(run, now=None) -> tuple[dict, dict | None]:
    """(usage, budget) of one run: no query when it was read with
    ``select_related("rollup", "budget")``, one each otherwise."""
    rollup = _related(run, "rollup")
    rollup_row = {name: getattr(rollup, name) for name in _ROLLUP} if rollup else {}
    usage = usage_shape(rollup_row, run.created_at, run.finished_at, now)
    budget = _related(run, "budget")
    if budget is None:
        return usage, None
    budget_row = {name: getattr(budget, name) for name in _BUDGET}
    budget_row["self_running"] = run.status in ("running", "paused")
    return usage, budget_shape(budget_row, usage, run.created_at, now)


# A tree node's share, lean because a subtree may have 10,000 of them: integer columns only
# (nothing for the driver to convert), the subtree's run count summed in SQL.
_TREE_COLUMNS = {
    "_t_own_in": "rollup__own_tokens_in",
    "_t_own_out": "rollup__own_tokens_out",
    "_t_own_cost": "rollup__own_cost_nanos",
    "_t_in": "rollup__sub_tokens_in",
    "_t_out": "rollup__sub_tokens_out",
    "_t_cost": "rollup__sub_cost_nanos",
    "_t_unpriced": "rollup__sub_unpriced_usage",
    "_t_live": "rollup__sub_running",
    "_t_budget": "budget__run_id",
    "_t_max_runs": "budget__max_runs",
    "_t_max_live": "budget__max_live",
    "_t_max_tokens": "budget__max_tokens",
    "_t_max_cost": "budget__max_cost_nanos",
    "_t_max_seconds": "budget__max_seconds",
    "_t_stopped": "budget__exceeded_reason",
}


def tree_usage_values() -> dict:
    fields = {name: F(path) for name, path in _TREE_COLUMNS.items()}
    fields["_t_runs"] = (
        F("rollup__sub_running")
        + F("rollup__sub_succeeded")
        + F("rollup__sub_failed")
        + F("rollup__sub_cancelled")
        + F("rollup__sub_lost")
    )
    return fields


def pop_tree_usage(row: dict) -> None:
    """Replace a tree node's ``tree_usage_values`` with ``usage`` and ``budget``, compactly:
    the subtree's tokens, cost, runs and live runs, the run's own tokens and cost, and the
    budget's limits and stop reason (the run's detail has the rest)."""
    pop = row.pop
    row["usage"] = {
        "own": {
            "inputTokens": pop("_t_own_in") or 0,
            "outputTokens": pop("_t_own_out") or 0,
            "costUsd": (pop("_t_own_cost") or 0) / NANOS_PER_USD,
        },
        "subtree": {
            "inputTokens": pop("_t_in") or 0,
            "outputTokens": pop("_t_out") or 0,
            "costUsd": (pop("_t_cost") or 0) / NANOS_PER_USD,
            "unpricedEvents": pop("_t_unpriced") or 0,
            "runs": pop("_t_runs") or 0,
            "live": pop("_t_live") or 0,
        },
    }
    has_budget = pop("_t_budget") is not None
    limits = {
        "maxRuns": pop("_t_max_runs"),
        "maxLive": pop("_t_max_live"),
        "maxTokens": pop("_t_max_tokens"),
        "maxCostUsd": pop("_t_max_cost"),
        "maxSeconds": pop("_t_max_seconds"),
    }
    stopped = pop("_t_stopped")
    if not has_budget:
        row["budget"] = None
        return
    if limits["maxCostUsd"] is not None:
        limits["maxCostUsd"] /= NANOS_PER_USD
    row["budget"] = {
        "limits": {name: value for name, value in limits.items() if value is not None},
        "exceededReason": stopped or "",
    }

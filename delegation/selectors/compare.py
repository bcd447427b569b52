"""Two runs side by side (issue 25): their streams aligned step by step, and the deltas.

A step is an event that says what the agent did: a tool call (matched by tool name, in
order), a text, a result, an error. The two lists of steps are aligned on their keys (kind
and tool name) with the longest matching blocks first (``difflib``), so one extra tool call
in the middle shifts nothing after it. Bounded: the first ``MAX_STEPS`` steps of each run.
"""

from __future__ import annotations

from difflib import SequenceMatcher

from delegation.models import Event, Run
from delegation.selectors.usage import usage_of_run

STEP_KINDS = ("tool-use", "text", "result", "error", "thinking")
MAX_STEPS = 500
TEXT_CHARS = 200


def _steps(run: Run) -> list[dict]:
    rows = (
        Event.objects.filter(run=run, kind__in=STEP_KINDS)
        .order_by("sequence")
        .values_list("sequence", "kind", "tool_name", "text", "error")[:MAX_STEPS]
    )
    steps = []
    for sequence, kind, tool, text, error in rows:
        shown = (text or error or "").strip().splitlines()
        steps.append(
            {
                "sequence": sequence,
                "kind": kind,
                "toolName": tool or "",
                "text": (shown[0] if shown else "")[:TEXT_CHARS],
            }
        )
    return steps


def _side(run: Run) -> dict:
    usage, _budget = usage_of_run(run)
    own = usage["own"]
    end = run.finished_at
    return {
        "runId": run.run_id,
        "task": run.task,
        "profile": run.profile,
        "status": run.status,
        "error": run.error,
        "tokens": own["inputTokens"] + own["outputTokens"],
        "costUsd": own["costUsd"],
        "durationSeconds": (end - run.created_at).total_seconds() if end else None,
    }


def _delta(a, b):
    return None if a is None or b is None else b - a


def compare_runs(a: Run, b: Run) -> dict:
    left, right = _side(a), _side(b)
    steps_a, steps_b = _steps(a), _steps(b)
    keys = lambda steps: [(s["kind"], s["toolName"]) for s in steps]  # noqa: E731
    matcher = SequenceMatcher(a=keys(steps_a), b=keys(steps_b), autojunk=False)
    aligned = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        for offset in range(max(i2 - i1, j2 - j1)):
            one = steps_a[i1 + offset] if i1 + offset < i2 else None
            two = steps_b[j1 + offset] if j1 + offset < j2 else None
            same = op == "equal" and one["text"] == two["text"]
            change = (
                "same" if same else ("changed" if one and two else ("only-a" if one else "only-b"))
            )
            aligned.append({"a": one, "b": two, "change": change})
    return {
        "a": left,
        "b": right,
        "deltas": {
            "tokens": right["tokens"] - left["tokens"],
            "costUsd": right["costUsd"] - left["costUsd"],
            "durationSeconds": _delta(left["durationSeconds"], right["durationSeconds"]),
            "outcome": "same"
            if left["status"] == right["status"]
            else f"{left['status']} → {right['status']}",
        },
        "steps": aligned,
        "differences": sum(1 for step in aligned if step["change"] != "same"),
    }

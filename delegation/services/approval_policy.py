"""Pure policy evaluation (SPEC §11): which rule decides a request, and the strictest of a
chain of policies. No database here, so it is property-tested on its own."""

from __future__ import annotations

from fnmatch import fnmatchcase

from delegation.wire import canonical

STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
# The fields whose text is "the input" a rule's ``input`` glob reads, in order: a Bash
# command as the command, a file tool as its path. Anything else: its canonical JSON.
PRIMARY_FIELDS = ("command", "file_path", "path", "notebook_path", "url", "pattern", "query")


def flatten(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in PRIMARY_FIELDS:
            if isinstance(value.get(key), str):
                return value[key]
    return canonical(value)


def matches(match: dict, *, tool: str, kind: str, text: str) -> bool:
    if "tool" in match and not fnmatchcase(tool, match["tool"]):
        return False
    if "kind" in match and kind != match["kind"]:
        return False
    return not ("input" in match and not fnmatchcase(text, match["input"]))


def decide_one(policy: dict, *, tool: str, kind: str, text: str, trusted: bool = True) -> str:
    """The first matching rule's decision, else the default. An untrusted (agent-set)
    policy narrows only: its ``allow`` counts as no opinion."""
    decision = policy.get("default", "ask")
    for rule in policy.get("rules", []):
        if matches(rule.get("match", {}), tool=tool, kind=kind, text=text):
            decision = rule["decision"]
            break
    if not trusted and decision == "allow":
        return ""
    return decision


def strictest(decisions) -> str:
    """deny > ask > allow; "" (no opinion) is skipped; nothing at all is ``ask``."""
    given = [d for d in decisions if d]
    if not given:
        return "ask"
    return max(given, key=STRICTNESS.__getitem__)


def effective(chain, *, tool: str, kind: str, input) -> str:
    """``chain``: ``(policy dict, trusted)`` of each run from the root down that has one."""
    text = flatten(input)
    return strictest(
        decide_one(policy, tool=tool, kind=kind, text=text, trusted=trusted)
        for policy, trusted in chain
    )


def allow_always_rule(tool: str, input) -> dict:
    """The rule an operator's "allow always" adds: this command again for a command tool,
    else this tool."""
    if isinstance(input, dict) and isinstance(input.get("command"), str):
        return {"match": {"tool": tool, "input": _escaped(input["command"])}, "decision": "allow"}
    return {"match": {"tool": _escaped(tool)}, "decision": "allow"}


def _escaped(text: str) -> str:
    """A glob that matches exactly ``text`` (fnmatch's metacharacters bracketed)."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in text)

"""Pure policy evaluation (SPEC §11): which rule decides a request, and the strictest of a
chain of policies. No database here, so it is property-tested on its own."""

from __future__ import annotations

from fnmatch import fnmatchcase

from delegation.services.shell_commands import simple_commands
from delegation.wire import canonical

STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
# The fields whose text is "the input" a rule's ``input`` glob reads, in order: a Bash
# command as the command, a file tool as its path. Anything else: its canonical JSON.
PRIMARY_FIELDS = ("command", "file_path", "path", "notebook_path", "url", "pattern", "query")
SHELL_TOOLS = frozenset({"Bash"})
NOT_SHELL = object()  # ``commands`` of a request that is not a shell command line


def flatten(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in PRIMARY_FIELDS:
            if isinstance(value.get(key), str):
                return value[key]
    return canonical(value)


def is_shell(tool: str, kind: str) -> bool:
    """A request whose input is a shell command line (Claude Code's Bash, ACP's execute)."""
    return tool in SHELL_TOOLS or kind == "execute"


def matches(
    match: dict, *, tool: str, kind: str, text: str, decision: str = "ask", commands=NOT_SHELL
) -> bool:
    """Whether a rule's ``match`` covers the request. ``commands``: the simple commands of a
    shell request (``shell_commands.simple_commands``; None when unreadable)."""
    if "tool" in match and not fnmatchcase(tool, match["tool"]):
        return False
    if "kind" in match and kind != match["kind"]:
        return False
    return "input" not in match or input_matches(match["input"], text, commands, decision)


def input_matches(pattern: str, text: str, commands, decision: str) -> bool:
    """A glob against the input. For a shell command, an ``allow`` must match every simple
    command (an unreadable one, a substitution or a file redirection never does, except the
    exact command line an operator allowed always); a ``deny`` or ``ask`` matches the whole
    line or any one command, so chaining cannot slip past it either."""
    if commands is NOT_SHELL:
        return fnmatchcase(text, pattern)
    if decision == "allow":
        if _is_exact(pattern):
            return fnmatchcase(text, pattern)
        return bool(commands) and all(fnmatchcase(c, pattern) for c in commands)
    return fnmatchcase(text, pattern) or any(fnmatchcase(c, pattern) for c in commands or ())


def decide_one(
    policy: dict, *, tool: str, kind: str, text: str, trusted: bool = True, commands=NOT_SHELL
) -> str:
    """The first matching rule's decision, else the default. An untrusted (agent-set)
    policy narrows only: its ``allow`` counts as no opinion."""
    decision = policy.get("default", "ask")
    for rule in policy.get("rules", []):
        if matches(
            rule.get("match", {}),
            tool=tool,
            kind=kind,
            text=text,
            decision=rule["decision"],
            commands=commands,
        ):
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
    commands = simple_commands(text) if is_shell(tool, kind) else NOT_SHELL
    return strictest(
        decide_one(policy, tool=tool, kind=kind, text=text, trusted=trusted, commands=commands)
        for policy, trusted in chain
    )


def allow_always_rule(tool: str, input) -> dict:
    """The rule an operator's "allow always" adds: this command again for a command tool,
    else this tool."""
    if isinstance(input, dict) and isinstance(input.get("command"), str):
        return {"match": {"tool": tool, "input": _escaped(input["command"])}, "decision": "allow"}
    return {"match": {"tool": _escaped(tool)}, "decision": "allow"}


def _is_exact(pattern: str) -> bool:
    """A glob with no wildcard left once its bracketed metacharacters are taken as literal:
    what ``allow_always_rule`` writes for one command line."""
    for escape in ("[*]", "[?]", "[[]"):
        pattern = pattern.replace(escape, "")
    return not any(ch in pattern for ch in "*?[")


def _escaped(text: str) -> str:
    """A glob that matches exactly ``text`` (fnmatch's metacharacters bracketed)."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in text)

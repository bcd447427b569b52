"""Policy evaluation (SPEC §11), property-tested: the effective decision is never looser than
any ancestor's, a runner's or agent's policy can only narrow, an agent's never allows."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from delegation.services.approval_policy import (
    STRICTNESS,
    allow_always_rule,
    decide_one,
    effective,
    flatten,
)

DECISIONS = st.sampled_from(["allow", "ask", "deny"])
TOOLS = st.sampled_from(["Bash", "Edit", "Read", "mcp__x__y"])
MATCH = st.fixed_dictionaries(
    {},
    optional={
        "tool": st.sampled_from(["Bash", "Ed*", "mcp__*", "*"]),
        "kind": st.sampled_from(["read", "edit", "execute"]),
        "input": st.sampled_from(["touch *", "rm *", "*", "ls"]),
    },
)
POLICY = st.fixed_dictionaries(
    {
        "rules": st.lists(st.fixed_dictionaries({"match": MATCH, "decision": DECISIONS})),
        "default": DECISIONS,
    }
)
CHAIN = st.lists(st.tuples(POLICY, st.booleans()), max_size=5)
USE = st.tuples(
    TOOLS,
    st.sampled_from(["read", "edit", "execute", ""]),
    st.sampled_from(["touch a", "rm -rf /", "ls", "cat x"]),
)


@settings(max_examples=120, deadline=None)
@given(chain=CHAIN, use=USE)
def test_it_never_decides_looser_than_any_ancestor(chain, use):
    tool, kind, command = use
    decided = effective(chain, tool=tool, kind=kind, input={"command": command})
    for policy, trusted in chain:
        own = decide_one(policy, tool=tool, kind=kind, text=command, trusted=trusted)
        if own:
            assert STRICTNESS[decided] >= STRICTNESS[own]
    if not any(t for _, t in chain):
        assert decided != "allow"  # nothing trusted allowed it


@settings(max_examples=120, deadline=None)
@given(chain=CHAIN, extra=POLICY, trusted=st.booleans(), use=USE)
def test_it_lets_a_policy_below_only_narrow(chain, extra, trusted, use):
    tool, kind, command = use
    before = effective(chain, tool=tool, kind=kind, input={"command": command})
    after = effective([*chain, (extra, trusted)], tool=tool, kind=kind, input={"command": command})
    # With no trusted policy above, "ask" is only the absence of one: the first trusted
    # policy sets it. Below a trusted one, or from an agent, a policy only narrows.
    if any(t for _, t in chain) or not trusted:
        assert STRICTNESS[after] >= STRICTNESS[before]


def test_it_takes_the_first_matching_rule_and_the_default():
    policy = {
        "rules": [
            {"match": {"tool": "Bash", "input": "touch *"}, "decision": "allow"},
            {"match": {"tool": "Bash"}, "decision": "deny"},
        ],
        "default": "ask",
    }
    assert decide_one(policy, tool="Bash", kind="", text="touch x") == "allow"
    assert decide_one(policy, tool="Bash", kind="", text="rm x") == "deny"
    assert decide_one(policy, tool="Edit", kind="edit", text="a.py") == "ask"
    assert flatten({"command": "touch x", "description": "d"}) == "touch x"


def test_it_makes_allow_always_match_exactly_that_command():
    rule = allow_always_rule("Bash", {"command": "touch a*b?"})
    policy = {"rules": [rule], "default": "ask"}
    assert decide_one(policy, tool="Bash", kind="", text="touch a*b?") == "allow"
    assert decide_one(policy, tool="Bash", kind="", text="touch aXXbY") == "ask"

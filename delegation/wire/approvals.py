"""Strict shapes of SPEC §11: an approval policy, ``approval.request`` and a decision."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from delegation.wire.schemas import Strict, ValidId

ACP_KINDS = ("read", "edit", "delete", "move", "search", "execute", "think", "fetch", "other")
# SPEC §15: a hosted kodelet extension's ui.confirm/select/input asks the operator a question.
# Not a kind a rule matches (a policy decides tool uses, not answers).
REQUEST_KINDS = (*ACP_KINDS, "question")
MAX_RULES = 256
MAX_GLOB_CHARS = 4096
MAX_MESSAGE_CHARS = 10_000

Decision = Literal["allow", "ask", "deny"]


class Match(Strict):
    tool: str = Field(default=None, max_length=MAX_GLOB_CHARS)
    kind: Literal[ACP_KINDS] = Field(default=None)  # type: ignore[valid-type]
    input: str = Field(default=None, max_length=MAX_GLOB_CHARS)


class Rule(Strict):
    match: Match
    decision: Decision


class Policy(Strict):
    rules: list[Rule] = Field(default_factory=list, max_length=MAX_RULES)
    default: Decision = "ask"

    def plain(self) -> dict:
        """The stored form: every rule with only the match keys given."""
        return {
            "rules": [
                {"match": rule.match.wire(), "decision": rule.decision} for rule in self.rules
            ],
            "default": self.default,
        }


# Shipped policies a preset may name instead of spelling one out (``"approvals":
# "allow-reads"``). "allow-reads": what only reads (Claude Code's read-only tools, the ACP
# kinds that change nothing) runs at once; everything else, network fetches included (a URL
# can carry data out), waits for an operator.
READ_TOOLS = ("Read", "Glob", "Grep", "LS", "NotebookRead")
READ_KINDS = ("read", "search", "think")
SHIPPED_POLICIES: dict[str, dict] = {
    "allow-reads": {
        "rules": [
            *({"match": {"tool": tool}, "decision": "allow"} for tool in READ_TOOLS),
            *({"match": {"kind": kind}, "decision": "allow"} for kind in READ_KINDS),
        ],
        "default": "ask",
    }
}


class ApprovalRequestParams(Strict):
    run_id: ValidId = Field(alias="runId")
    tool_call_id: ValidId = Field(alias="toolCallId")
    tool_name: str = Field(alias="toolName", min_length=1, max_length=255)
    input: Any
    kind: Literal[REQUEST_KINDS] = Field(default=None)  # type: ignore[valid-type]
    title: str = Field(default=None, max_length=1024)
    # Beyond SPEC §11 (docs/explanation/spec-deviations.md): whether the asking door can run
    # an operator's edited input. Absent means it can (what every SPEC-only runner gets); the
    # acp engine sends false, since an ACP agent takes an option id and nothing else.
    can_edit: bool = Field(default=None, alias="canEdit")


class _Decision(Strict):
    message: str = Field(default=None, max_length=MAX_MESSAGE_CHARS)
    # With scope "always": where the allow rule goes (this run, or its tree's root).
    scope_run: Literal["run", "root"] = Field(default=None, alias="scopeRun")

    @field_validator("message")
    @classmethod
    def _message(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain NUL")
        return value


class AllowDecision(_Decision):
    decision: Literal["allow"]
    updated_input: dict[str, Any] = Field(default=None, alias="updatedInput")
    scope: Literal["once", "always"] = Field(default=None)


class DenyDecision(_Decision):
    """A deny edits nothing and adds no rule: the shape says so, so the published schema
    does too (a deny with ``updatedInput`` or scope ``always`` is not a valid body)."""

    decision: Literal["deny"]
    scope: Literal["once"] = Field(default=None)

    updated_input: ClassVar[None] = None  # read by the doors like an allow's


# SPEC §11's decision body, told apart by ``decision``.
DecisionBody = Annotated[AllowDecision | DenyDecision, Field(discriminator="decision")]

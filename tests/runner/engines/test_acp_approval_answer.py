"""The acp engine's answer to ``session/request_permission`` (SPEC §11): it asks Canopy with
``canEdit: false`` (an ACP agent takes an option id only), and an allow that nonetheless
carries another input (a server that ignored canEdit) is a reject: running the original
would not be what was decided (issue 35)."""

from __future__ import annotations

import asyncio

import pytest
from acp.schema import PermissionOption, ToolCallUpdate

from delegation.runner.acp.presets import AcpPreset
from delegation.runner.acp.session import Session

ASKED = {"command": "touch ORIGINAL-dangerous.txt"}
OPTIONS = [
    PermissionOption(option_id="yes", name="Allow", kind="allow_once"),
    PermissionOption(option_id="no", name="Reject", kind="reject_once"),
]


class Canopy:
    """The run context's one call the session makes here, answering as a server would."""

    def __init__(self, answer: dict):
        self.answer = answer
        self.asked: list[dict] = []

    async def ask_approval(self, tool_call_id, tool_name, input, **kwargs):
        self.asked.append({"toolCallId": tool_call_id, "input": input, **kwargs})
        return self.answer


async def _answer(answer: dict) -> tuple[str, Canopy, list[dict]]:
    canopy = Canopy(answer)
    queue: asyncio.Queue = asyncio.Queue()
    session = Session(canopy, AcpPreset("p", ["true"], ask_canopy=True), queue)
    call = ToolCallUpdate(tool_call_id="t-1", title="`touch`", kind="execute", raw_input=ASKED)
    response = await session.request_permission("s", call, OPTIONS)
    events = [queue.get_nowait() for _ in range(queue.qsize())]
    return getattr(response.outcome, "option_id", "cancelled"), canopy, events


@pytest.mark.parametrize(
    "answer, option",
    [
        ({"decision": "allow", "updatedInput": ASKED}, "yes"),
        ({"decision": "allow"}, "yes"),
        ({"decision": "allow", "updatedInput": {"command": "touch edited-safe.txt"}}, "no"),
        ({"decision": "deny", "message": "no"}, "no"),
    ],
)
async def test_it_runs_only_the_input_it_was_asked_about(answer, option):
    chosen, canopy, events = await _answer({"approvalId": "ap-1", "status": "decided", **answer})
    assert chosen == option
    assert canopy.asked == [
        {
            "toolCallId": "t-1",
            "input": ASKED,
            "kind": "execute",
            "title": "`touch`",
            "can_edit": False,
        }
    ]
    (permission,) = [e for e in events if e["kind"] == "permission"]
    assert permission["success"] is (option == "yes")
    if "touch edited" in str(answer):
        assert "edited input this ACP agent cannot run" in permission["text"]

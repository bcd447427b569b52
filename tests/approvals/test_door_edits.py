"""Every door applies exactly what was decided (SPEC §11, issue 35): an approval records
whether its door can run an edited input (``approval.request`` ``canEdit``; absent, it can).
Where it cannot (an ACP agent answers with an option id only), an edit is refused by the one
service, so REST, the admin and every other door answer the same, and the record and the
``approval.decided`` command hold the input as asked: what runs."""

from __future__ import annotations

import pytest

from delegation.errors import INVALID_PARAMS, RpcError
from delegation.models import Approval, AuditEntry, Command
from delegation.runner_socket import methods
from delegation.selectors.approvals import get_approval
from delegation.services import approvals
from delegation.services.identity import Actor

pytestmark = pytest.mark.django_db

ASKED = {"command": "touch ORIGINAL-dangerous.txt"}
EDITED = {"command": "touch edited-safe.txt"}


def _ask(world, call: str, **extra) -> dict:
    params = {
        "runId": "root-1",
        "toolCallId": call,
        "toolName": "Bash",
        "input": ASKED,
        "kind": "execute",
        **extra,
    }
    return methods.approval_request(world.conn, params)


def _decided(approval_id: str) -> list[dict]:
    return [
        c.params
        for c in Command.objects.filter(method="approval.decided")
        if c.params["approvalId"] == approval_id
    ]


def test_it_refuses_an_edit_for_a_door_that_cannot_run_one_and_records_what_ran(world, as_):
    asked = _ask(world, "t-acp", canEdit=False)
    url = f"/api/approvals/{asked['approvalId']}/decision"
    shown = as_("viewer").get(f"/api/approvals/{asked['approvalId']}").json()
    assert (shown["via"], shown["canEdit"]) == ("runner", False)

    refused = as_("operator").post(url, {"decision": "allow", "updatedInput": EDITED})
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert error["code"] == "edit_not_supported_by_door"
    assert "ACP" in error["message"] and asked["approvalId"] in error["message"]
    # Nothing was decided, sent or audited as a decision: the operator may still decide.
    assert Approval.objects.get(approval_id=asked["approvalId"]).status == "pending"
    assert _decided(asked["approvalId"]) == []
    assert not AuditEntry.objects.filter(action="approve").exists()

    allowed = as_("operator").post(url, {"decision": "allow"})
    assert allowed.status_code == 200, allowed.content
    assert allowed.json()["updatedInput"] is None
    assert Approval.objects.get(approval_id=asked["approvalId"]).updated_input is None
    assert _decided(asked["approvalId"]) == [
        {
            "approvalId": asked["approvalId"],
            "runId": "root-1",
            "decision": "allow",
            "updatedInput": ASKED,
        }
    ]


def test_it_keeps_the_edit_for_a_runner_that_says_nothing_or_that_it_can(world, as_):
    # A SPEC-only runner sends no canEdit: it is offered an edit, as SPEC §11 reads.
    for call, extra in (("t-spec", {}), ("t-can", {"canEdit": True})):
        asked = _ask(world, call, **extra)
        url = f"/api/approvals/{asked['approvalId']}/decision"
        assert as_("viewer").get(f"/api/approvals/{asked['approvalId']}").json()["canEdit"]
        done = as_("operator").post(url, {"decision": "allow", "updatedInput": EDITED})
        assert done.status_code == 200, done.content
        assert done.json()["updatedInput"] == EDITED
        assert _decided(asked["approvalId"])[0]["updatedInput"] == EDITED


def test_it_holds_the_rule_in_the_service_for_every_door(world, people):
    asked = _ask(world, "t-acp", canEdit=False)
    actor = Actor.for_user(people["admin"], via="admin")
    with pytest.raises(approvals.EditNotSupported, match="ACP"):
        approvals.do_decide_approval(
            actor=actor,
            approval=get_approval(asked["approvalId"]),
            decision="allow",
            updated_input=EDITED,
            scope="always",
        )
    approval = Approval.objects.get(approval_id=asked["approvalId"])
    assert approval.status == "pending" and approval.updated_input is None
    # A deny and a plain allow stay open to this door.
    approvals.do_decide_approval(actor=actor, approval=approval, decision="deny", message="no")
    assert Approval.objects.get(approval_id=asked["approvalId"]).decision == "deny"


@pytest.mark.parametrize("bad", ["false", 0, None, [False]])
def test_it_refuses_a_can_edit_that_is_not_a_boolean(world, bad):
    with pytest.raises(RpcError) as refused:
        _ask(world, "t-bad", canEdit=bad)
    assert refused.value.code == INVALID_PARAMS and "canEdit" in refused.value.message
    assert not Approval.objects.filter(tool_call_id="t-bad").exists()

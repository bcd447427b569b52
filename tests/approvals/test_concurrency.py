"""Approvals under concurrency (SPEC §11): two operators deciding at once get one decision
and one 409 (PostgreSQL: truly parallel writers)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from delegation.models import Approval, AuditEntry
from delegation.runner_socket import methods
from delegation.selectors.approvals import get_approval
from delegation.services import approvals
from delegation.services.identity import Actor
from tests.support.concurrency import parallel_writers, service_connection
from tests.support.personas import make_person

pytestmark = pytest.mark.django_db(transaction=True)


@parallel_writers
def test_it_gives_two_operators_deciding_at_once_one_decision_and_one_conflict():
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "c-root", "runId": "root", "extensionId": "ext"})
    asked = methods.approval_request(
        conn, {"runId": "root", "toolCallId": "t", "toolName": "Bash", "input": {"command": "x"}}
    )
    people = [make_person("operator"), make_person("admin")]
    barrier = threading.Barrier(2)
    outcomes = [None, None]

    def decide(i):
        try:
            barrier.wait(timeout=30)
            approvals.do_decide_approval(
                actor=Actor.for_user(people[i], via="api"),
                approval=get_approval(asked["approvalId"]),
                decision=("allow", "deny")[i],
            )
            outcomes[i] = "decided"
        except approvals.AlreadyDecided as exc:
            outcomes[i] = str(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(o == "decided" for o in outcomes) == [False, True], outcomes
    approval = Approval.objects.get(approval_id=asked["approvalId"])
    loser = next(o for o in outcomes if o != "decided")
    assert f"already decided: {approval.decision} by {approval.decided_by}" in loser
    assert AuditEntry.objects.filter(action="approve").count() == 2

"""SPEC §11: a run's approval policy in the admin — operators set and edit it through the
approvals service (checked, audited); viewers only read it."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from delegation.models import ApprovalPolicy, AuditEntry, Run
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def viewer_client(viewer) -> Client:
    return signed_in(viewer)


@pytest.fixture
def operator_client(operator) -> Client:
    return signed_in(operator)


ALLOW_LS = {"rules": [{"match": {"tool": "Bash", "input": "ls*"}, "decision": "allow"}]}
DENY_ALL = {"rules": [], "default": "deny"}


async def test_it_lets_an_operator_set_and_edit_a_runs_policy_through_the_service(
    runner, operator_client, viewer_client
):
    await runner.open("root-pol")

    def act():
        pk = Run.objects.get(run_id="root-pol").pk
        added = operator_client.post(
            "/admin/delegation/approvalpolicy/add/",
            {"run": pk, "policy": json.dumps(ALLOW_LS), "reason": "ls is fine"},
            follow=True,
        )
        assert added.status_code == 200, added.content.decode()[:2000]
        policy = ApprovalPolicy.objects.get(run__run_id="root-pol")
        assert policy.wire() == {**ALLOW_LS, "default": "ask"} and policy.source == "operator"
        entry = AuditEntry.objects.get(action="approval-policy")
        assert (entry.via, entry.actor, entry.target_id, entry.reason) == (
            "admin",
            "user:olga",
            "root-pol",
            "ls is fine",
        )
        url = f"/admin/delegation/approvalpolicy/{policy.pk}/change/"
        page = operator_client.get(url).content.decode()
        assert "ls*" in page and 'name="policy"' in page
        # A bad policy is refused naming what is wrong, and nothing changes.
        bad = {"rules": [{"match": {"tool": "Bash"}, "decision": "maybe"}]}
        refused = operator_client.post(url, {"policy": json.dumps(bad), "reason": ""})
        assert refused.status_code == 200
        assert "policy.rules[0].decision" in refused.content.decode()
        assert ApprovalPolicy.objects.get(pk=policy.pk).wire()["rules"] == ALLOW_LS["rules"]
        changed = operator_client.post(url, {"policy": json.dumps(DENY_ALL)}, follow=True)
        assert changed.status_code == 200
        assert ApprovalPolicy.objects.get(pk=policy.pk).wire() == DENY_ALL
        assert AuditEntry.objects.filter(action="approval-policy").count() == 2

        # A viewer reads the policy but cannot change it.
        view = viewer_client.get(url)
        assert view.status_code == 200 and "deny" in view.content.decode()
        assert 'name="policy"' not in view.content.decode()
        assert viewer_client.post(url, {"policy": json.dumps(ALLOW_LS)}).status_code == 403
        assert viewer_client.get("/admin/delegation/approvalpolicy/add/").status_code == 403
        assert ApprovalPolicy.objects.get(pk=policy.pk).wire() == DENY_ALL

    await database_sync_to_async(act)()

"""Issue 15 findings 10 and 13 (API tokens) over the real HTTP stack and database.

10: a signed-in user without a role learns nothing about what exists and cannot flood the
audit log; 13: API tokens may expire and may be read-only.
"""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from delegation.models import ApiToken, AuditEntry, Run
from delegation.services import tokens
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def page_text(response) -> str:
    # The CSRF token and CSP nonce change per response; the rest must not.
    text = response.content.decode()
    return re.sub(r'(csrfmiddlewaretoken" value|nonce)="[^"]*"', "", text)


def test_it_answers_a_roleless_user_the_same_whether_the_run_or_lease_exists(world, people):
    client = signed_in(people["outsider"])
    existing = client.post(f"/runs/{world.child['runId']}/cancel/")
    missing = client.post("/runs/no-such-run/cancel/")
    assert existing.status_code == missing.status_code == 403
    assert page_text(existing) == page_text(missing)
    assert "no role" in page_text(existing)
    lease = client.post(f"/leases/{world.lease_pk}/release/")
    no_lease = client.post("/leases/999999/release/")
    assert lease.status_code == no_lease.status_code == 403
    assert page_text(lease) == page_text(no_lease)
    assert not Run.objects.filter(cancel_requested_at__isnull=False).exists()


def test_it_audits_a_roleless_users_refusals_at_most_once_a_minute(world, people):
    from delegation.services.run_actions import Actor, do_cancel_run

    outsider = Actor.for_user(people["outsider"], via="api")
    run = Run.objects.get(run_id=world.child["runId"])
    for _ in range(20):
        with pytest.raises(Exception, match="needs operator"):
            do_cancel_run(outsider, run, reason="probe")
    refusals = AuditEntry.objects.filter(user=people["outsider"])
    assert refusals.count() == 1
    refusals.update(created_at=timezone.now() - timedelta(seconds=61))
    with pytest.raises(Exception, match="needs operator"):
        do_cancel_run(outsider, run, reason="probe")
    assert refusals.count() == 2
    # A viewer's refusals are audited every time: a viewer is someone the admins trust.
    viewer = Actor.for_user(people["viewer"], via="api")
    for _ in range(3):
        with pytest.raises(Exception, match="needs operator"):
            do_cancel_run(viewer, run, reason="probe")
    assert AuditEntry.objects.filter(user=people["viewer"]).count() == 3


def test_it_refuses_an_expired_api_token(client, world, people):
    api_token, token = tokens.create_api_token(
        people["operator"], "ci", expires_at=timezone.now() + timedelta(hours=1)
    )
    assert client.get("/api/runs", headers=bearer(token)).status_code == 200
    ApiToken.objects.filter(pk=api_token.pk).update(expires_at=timezone.now())
    refused = client.get("/api/runs", headers=bearer(token))
    assert refused.status_code == 401


def test_it_lets_a_read_only_token_of_an_operator_read_but_never_act(client, world, people):
    _, token = tokens.create_api_token(people["operator"], "dashboards", read_only=True)
    assert client.get("/api/runs", headers=bearer(token)).status_code == 200
    refused = client.post(
        f"/api/runs/{world.child['runId']}/cancel",
        "{}",
        content_type="application/json",
        headers=bearer(token),
    )
    assert refused.status_code == 403
    assert "read-only" in refused.json()["error"]["message"]
    assert not Run.objects.filter(cancel_requested_at__isnull=False).exists()


def test_it_creates_expiring_read_only_tokens_from_the_command_line(world, people):
    out = io.StringIO()
    call_command("api_token", "create", "olga", "--expires-in", "0.5", "--read-only", stdout=out)
    lines = out.getvalue().strip().splitlines()
    assert "read-only" in lines[0] and "expires" in lines[0]
    stored = ApiToken.objects.get(user=people["operator"], read_only=True)
    assert timedelta(hours=11) < stored.expires_at - timezone.now() <= timedelta(hours=12)
    assert tokens.authenticate_api_token(lines[-1]) is not None
    listing = io.StringIO()
    call_command("api_token", "list", stdout=listing)
    assert "active until" in listing.getvalue() and "read-only" in listing.getvalue()

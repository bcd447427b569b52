"""Django admin: every model registered, the actions go through the services and are audited."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.apps import apps
from django.contrib import admin
from django.test import Client

from delegation.models import AuditEntry, Event, Lease, Run, SteerReceipt
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db(transaction=True)


# Signed in before the test body (the personas are staff, as create_operator makes them).
@pytest.fixture
def viewer_client(viewer) -> Client:
    return signed_in(viewer)


@pytest.fixture
def operator_client(operator) -> Client:
    return signed_in(operator)


async def make_runs(runner):
    await runner.open("root-1")
    params = runner.child_params(request_id="c1")
    params["leaseId"] = "lease-1"
    params["request"]["leaseId"] = "lease-1"
    child = await runner.ok("child.start", params)
    grandchild = await runner.ok(
        "child.start", runner.child_params(run_id=child["runId"], request_id="g1")
    )
    return child["runId"], grandchild["runId"]


async def settle(runner, *methods):
    """Let the server finish sending (and recording answers to) the commands an action queued,
    so the database flush after the test does not race the runner socket's last writes."""
    for method in methods:
        await runner.wait_command(method)
    await runner.until_answered()


def action(client: Client, model: str, name: str, pks, **extra):
    return client.post(
        f"/admin/delegation/{model}/",
        {"action": name, "_selected_action": [str(pk) for pk in pks], **extra},
        follow=True,
    )


@pytest.mark.django_db
def test_it_registers_every_model_with_filters_and_search():
    for model in apps.get_app_config("delegation").get_models():
        assert admin.site.is_registered(model), model.__name__
    run_admin = admin.site._registry[Run]
    assert {"status", "depth", "runner", "profile"} <= set(run_admin.list_filter)
    assert "run_id" in run_admin.search_fields
    assert {"cancel_runs", "cancel_subtrees", "steer_runs"} <= {
        a.__name__ for a in run_admin.actions
    }


async def test_it_cancels_a_subtree_from_the_admin_with_an_audit_entry(runner, operator_client):
    child, grandchild = await make_runs(runner)

    def act():
        client = operator_client
        listing = client.get("/admin/delegation/run/?status__exact=running&depth=1")
        assert listing.status_code == 200 and child in listing.content.decode()
        assert client.get(f"/admin/delegation/run/?q={grandchild}").status_code == 200
        pk = Run.objects.get(run_id=child).pk
        response = action(client, "run", "cancel_subtrees", [pk])
        # The admin capitalises messages.
        assert f"{child}: requested (+1 descendants)" in response.content.decode().lower()
        entry = AuditEntry.objects.get(action="cancel-subtree")
        assert entry.via == "admin" and entry.actor == "user:olga" and entry.target_id == child
        assert Run.objects.get(run_id=grandchild).cancel_requested_at is not None

    await database_sync_to_async(act)()
    await runner.wait_command("run.cancel", runId=grandchild)
    await settle(runner)


async def test_it_pauses_and_resumes_a_subtree_from_the_admin(runner, operator_client):
    child, grandchild = await make_runs(runner)

    def act(name, verb):
        pk = Run.objects.get(run_id=child).pk
        response = action(operator_client, "run", name, [pk])
        assert f"{child}: {verb} (+1 below)" in response.content.decode().lower()
        entry = AuditEntry.objects.get(action=name.replace("_subtrees", "-subtree"))
        assert entry.via == "admin" and entry.target_id == child and entry.outcome == verb
        return Run.objects.get(run_id=grandchild).status

    assert await database_sync_to_async(act)("pause_subtrees", "paused") == "paused"
    command = await runner.wait_command("run.pause", runId=grandchild)
    assert command["params"]["reason"] == "from the admin"
    assert await database_sync_to_async(act)("resume_subtrees", "resumed") == "running"
    await runner.wait_command("run.resume", runId=grandchild)
    await settle(runner)


async def test_it_steers_through_the_intermediate_form_and_audits_it(runner, operator_client):
    child, _ = await make_runs(runner)

    def act():
        client = operator_client
        pk = Run.objects.get(run_id=child).pk
        form = action(client, "run", "steer_runs", [pk])
        body = form.content.decode()
        assert 'id="steer-form"' in body and child in body
        assert not Event.objects.filter(kind="steer").exists()  # nothing until the form is sent
        response = action(
            client,
            "run",
            "steer_runs",
            [pk],
            apply="1",
            message="wrap it up",
            request_id="admin-r1",
        )
        assert f"{child}: injected" in response.content.decode().lower()
        assert Event.objects.get(kind="steer").actor == "user:olga"
        assert SteerReceipt.objects.get(request_id="admin-r1").outcome == "injected"
        entry = AuditEntry.objects.get(action="steer")
        assert entry.via == "admin" and entry.outcome == "injected"

    await database_sync_to_async(act)()
    await runner.wait_command("run.steer", runId=child)
    await settle(runner)


async def test_it_releases_a_lease_and_refuses_a_viewer_in_the_admin(
    runner, viewer_client, operator_client
):
    await make_runs(runner)

    def act():
        lease = Lease.objects.get(lease_id="lease-1")
        viewer = viewer_client
        assert viewer.get("/admin/delegation/lease/").status_code == 200
        # The action is not offered to a viewer, and a forged post does nothing.
        assert "release_leases" not in viewer.get("/admin/delegation/lease/").content.decode()
        action(viewer, "lease", "release_leases", [lease.pk])
        lease.refresh_from_db()
        assert lease.state == "active"
        operator = operator_client
        response = action(operator, "lease", "release_leases", [lease.pk])
        assert "lease-1: released" in response.content.decode().lower()
        lease.refresh_from_db()
        assert lease.state == "released"
        entry = AuditEntry.objects.get(action="release")
        assert entry.via == "admin" and entry.actor == "user:olga"
        assert Event.objects.filter(kind="lease-released").exists()

    await database_sync_to_async(act)()
    await settle(runner, "lease.revoked", "run.cancel")


def test_it_limits_the_admin_steer_message_in_bytes_as_the_service_does():
    from delegation.admin import SteerForm
    from delegation.protocol import MAX_STEER_BYTES

    fits = SteerForm({"message": "é" * (MAX_STEER_BYTES // 2), "request_id": "r"})
    assert fits.is_valid(), fits.errors
    # Fewer characters than the limit, but more bytes of UTF-8.
    too_long = SteerForm({"message": "é" * (MAX_STEER_BYTES // 2 + 1), "request_id": "r"})
    assert not too_long.is_valid()
    assert too_long.errors["message"] == [f"At most {MAX_STEER_BYTES} bytes of UTF-8."]


# SPEC §7: admins also manage runner tokens, API tokens and users. The pages that manage them
# are refused to every other role; someone with no role is sent to the login page.
ADMIN_ONLY = [
    "/admin/delegation/apitoken/",
    "/admin/delegation/apitoken/{token}/change/",
    "/admin/auth/user/",
    "/admin/auth/user/add/",
    "/admin/auth/user/{user}/change/",
    "/admin/auth/group/",
    "/admin/delegation/runner/add/",
]
# The admin persona reaches the API-token pages. The user and runner-token pages are refused
# to it too today (it is not a superuser and holds no Django model permissions; the admin has
# no runner-token page at all): no case asserts that, as it is not a rule but a gap.
ADMIN_REACHES = ["/admin/delegation/apitoken/", "/admin/delegation/apitoken/{token}/change/"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("persona", "path"),
    [(p, path) for p in ("viewer", "operator", "outsider") for path in ADMIN_ONLY]
    + [("admin", path) for path in ADMIN_REACHES],
)
def test_it_keeps_the_admin_only_pages_to_admins(people, persona, path):
    from delegation.services import tokens

    token, secret = tokens.create_api_token(people["viewer"], "script")
    user = people[persona]
    url = path.format(token=token.pk, user=people["viewer"].pk)
    response = signed_in(user).get(url)
    if persona == "outsider":
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    elif persona == "admin":
        assert response.status_code == 200
        body = response.content.decode()
        assert token.token_prefix in body and secret not in body and token.token_hash not in body
    else:
        assert response.status_code == 403, (persona, url)
        assert token.token_prefix not in response.content.decode()

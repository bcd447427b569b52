"""Actions through the engine's services: cancel (and cascade), steer (idempotent), release;
strict bodies with the field named; engine refusals mapped to HTTP statuses."""

import pytest

from delegation.models import AuditEntry, Command, Event, Lease, Run, SteerReceipt
from delegation.runner_socket import methods

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(as_):
    return as_("operator", "token")


def test_it_cancels_a_run_through_the_engine(api, world):
    child = world.child["runId"]
    response = api.post(f"/api/runs/{child}/cancel", {"reason": "runaway"})
    assert response.status_code == 200
    assert response.json() == {"runId": child, "outcome": "requested", "descendants": []}
    run = Run.objects.get(run_id=child)
    assert run.cancel_requested_at is not None and run.cancel_reason == "runaway"
    event = Event.objects.filter(run=run).order_by("-sequence").first()
    assert event.kind == "cancel-requested" and event.actor == "user:olga"
    assert Command.objects.filter(method="run.cancel", params__runId=child).exists()
    entry = AuditEntry.objects.get(action="cancel")
    assert (entry.via, entry.target_id, entry.reason, entry.outcome) == (
        "api", child, "runaway", "requested",
    )  # fmt: skip
    again = api.post(f"/api/runs/{child}/cancel")  # no body at all: allowed
    assert again.json()["outcome"] == "already-requested"


def test_it_cancels_a_subtree_reporting_each_descendant(api, world):
    response = api.post("/api/runs/root-1/cancel", {"cascade": True})
    assert response.status_code == 200
    report = response.json()
    assert report["outcome"] == "requested"
    outcomes = {d["runId"]: (d["depth"], d["outcome"]) for d in report["descendants"]}
    assert outcomes == {
        world.child["runId"]: (1, "requested"),
        world.grandchild["runId"]: (2, "requested"),
        world.leased["runId"]: (1, "requested"),
    }
    assert AuditEntry.objects.get(action="cancel-subtree").detail == report


def test_it_steers_with_the_same_idempotency_as_child_steer(api, world):
    path = f"/api/runs/{world.child['runId']}/steer"
    first = api.post(path, {"requestId": "s-1", "message": "focus on tests"})
    assert first.status_code == 200 and first.json() == {"outcome": "injected"}
    repeat = api.post(path, {"requestId": "s-1", "message": "focus on tests"})
    assert repeat.json() == {"outcome": "injected"}
    assert SteerReceipt.objects.count() == 1
    assert Event.objects.filter(kind="steer", run__run_id=world.child["runId"]).count() == 1
    conflict = api.post(path, {"requestId": "s-1", "message": "something else"})
    assert conflict.status_code == 409
    assert conflict.json()["error"] == {
        "code": "conflict",
        "message": "requestId: 's-1' was already used for this child with a different message",
        "rpcCode": -32013,
    }
    done = api.post(
        f"/api/runs/{world.finished['runId']}/steer", {"requestId": "s-2", "message": "hey"}
    )
    assert done.json() == {"outcome": "promptRequired", "reason": "noRunningTurn"}


def test_it_refuses_the_129th_steer_receipt_with_409(api, world):
    path = f"/api/runs/{world.child['runId']}/steer"
    for index in range(128):
        assert api.post(path, {"requestId": f"r{index}", "message": "m"}).status_code == 200
    refused = api.post(path, {"requestId": "r128", "message": "m"})
    assert refused.status_code == 409 and refused.json()["error"]["rpcCode"] == -32011


def test_it_releases_a_lease_by_its_id(api, world):
    path = f"/api/leases/{world.lease_pk}/release"
    response = api.post(path)
    assert response.status_code == 200
    body = response.json()
    assert body == {"done": False, "pending": [world.leased["runId"]], "state": "released"}
    lease = Lease.objects.get(pk=world.lease_pk)
    assert lease.state == "released"
    assert Run.objects.get(run_id=world.leased["runId"]).cancel_requested_at is not None
    assert Event.objects.filter(run__run_id="root-1", kind="lease-released").count() == 1
    assert Command.objects.filter(method="lease.revoked").count() == 1
    # The runner confirms the cancel; a repeated release then reports done.
    methods.finish_run(world.conn, {"runId": world.leased["runId"], "cancelled": True})
    again = api.post(path, {})
    assert again.status_code == 200
    assert again.json() == {"done": True, "pending": [], "state": "released"}
    outcomes = list(AuditEntry.objects.filter(action="release").values_list("outcome", flat=True))
    assert sorted(outcomes) == ["already-released", "released"]
    assert api.post("/api/leases/424242/release").status_code == 404


@pytest.mark.parametrize(
    ("raw", "status", "needle"),
    [
        ('{"reason": null}', 422, "reason: null is not allowed"),
        ('{"reason": 7}', 422, "reason"),
        ('{"cascade": "true"}', 422, "cascade"),
        ('{"cascade": 1}', 422, "cascade"),
        ('{"reason": "x", "apiKey": "secret"}', 422, "apiKey: unknown field"),
        ('{"Reason": "x"}', 422, "Reason: unknown field"),
        ('{"reason": "a\\u0000b"}', 422, "reason"),
        ('{"reason": "a", "reason": "b"}', 400, "duplicate key 'reason'"),
        ('{"reason": "a"} {}', 400, "body"),
        ('["reason"]', 400, "one JSON object"),
        ("{not json", 400, "body"),
        ('{"cascade": NaN}', 400, "NaN"),
    ],
)
def test_it_decodes_cancel_bodies_strictly(api, world, raw, status, needle):
    response = api.post(f"/api/runs/{world.child['runId']}/cancel", raw=raw)
    assert response.status_code == status, response.content
    assert needle in response.json()["error"]["message"]
    assert not Run.objects.filter(cancel_requested_at__isnull=False).exists()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"message": "hi"}, "requestId: required field missing"),
        ({"requestId": "a"}, "message: required field missing"),
        ({"requestId": "a", "message": "   "}, "message: must not be blank"),
        ({"requestId": "a/b", "message": "hi"}, "requestId"),
        ({"requestId": "..", "message": "hi"}, "requestId"),
        ({"requestId": "x" * 129, "message": "hi"}, "requestId"),
        ({"requestId": "a", "message": "é" * 5001}, "message: must be at most 10000 bytes"),
        ({"requestId": "a", "message": "hi", "extra": 1}, "extra: unknown field"),
        ({"request_id": "a", "message": "hi"}, "request_id: unknown field"),
        ({"requestId": None, "message": "hi"}, "requestId: null is not allowed"),
        ({"requestId": 5, "message": "hi"}, "requestId"),
    ],
)
def test_it_decodes_steer_bodies_strictly(api, world, body, needle):
    response = api.post(f"/api/runs/{world.child['runId']}/steer", body)
    assert response.status_code == 422, response.content
    assert needle in response.json()["error"]["message"]
    assert not SteerReceipt.objects.exists()


def test_it_refuses_a_body_on_release_that_has_fields(api, world):
    response = api.post(f"/api/leases/{world.lease_pk}/release", {"force": True})
    assert response.status_code == 422
    assert "force: unknown field" in response.json()["error"]["message"]
    assert Lease.objects.get(pk=world.lease_pk).state == "active"


def test_it_answers_404_for_actions_on_unknown_runs(api, world):
    response = api.post("/api/runs/ghost/cancel", {})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"

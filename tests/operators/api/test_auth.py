"""Every endpoint with every persona (viewer, operator, outsider, anonymous) and both ways of
authenticating (session, API token); CSRF on session POSTs; bad and revoked tokens."""

import json

import pytest

from delegation.models import AuditEntry
from delegation.services import tokens
from delegation.services.run_actions import Actor, audit
from tests.support.api import AUTH_MODES, PERSONAS
from tests.support.state import observable_state

pytestmark = pytest.mark.django_db

READS = [
    "/api/runs",
    "/api/runs/{root}",
    "/api/runs/{root}/tree",
    "/api/runs/{root}/events",
    "/api/runs/{root}/export",
    "/api/sessions",
    "/api/sessions/conv-root-1",
    "/api/leases",
    "/api/leases/{lease}",
    "/api/runners",
    "/api/runners/runner-a",
    "/api/audit",
]

ACTIONS = [
    ("/api/runs/{child}/cancel", {"reason": "stop", "cascade": True}),
    ("/api/runs/{child}/steer", {"requestId": "s-1", "message": "focus on tests"}),
    ("/api/leases/{lease}/release", None),
]


def _ids(body, key):
    return {item[key] for item in body["items"]}


def _of_runs(world, key):
    runs = (world.root, world.child, world.grandchild, world.leased, world.finished)
    return {run[key] for run in runs}


def _export_lines(response):
    return [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]


# What each read must show of the world (tests.support.api.build_world) and the audit
# entry seeded before it: a 200 with an empty or wrong body is not a read that worked.
SEEN = {
    "/api/runs": lambda r, w: _ids(r.json(), "runId") == _of_runs(w, "runId"),
    "/api/runs/{root}": lambda r, w: (
        (r.json()["runId"], r.json()["childCounts"]["total"]) == ("root-1", 3)
    ),
    "/api/runs/{root}/tree": lambda r, w: (
        # The subtree is streamed (a 100k-run tree is never one document in memory).
        {c["runId"] for c in json.loads(r.getvalue())["children"]}
        == {w.child["runId"], w.leased["runId"], w.finished["runId"]}
    ),
    "/api/runs/{root}/events": lambda r, w: (
        [(e["sequence"], e["kind"]) for e in r.json()["items"]]
        == [(1, "text"), (2, "tool-use"), (3, "tool-result"), (4, "text")]
    ),
    "/api/runs/{root}/export": lambda r, w: (
        [(e["runId"], e["sequence"]) for e in _export_lines(r)]
        == [("root-1", n) for n in (1, 2, 3, 4)]
    ),
    "/api/sessions": lambda r, w: _ids(r.json(), "conversationId") == _of_runs(w, "conversationId"),
    "/api/sessions/conv-root-1": lambda r, w: (
        [run["runId"] for run in r.json()["runs"]] == ["root-1"]
    ),
    "/api/leases": lambda r, w: _ids(r.json(), "leaseId") == {"lease-1"},
    "/api/leases/{lease}": lambda r, w: (
        (r.json()["leaseId"], r.json()["parentRunId"], r.json()["childCount"])
        == ("lease-1", "root-1", 1)
    ),
    "/api/runners": lambda r, w: _ids(r.json(), "runnerId") == {"runner-a"},
    "/api/runners/runner-a": lambda r, w: (
        {p["name"] for p in r.json()["presets"]} == {"worker", "reviewer"}
    ),
    "/api/audit": lambda r, w: (
        [(e["action"], e["targetId"]) for e in r.json()["items"]] == [("seeded", "root-1")]
    ),
}


def unchanged_state() -> dict:
    """What an action could change, leaving out the audit log (a refusal is audited)."""
    seen = observable_state()
    del seen["counts"]["AuditEntry"]
    return seen


def fill(path: str, world) -> str:
    return path.format(root="root-1", child=world.child["runId"], lease=world.lease_pk)


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"code", "message"} <= set(body["error"]), body
    return body["error"]


@pytest.mark.parametrize("path", READS)
@pytest.mark.parametrize("mode", AUTH_MODES)
@pytest.mark.parametrize("persona", PERSONAS)
def test_it_lets_viewers_and_operators_read_and_refuses_outsiders(
    as_, world, people, path, mode, persona
):
    audit(Actor.for_user(people["admin"], "api"), "seeded", "run", "root-1", "ok")
    response = as_(persona, mode).get(fill(path, world))
    if persona == "outsider":
        assert response.status_code == 403
        assert error_of(response)["code"] == "forbidden"
    else:
        assert response.status_code == 200, response.content[:500]
        assert SEEN[path](response, world), (
            b"".join(response.streaming_content) if response.streaming else response.content
        )[:2000]


@pytest.mark.parametrize("path", READS + [a for a, _ in ACTIONS])
def test_it_answers_401_without_credentials(as_, world, path):
    api = as_("anonymous", None)
    path = fill(path, world)
    response = (
        api.post(path, {}) if path.endswith(("cancel", "steer", "release")) else api.get(path)
    )
    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("path", "body"), ACTIONS)
@pytest.mark.parametrize("mode", AUTH_MODES)
@pytest.mark.parametrize("persona", PERSONAS)
def test_it_lets_only_operators_act(as_, world, path, body, mode, persona):
    before = AuditEntry.objects.count()
    stored = unchanged_state()
    response = as_(persona, mode).post(fill(path, world), body)
    if persona == "operator":
        assert response.status_code == 200, response.content
        entry = AuditEntry.objects.latest("id")
        assert entry.via == "api" and entry.actor == "user:olga"
        assert not entry.outcome.startswith("refused")
    elif persona == "viewer":
        assert response.status_code == 403
        assert error_of(response)["code"] == "forbidden"
        # The engine refused it and audited the refusal: one code path for every transport.
        entry = AuditEntry.objects.latest("id")
        assert AuditEntry.objects.count() == before + 1
        assert entry.outcome == "refused: not an operator" and entry.actor == "user:vera"
        assert unchanged_state() == stored
    else:
        assert response.status_code == 403
        assert error_of(response)["code"] == "forbidden"
        assert AuditEntry.objects.count() == before
        assert unchanged_state() == stored


def test_it_refuses_a_session_post_without_the_csrf_token(as_, world):
    api = as_("operator", "session", csrf=True)
    path = f"/api/runs/{world.child['runId']}/cancel"
    refused = api.post(path, {})
    assert refused.status_code == 403
    assert error_of(refused)["code"] == "csrf_failed"
    assert not AuditEntry.objects.filter(action="cancel").exists()
    # A GET primes the csrftoken cookie; sending it back in X-CSRFToken passes.
    api.client.get("/api/docs")
    token = api.client.cookies["csrftoken"].value
    accepted = api.post(path, {}, X_CSRFToken=token)
    assert accepted.status_code == 200, accepted.content


def test_it_needs_no_csrf_token_with_a_bearer_token(as_, world):
    api = as_("operator", "token", csrf=True)
    response = api.post(f"/api/runs/{world.child['runId']}/cancel", {})
    assert response.status_code == 200


def test_it_refuses_a_bad_bearer_token_even_with_a_session(as_, world):
    api = as_("operator", "session")
    response = api.get("/api/runs", Authorization="Bearer cna_not-a-token")
    assert response.status_code == 401
    assert "unknown or revoked" in error_of(response)["message"]
    response = api.get("/api/runs", Authorization="Basic dXNlcjpwdw==")
    assert response.status_code == 401


def test_it_refuses_a_revoked_token(as_, world, people):
    api_token, token = tokens.create_api_token(people["viewer"], "script")
    api = as_("anonymous", None)
    assert api.get("/api/runs", Authorization=f"Bearer {token}").status_code == 200
    tokens.revoke_api_token(api_token.token_prefix)
    assert api.get("/api/runs", Authorization=f"Bearer {token}").status_code == 401


def test_it_refuses_the_token_of_an_inactive_user(as_, world, people):
    _, token = tokens.create_api_token(people["operator"], "script")
    people["operator"].is_active = False
    people["operator"].save()
    response = as_("anonymous", None).get("/api/runs", Authorization=f"Bearer {token}")
    assert response.status_code == 401


def test_it_lets_admins_read_and_act(as_, world):
    api = as_("admin", "token")
    assert api.get("/api/runs").status_code == 200
    assert api.post(f"/api/runs/{world.child['runId']}/cancel", {}).status_code == 200


def test_it_serves_the_schema_and_docs_without_a_cdn(as_):
    api = as_("anonymous", None)
    schema = api.get("/api/openapi.json")
    assert schema.status_code == 200
    assert set(schema.json()["components"]["securitySchemes"]) == {"BearerToken", "DjangoSession"}
    docs = api.get("/api/docs")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower() and "https://" not in html

"""Every endpoint with every persona (viewer, operator, outsider, anonymous) and both ways of
authenticating (session, API token); CSRF on session POSTs; bad and revoked tokens."""
# ruff: noqa: F811 - pytest fixtures are imported from tests.test_api_support

import pytest

from delegation.models import AuditEntry
from delegation.services import tokens
from tests.test_api_support import AUTH_MODES, PERSONAS, as_, world  # noqa: F401

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
def test_it_lets_viewers_and_operators_read_and_refuses_outsiders(as_, world, path, mode, persona):
    response = as_(persona, mode).get(fill(path, world))
    if persona == "outsider":
        assert response.status_code == 403
        assert error_of(response)["code"] == "forbidden"
    else:
        assert response.status_code == 200, response.content[:500]


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
    else:
        assert response.status_code == 403
        assert error_of(response)["code"] == "forbidden"
        assert AuditEntry.objects.count() == before


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

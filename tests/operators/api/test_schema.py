"""Schemathesis against /api/openapi.json: for every operation, a bounded number of
generated requests (valid and invalid) with an operator's token; no 5xx, every response
matches its documented status, content type and schema, invalid input is refused, valid input
is accepted, and auth is enforced. Runs in ``make test`` (no server: WSGI in-process).

On its own: ``.venv/bin/python -m pytest tests/operators/api/test_schema.py``.
"""

import hashlib

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings

from delegation import roles
from delegation.models import ExtensionPreset, Run
from delegation.runner_socket import methods
from delegation.services import webhooks as alerts
from delegation.services.run_actions import Actor
from tests.support.api import build_world
from tests.support.personas import api_token, make_person

MAX_EXAMPLES = 20


@pytest.fixture(autouse=True)
def keep_connection():
    """A raw WSGI call closes the database connection when the request ends, which would
    end the test's transaction; Django's own test client unhooks this the same way."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def load_schema():
    """The document as the server publishes it (serving it needs no database)."""
    signals.request_finished.disconnect(close_old_connections)
    try:
        return schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application())
    finally:
        signals.request_finished.connect(close_old_connections)


# Loaded eagerly: schemathesis's lazy `from_fixture` does not run on pytest 9.
schema = load_schema()
_current = {}


@pytest.fixture
def operator_world(operator, shipped_prices):
    """The world each operation's examples run against, and an operator's API token. After
    the examples, it checks that some were answered 2xx: a wrong token would answer 401 to
    everything, which every check accepts."""
    world = build_world()
    _current["token"] = api_token(operator)
    # Webhooks are for admins: their operations are called with an admin's token, and
    # half of them address a webhook that exists.
    admin = make_person(roles.ADMIN)
    _current["admin_token"] = api_token(admin)
    world.webhook_pk = alerts.do_create_webhook(
        Actor.for_user(admin, via="api"), url="https://hooks.example/x", kinds=["run-failed"]
    ).webhook.pk
    # Approvals (SPEC §11): one pending on the child, so aimed cases can read and decide it.
    asked = methods.approval_request(
        world.conn,
        {"runId": world.child["runId"], "toolCallId": "t", "toolName": "Bash", "input": {}},
    )
    world.extra["approvalId"] = asked["approvalId"]
    # Fork (SPEC §14): the finished run's preset forks and its agent reported a session.
    ExtensionPreset.objects.filter(name=world.finished["profile"]).update(can_fork=True)
    Run.objects.filter(run_id=world.finished["runId"]).update(agent_session_id="sess-1")
    _current["statuses"] = []
    yield world
    statuses = _current.pop("statuses")
    assert any(200 <= status < 300 for status in statuses), sorted(statuses)


@schema.auth(refresh_interval=None)
class OperatorToken:
    """Explicit auth: schemathesis then still sends negated Authorization headers on its own
    (and expects 401), but never random credentials in place of the real token."""

    def get(self, case, context):
        return _token_for(case)

    def set(self, case, data, context):
        # The running test's token, not ``data``: schemathesis also asks get() while
        # collecting, before any test has made a token, and may set what it answered then
        # on a later call (every call of one operation in CI's full run was sent with that
        # placeholder and answered 401, so the operation never saw a 2xx).
        case.headers = case.headers or {}
        case.headers["Authorization"] = f"Bearer {_token_for(case)}"


def _token_for(case) -> str:
    if "webhook" in case.operation.path or "/prices/" in case.operation.path:
        return _current.get("admin_token", "collecting")
    return _current.get("token", "collecting")


def _aimed(case) -> bool:
    """Half the cases, chosen by the case's own content: the same case is aimed (or not)
    whatever ran before it, so a failure reproduces alone (a module-wide counter made the
    choice depend on every earlier example of every operation)."""
    material = repr((case.operation.label, case.path_parameters, case.query, case.body))
    return hashlib.sha256(material.encode()).digest()[0] % 2 == 0


def aim_at_real_resources(case, world, *, always: bool = False) -> None:
    """Half the cases address a resource that exists, so success responses are checked
    against their schemas too (a random id only ever reaches the 404 branch); ``always``,
    every case, until one of the operation has succeeded."""
    body = case.body
    if isinstance(body, dict) and {"runner", "profile", "message"} <= set(body):
        # A launch names a connected runner and one of its presets in every case (a random
        # name only reaches the 409 branch, which the unknown-runner tests cover); the message,
        # budget and the rest stay generated. Only strings within the fields' lengths
        # (1-128) are swapped, so a negative case stays negative; measured as schemathesis
        # does, in UTF-16 units (an over-long name of astral characters was 128 code points).
        real = {"runner": world.runner_name, "profile": "worker", "extensionId": "ext"}
        for name, value in real.items():
            current = body.get(name)
            if type(current) is str and 1 <= len(current.encode("utf-16-le")) // 2 <= 128:
                body[name] = value
    if not always and not _aimed(case):
        return
    real = {
        "runId": world.child["runId"],
        "otherRunId": world.root["runId"],  # compare: two runs that exist
        "conversationId": "conv-root-1",
        "runnerId": world.runner_name,
        "approvalId": world.extra.get("approvalId", ""),
    }
    real["model"] = "gpt-5"  # a shipped price (issue 23's price table)
    for name, value in real.items():
        if name in (case.path_parameters or {}):
            case.path_parameters[name] = value
    if case.operation.path.endswith("/fork"):
        case.path_parameters["runId"] = world.finished["runId"]  # only a finished run forks
    current = (case.path_parameters or {}).get("id")
    # Only a schema-valid id is swapped for a real one: a negative case must stay negative.
    if type(current) is int and 1 <= current <= 2**63 - 1:
        webhook = "webhook" in case.operation.path
        case.path_parameters["id"] = world.webhook_pk if webhook else world.lease_pk


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_it_conforms_to_its_openapi_document(case, operator_world):
    # Until one case of the operation has succeeded, every case is aimed: which half the
    # hash picks depends on what Hypothesis generates, and that changes with the strings
    # it collects from the code under test, so an operation could go without any real id
    # (two CI runs: GET approvals/{id}, then GET runs/{id}/approval-policy never saw a 2xx).
    succeeded = any(200 <= status < 300 for status in _current["statuses"])
    aim_at_real_resources(case, operator_world, always=not succeeded)
    response = case.call_and_validate()
    _current["statuses"].append(response.status_code)

"""Shared helpers for the REST API tests: auth modes for the personas, and a small world built
through the engine's real services (a registered runner, a tree with a lease and events)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from django.contrib.auth.models import User
from django.test import Client

from delegation.runner_socket import methods
from delegation.services import runners, tokens
from tests.support.personas import api_token, signed_in
from tests.support.rpc import DEFAULT_EXTENSION

PERSONAS = ("viewer", "operator", "outsider")
AUTH_MODES = ("session", "token")


class Api:
    """A client bound to one persona and one way of authenticating."""

    def __init__(self, user: User | None, mode: str | None, csrf: bool = False):
        self.user = user
        self.mode = mode
        self.headers: dict[str, str] = {}
        if user is not None and mode == "session":
            self.client = signed_in(user, csrf=csrf)
        else:
            self.client = Client(enforce_csrf_checks=csrf)
        if user is not None and mode == "token":
            self.headers["Authorization"] = f"Bearer {api_token(user)}"

    def get(self, path: str, params=None, **kw):
        return self.client.get(path, params or {}, headers={**self.headers, **kw})

    def post(self, path: str, body=None, raw: str | None = None, **kw):
        if raw is None and body is not None:
            raw = json.dumps(body)
        return self.client.post(
            path,
            raw if raw is not None else "",
            content_type="application/json",
            headers={**self.headers, **kw},
        )


@dataclass
class World:
    conn: runners.Connection
    runner_name: str
    root: dict
    child: dict
    grandchild: dict
    leased: dict
    finished: dict
    lease_pk: int
    extra: dict = field(default_factory=dict)


def drive_runner(name: str = "runner-a", host: str = "host-1") -> runners.Connection:
    """A runner registered through the real services, as its socket would do it."""
    runner, _token = tokens.create_runner(name)
    conn = runners.Connection(runner_pk=runner.pk)
    _, generation, _ = methods.register(
        conn, {"hostInstanceId": host, "extensions": [DEFAULT_EXTENSION]}
    )
    return runners.Connection(runner_pk=runner.pk, generation=generation)


def start_child(conn, parent_run_id: str, request_id: str, profile="worker", lease=None):
    params = {
        "runId": parent_run_id,
        "extensionId": "ext",
        "generation": 1,
        "request": {"requestId": request_id, "profile": profile, "message": "do the thing"},
    }
    if lease is not None:
        params["leaseId"] = lease
        params["request"]["leaseId"] = lease
    return methods.child_start(conn, params)


def emit(conn, run_id: str, events: list, start: int = 1) -> dict:
    events = [{"kind": "text", "text": e} if isinstance(e, str) else e for e in events]
    return methods.append_event_frame(conn, {"runId": run_id, "from": start, "events": events})


def build_world() -> World:
    """root-1 (depth 0) -> child (1) -> grandchild (2); root-1 -> leased child (lease-1);
    root-1 -> finished reviewer child. Events on root-1 and the child."""
    from delegation.models import Lease

    conn = drive_runner()
    root = methods.open_run(
        conn,
        {
            "conversationId": "conv-root-1",
            "runId": "root-1",
            "extensionId": "ext",
            "profile": "worker",
        },
    )
    emit(
        conn,
        "root-1",
        [
            "hello world",
            {"kind": "tool-use", "toolName": "grep", "toolCallId": "t1", "input": {"q": "x"}},
            {"kind": "tool-result", "toolCallId": "t1", "toolOutput": ["a", "b"], "success": True},
            "a needle in the haystack",
        ],
    )
    child = start_child(conn, "root-1", "req-child")
    emit(conn, child["runId"], ["child says hi", "child works"])
    grandchild = start_child(conn, child["runId"], "req-grand")
    leased = start_child(conn, "root-1", "req-leased", lease="lease-1")
    finished = start_child(conn, "root-1", "req-done", profile="reviewer")
    methods.finish_run(conn, {"runId": finished["runId"], "output": "all done"})
    lease_pk = Lease.objects.get(lease_id="lease-1").pk
    return World(conn, "runner-a", root, child, grandchild, leased, finished, lease_pk)


@pytest.fixture
def world(db) -> World:
    return build_world()


@pytest.fixture
def as_(people):
    """``as_(persona, mode)``: an Api client for that persona of ``tests.support.personas``
    ("anonymous" has no mode)."""

    def make(persona: str, mode: str | None = "token", csrf: bool = False) -> Api:
        user = None if persona == "anonymous" else people[persona]
        return Api(user, mode, csrf=csrf)

    return make

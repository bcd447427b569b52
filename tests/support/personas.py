"""The people tests act as: one viewer, one operator, one admin and one outsider.

Every test that needs a user takes one of these fixtures (``conftest`` makes them available
everywhere) instead of creating its own, so a role is granted one way only: membership of
the Django group named after it (``delegation.roles``). Role holders are staff, as
``manage.py create_operator`` makes them, so the Django admin opens and shows what the role
allows; the outsider is signed in with no role and no staff flag.

All four can sign in with ``PASSWORD`` (the browser tests use the real login form).
"""

from __future__ import annotations

import functools

import pytest
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group, User
from django.test import Client

from delegation import roles
from delegation.services import tokens

OUTSIDER = "outsider"
PERSONAS = (roles.VIEWER, roles.OPERATOR, roles.ADMIN, OUTSIDER)
USERNAMES = {roles.VIEWER: "vera", roles.OPERATOR: "olga", roles.ADMIN: "ada", OUTSIDER: "oscar"}
PASSWORD = "pw"


@functools.cache
def _password_hash() -> str:
    # The default hasher is slow on purpose; hashing once per session keeps persona setup
    # cheap while a real server process (browser tests) can still check the password.
    return make_password(PASSWORD)


def make_person(persona: str) -> User:
    """The user behind ``persona`` (one of ``PERSONAS``), created in the test database."""
    role = None if persona == OUTSIDER else persona
    user = User.objects.create(
        username=USERNAMES[persona], password=_password_hash(), is_staff=role is not None
    )
    if role is not None:
        # get_or_create: a transactional test's flush removes the groups the migration made.
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def signed_in(user: User, *, csrf: bool = False) -> Client:
    """A test client with a fresh session for ``user``; ``csrf`` enforces CSRF tokens."""
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def session_cookie(user: User) -> bytes:
    """A ``Cookie`` header value carrying a fresh session for ``user`` (for raw sockets)."""
    client = signed_in(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def api_token(user: User, name: str = "test") -> str:
    """A new API token for ``user``, in the clear (only its hash is stored)."""
    return tokens.create_api_token(user, name)[1]


@pytest.fixture
def viewer(db) -> User:
    return make_person(roles.VIEWER)


@pytest.fixture
def operator(db) -> User:
    return make_person(roles.OPERATOR)


@pytest.fixture
def admin(db) -> User:
    return make_person(roles.ADMIN)


@pytest.fixture
def outsider(db) -> User:
    return make_person(OUTSIDER)


@pytest.fixture
def operator_token(operator) -> str:
    """An API token of the operator, made before the test body (and any server) runs."""
    return api_token(operator)


@pytest.fixture
def people(viewer, operator, admin, outsider) -> dict[str, User]:
    """All four, by persona name."""
    return {roles.VIEWER: viewer, roles.OPERATOR: operator, roles.ADMIN: admin, OUTSIDER: outsider}

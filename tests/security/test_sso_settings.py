"""Issue 28: single sign-on and retention settings stop the process with a message that names
the variable; password sign-in can be switched off."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from canopy import settings as canopy_settings
from canopy.sso_settings import sso_settings
from tests.support.personas import PASSWORD, make_person

GOOD = {
    "OIDC_ISSUER": "https://login.example.com/realms/canopy/",
    "OIDC_CLIENT_ID": "canopy",
    "OIDC_CLIENT_SECRET": "s3cret",
    "OIDC_GROUP_ROLES": "canopy-viewers=viewer, canopy-admins=admin",
}


def read(monkeypatch, debug=False, **env):
    for name in (*GOOD, "OIDC_LOCAL_PASSWORDS", "OIDC_SCOPES", "OIDC_CLIENT_SECRET_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return sso_settings({**vars(canopy_settings), "DEBUG": debug})


def test_it_reads_a_provider_from_the_environment(monkeypatch):
    got = read(monkeypatch, **GOOD)
    assert got["OIDC_ISSUER"] == "https://login.example.com/realms/canopy"
    assert got["OIDC_GROUP_ROLES"] == {"canopy-viewers": "viewer", "canopy-admins": "admin"}
    assert got["OIDC_USE_PKCE"] is True and got["OIDC_RP_SCOPES"] == "openid email profile"
    assert read(monkeypatch) == {"OIDC_ISSUER": "", "OIDC_LOCAL_PASSWORDS": True}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OIDC_CLIENT_ID": ""}, "set OIDC_CLIENT_ID"),
        ({"OIDC_CLIENT_SECRET": ""}, "OIDC_CLIENT_SECRET (or OIDC_CLIENT_SECRET_FILE)"),
        ({"OIDC_GROUP_ROLES": ""}, "OIDC_GROUP_ROLES (e.g."),
        ({"OIDC_GROUP_ROLES": "ops=root"}, "'ops' maps to 'root'; the roles are"),
        ({"OIDC_GROUP_ROLES": "ops"}, "'ops' is not group=role"),
        ({"OIDC_GROUP_ROLES": "a=viewer,a=admin"}, "'a' is mapped twice"),
        ({"OIDC_ISSUER": "http://idp.example.com"}, "OIDC_ISSUER must use https"),
        ({"OIDC_ISSUER": "idp.example.com"}, "OIDC_ISSUER must be an http(s) URL"),
        ({"OIDC_SCOPES": "email groups"}, "OIDC_SCOPES must include openid"),
    ],
)
def test_it_refuses_a_provider_setting_that_cannot_work(monkeypatch, env, message):
    with pytest.raises(ImproperlyConfigured, match=message.replace("(", r"\(").replace(")", r"\)")):
        read(monkeypatch, **{**GOOD, **env})


def test_it_refuses_to_switch_off_passwords_without_a_provider(monkeypatch):
    with pytest.raises(ImproperlyConfigured, match="OIDC_LOCAL_PASSWORDS=false needs OIDC_ISSUER"):
        read(monkeypatch, OIDC_LOCAL_PASSWORDS="false")


@pytest.mark.parametrize(
    ("days", "message"),
    [
        ((0, 30, 10), "AUDIT_RETENTION_DAYS \\(10\\) must be 0 \\(forever\\) or at least"),
        ((0, 0, 10), "AUDIT_RETENTION_DAYS \\(10\\) must be 0 \\(forever\\) or at least"),
        ((60, 30, 0), "EVENT_RETENTION_DAYS \\(60\\) must not exceed RUN_RETENTION_DAYS"),
        ((90, 0, 0), None),
        ((7, 30, 365), None),
    ],
)
def test_it_keeps_the_audit_log_longest(days, message):
    if message is None:
        canopy_settings.check_retention(*days)
        return
    with pytest.raises(ImproperlyConfigured, match=message):
        canopy_settings.check_retention(*days)


@pytest.mark.django_db
def test_it_refuses_password_sign_in_when_switched_off(settings):
    person = make_person("operator")
    settings.OIDC_LOCAL_PASSWORDS = False
    answer = Client().post("/login/", {"username": person.username, "password": PASSWORD})
    assert answer.status_code == 403
    assert b"Password sign-in is off" in answer.content
    settings.OIDC_LOCAL_PASSWORDS = True
    assert (
        Client().post("/login/", {"username": person.username, "password": PASSWORD}).status_code
        == 302
    )

"""``manage.py api_token``: create prints the token alone on the last line; list; revoke."""

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from delegation.models import ApiToken, hash_token

pytestmark = pytest.mark.django_db


def test_it_creates_a_token_that_authenticates_the_rest_api(capsys, viewer):
    call_command("api_token", "create", viewer.username, "--name", "nightly")
    out = capsys.readouterr().out.strip().splitlines()
    token = out[-1]
    assert token.startswith("cna_") and " " not in token
    stored = ApiToken.objects.get()
    assert stored.name == "nightly" and stored.user == viewer
    # Stored hashed: the plain token is nowhere in the database.
    assert stored.token_hash == hash_token(token) and token not in stored.token_hash
    assert stored.token_prefix == token[:12]
    response = Client().get("/api/runs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200


def test_it_lists_and_revokes_tokens_by_prefix(capsys, operator):
    call_command("api_token", "create", operator.username)
    token = capsys.readouterr().out.strip().splitlines()[-1]
    prefix = token[:12]
    call_command("api_token", "list")
    listing = capsys.readouterr().out
    assert prefix in listing and operator.username in listing and "active" in listing
    assert token not in listing
    call_command("api_token", "revoke", prefix)
    assert "Revoked 1 API token" in capsys.readouterr().out
    response = Client().get("/api/runs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    call_command("api_token", "list", "--user", operator.username)
    assert "revoked" in capsys.readouterr().out
    with pytest.raises(CommandError, match="no active API token"):
        call_command("api_token", "revoke", prefix)


def test_it_refuses_an_unknown_or_inactive_user(viewer):
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("api_token", "create", "ghost")
    viewer.is_active = False
    viewer.save()
    with pytest.raises(CommandError, match="inactive"):
        call_command("api_token", "create", viewer.username)
    assert not ApiToken.objects.exists()


def test_it_warns_when_the_user_has_no_role(capsys, outsider):
    call_command("api_token", "create", outsider.username)
    out = capsys.readouterr().out
    assert "role none" in out and out.strip().splitlines()[-1].startswith("cna_")

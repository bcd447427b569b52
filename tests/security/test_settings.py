"""Findings 8 and 13: the secret key, HTTPS settings, CSP, password rules, sign-in throttling."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from tests.support.paths import PROJECT as BASE_DIR
from tests.support.personas import PASSWORD


def manage(*args, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_refuses_to_start_on_the_development_or_a_short_secret_key_without_debug():
    # SECRET_KEY="": none, even in a checkout that made its development key (var/).
    for env in ({"SECRET_KEY": ""}, {"SECRET_KEY": "x" * 49}):
        done = manage("check", **env)
        assert done.returncode != 0, env
        assert "SECRET_KEY" in done.stderr and "50 characters" in done.stderr, done.stderr
    assert manage("check", DEBUG="true").returncode == 0
    # The runner command is a client of the server: it needs no server key.
    assert manage("runner", "--help").returncode == 0
    assert manage("check", SECRET_KEY=secrets.token_urlsafe(50)).returncode == 0


def test_it_finds_the_checkouts_development_key_so_pasted_commands_work(tmp_path):
    """`make run` made var/dev-secret-key once; `python manage.py check` (no variable) uses it."""
    key_file = BASE_DIR / "var" / "dev-secret-key"
    made = not key_file.exists()
    if made:
        key_file.parent.mkdir(exist_ok=True)
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    try:
        done = manage("check")
        assert done.returncode == 0, done.stderr
    finally:
        if made:
            key_file.unlink()


def production_settings() -> dict[str, str]:
    """The README's "Production settings" block, with a real key in place of the hint."""
    text = (BASE_DIR / "docs" / "how-to" / "deploy-postgres-redis.md").read_text()
    block = text.split("```sh\n# Production settings\n", 1)[1].split("```", 1)[0]
    env = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
    assert env["SECRET_KEY"].startswith("<") and env["CHANNEL_LAYER_KEY"].startswith("<")
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    env["CHANNEL_LAYER_KEY"] = secrets.token_urlsafe(32)
    return {k: v.replace("<password>", secrets.token_urlsafe(12)) for k, v in env.items()}


def test_it_passes_check_deploy_with_the_documented_production_settings():
    done = manage("check", "--deploy", "--fail-level", "WARNING", **production_settings())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout
    # Without them the same check complains: the block is what makes it pass.
    bare = manage("check", "--deploy", "--fail-level", "WARNING", SECRET_KEY="k" * 60)
    assert bare.returncode != 0 and "security.W004" in bare.stderr + bare.stdout


@pytest.mark.parametrize(
    ("change", "warning"),
    [
        ({"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/canopy"}, "canopy.W001"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0"}, "canopy.W002"),
        ({"CHANNEL_LAYER_KEY": ""}, "canopy.W003"),
    ],
)
def test_it_warns_at_check_deploy_of_backends_any_local_process_can_use(change, warning):
    """SPEC §13: an agent on the machine reached a trust PostgreSQL and a password-less Redis."""
    done = manage(
        "check", "--deploy", "--fail-level", "WARNING", **{**production_settings(), **change}
    )
    assert done.returncode != 0 and warning in done.stderr + done.stdout, done.stderr


@pytest.mark.django_db
def test_it_sends_a_content_security_policy_and_hsts_over_https(settings):
    page = Client().get("/login/")
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "connect-src 'self' ws://testserver wss://testserver" in policy
    assert "unsafe-inline" not in policy
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 3600
    secure = Client().get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert secure.headers["Strict-Transport-Security"].startswith("max-age=3600")
    assert "Strict-Transport-Security" not in Client().get("/login/").headers


@pytest.mark.django_db
def test_it_refuses_a_weak_operator_password_and_takes_a_strong_one():
    for weak in ("password123", "12345678901234", "short1!"):
        with pytest.raises(CommandError, match="password refused"):
            call_command("create_operator", "wendy", f"--password={weak}")
    assert not User.objects.filter(username="wendy").exists()
    call_command("create_operator", "wendy", "--password=" + secrets.token_urlsafe(12))
    assert User.objects.filter(username="wendy").exists()


@pytest.mark.django_db
def test_it_locks_out_a_username_from_an_address_after_repeated_failed_sign_ins(
    settings, viewer, operator
):
    lou, kim = viewer.username, operator.username
    guesser = Client(REMOTE_ADDR="10.0.0.9")
    for n in range(settings.AXES_FAILURE_LIMIT - 1):
        wrong = guesser.post("/login/", {"username": lou, "password": f"guess-{n}"})
        assert wrong.status_code == 200  # the form again, with an error
    # The failure that reaches the limit is already refused, and so is the right password.
    assert guesser.post("/login/", {"username": lou, "password": "last"}).status_code == 429
    locked = guesser.post("/login/", {"username": lou, "password": PASSWORD})
    assert locked.status_code == 429
    assert "_auth_user_id" not in guesser.session
    # Another user from the same address, and the same user from elsewhere, still sign in.
    assert guesser.post("/login/", {"username": kim, "password": PASSWORD}).status_code == 302
    elsewhere = Client(REMOTE_ADDR="10.0.0.10")
    assert elsewhere.post("/login/", {"username": lou, "password": PASSWORD}).status_code == 302

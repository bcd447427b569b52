"""Issue 21: the server's secrets at rest: SECRET_KEY from a file, a private data directory.

Each test starts a fresh Python process with the settings (the way daphne and manage.py load
them), since both are decided when the settings are imported.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import stat
import subprocess
import sys

from tests.support.paths import PROJECT as BASE_DIR

SHOW_KEY = "from django.conf import settings; print(settings.SECRET_KEY)"


def settings_process(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DATABASE_URL")}
    full.update(DJANGO_SETTINGS_MODULE="canopy.settings", PYTHONPATH=str(BASE_DIR), **env)
    setup = "import django; django.setup(); "
    return subprocess.run(
        [sys.executable, "-c", setup + code],
        cwd=BASE_DIR,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_reads_the_secret_key_from_an_owner_only_file(tmp_path):
    key = secrets.token_urlsafe(50)
    path = tmp_path / "secret-key"
    path.write_text(key + "\n")
    path.chmod(0o600)
    done = settings_process(SHOW_KEY, SECRET_KEY_FILE=str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == key


def test_it_refuses_a_secret_key_file_others_can_read_or_a_key_given_twice(tmp_path):
    path = tmp_path / "secret-key"
    path.write_text(secrets.token_urlsafe(50))
    path.chmod(0o644)
    done = settings_process(SHOW_KEY, SECRET_KEY_FILE=str(path))
    assert done.returncode != 0
    assert "readable by others" in done.stderr and "chmod 600" in done.stderr, done.stderr
    path.chmod(0o600)
    done = settings_process(SHOW_KEY, SECRET_KEY_FILE=str(path), SECRET_KEY="x" * 60)
    assert done.returncode != 0 and "not both" in done.stderr, done.stderr
    done = settings_process(SHOW_KEY, SECRET_KEY_FILE=str(tmp_path / "missing"))
    assert done.returncode != 0 and "cannot read" in done.stderr, done.stderr


def test_it_keeps_the_data_directory_and_database_to_their_owner(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    # A database left world-readable by an older version (or another umask) is closed too.
    old = data / "canopy.sqlite3"
    sqlite3.connect(old).close()
    old.chmod(0o644)
    done = settings_process(
        "from django.core.management import call_command; "
        "call_command('migrate', verbosity=0); "
        "from django.contrib.auth.models import User; "
        "User.objects.create_user('someone', password='a-long-password-1')",
        CANOPY_DATA_DIR=str(data),
        SECRET_KEY=secrets.token_urlsafe(50),
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = sorted(data.glob("canopy.sqlite3*"))
    assert files, list(data.iterdir())
    for path in files:  # the database, its WAL and shared-memory files
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, (path, oct(path.stat().st_mode))

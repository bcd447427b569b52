"""``manage.py check --deploy`` warnings for what SPEC §13 leaves to the deployment: a
database or Redis that any local process can use without a password, and a channel layer
whose messages anyone who reaches Redis can forge."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def check_backends_need_credentials(app_configs=None, **kwargs) -> list[Warning]:
    found = []
    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.postgresql" and not database.get("PASSWORD"):
        found.append(
            Warning(
                "DATABASE_URL names no password: PostgreSQL trusts whoever connects as that "
                "user, an agent on the same machine included.",
                hint="Give the database user a password (scram-sha-256 in pg_hba.conf, not "
                "trust) and put it in DATABASE_URL.",
                id="canopy.W001",
            )
        )
    if settings.REDIS_URL:
        if not urlsplit(settings.REDIS_URL).password:
            found.append(
                Warning(
                    "REDIS_URL names no password: anyone who reaches Redis reads and writes "
                    "the channel layer.",
                    hint="Set requirepass (or an ACL user) in Redis and "
                    "redis://:PASSWORD@host:6379/0 in REDIS_URL.",
                    id="canopy.W002",
                )
            )
        if not settings.CHANNEL_LAYER_KEYS:
            found.append(
                Warning(
                    "REDIS_URL is set without CHANNEL_LAYER_KEY: channel-layer messages are not "
                    "encrypted, so a message written into Redis is taken as Canopy's own.",
                    hint="Set CHANNEL_LAYER_KEY to a random value of 32+ characters, the same "
                    "in every process.",
                    id="canopy.W003",
                )
            )
    return found

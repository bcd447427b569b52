"""Reads behind the live socket's credential checks: which API tokens still hold, which users
are still active (two queries for any number of sockets)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import Q
from django.utils import timezone

from delegation.models import ApiToken


def holding_token_hashes(hashes, *, now=None) -> set[str]:
    """Of these API token hashes, those not revoked, not expired, and of an active user."""
    now = now or timezone.now()
    return set(
        ApiToken.objects.filter(
            token_hash__in=list(hashes), revoked_at__isnull=True, user__is_active=True
        )
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .values_list("token_hash", flat=True)
    )


def active_user_pks(pks) -> set[int]:
    return set(
        get_user_model()
        .objects.filter(pk__in=list(pks), is_active=True)
        .values_list("pk", flat=True)
    )

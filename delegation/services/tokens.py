"""Runner and API tokens: created once, shown once, stored hashed."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from delegation import roles
from delegation.models import ApiToken, Runner, hash_token, new_token
from delegation.services import runners
from delegation.services.locks import retry_conflicts
from delegation.wire import valid_id


def new_runner_token() -> str:
    return new_token("cnr")


def create_runner(name: str) -> tuple[Runner, str]:
    """Create a runner, or rotate its token; the plain token is returned once and never kept."""
    valid_id(name, "runner name")
    token = new_runner_token()
    runner, created = Runner.objects.get_or_create(
        name=name, defaults={"token_hash": hash_token(token), "token_prefix": token[:12]}
    )
    if not created:
        rotate_runner(runner, token)
    return runner, token


@retry_conflicts
def rotate_runner(runner: Runner, token: str) -> None:
    """Replace a runner's token; connections made with the old one lose authority at once."""
    with transaction.atomic():
        runner.token_hash = hash_token(token)
        runner.token_prefix = token[:12]
        runner.revoked_at = None
        runner.save(update_fields=["token_hash", "token_prefix", "revoked_at"])
        runners.fence_runner(runner.pk, "runner token rotated")


@retry_conflicts
def revoke_runner(name: str) -> bool:
    with transaction.atomic():
        revoked = Runner.objects.filter(name=name, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), token_hash=hash_token(new_token("revoked"))
        )
        if revoked:
            runners.fence_runner(Runner.objects.get(name=name).pk, "runner token revoked")
    return bool(revoked)


def authenticate_runner(token: str) -> Runner | None:
    if not token:
        return None
    return Runner.objects.filter(token_hash=hash_token(token), revoked_at__isnull=True).first()


def create_api_token(
    user, name: str = "", *, expires_at=None, read_only: bool = False
) -> tuple[ApiToken, str]:
    """A bearer token for scripts; it acts with its user's role, or only reads when
    ``read_only``, until ``expires_at`` (never when None). Shown once, stored hashed."""
    if expires_at is not None and expires_at <= timezone.now():
        raise ValueError("expiry must be in the future")
    token = new_token("cna")
    api_token = ApiToken.objects.create(
        user=user,
        name=name,
        token_hash=hash_token(token),
        token_prefix=token[:12],
        expires_at=expires_at,
        read_only=read_only,
    )
    return api_token, token


def revoke_api_token(prefix: str) -> int:
    return ApiToken.objects.filter(token_prefix=prefix, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


def active_api_token(token: str) -> ApiToken | None:
    """The token's record while it still holds: not revoked, not expired, user active."""
    if not token:
        return None
    now = timezone.now()
    return (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_token(token), revoked_at__isnull=True, user__is_active=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .first()
    )


def active_api_token_user(token: str):
    """The user of a token that still holds, with its scope, without touching last_used_at."""
    found = active_api_token(token)
    if found is None:
        return None
    user = found.user
    if found.read_only:
        setattr(user, roles.READ_ONLY_SCOPE, True)
    return user


def authenticate_api_token(token: str):
    """The active user behind a bearer token, or None.

    The user carries the token's scope (``roles.READ_ONLY_SCOPE``): a read-only token's
    user has at most the viewer role for this request, whatever its groups say.
    """
    found = active_api_token(token)
    if found is None:
        return None
    now = timezone.now()
    # Refreshed at most once a minute: every API read would otherwise be a write.
    if found.last_used_at is None or now - found.last_used_at > timedelta(seconds=60):
        ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
    user = found.user
    if found.read_only:
        setattr(user, roles.READ_ONLY_SCOPE, True)
    return user

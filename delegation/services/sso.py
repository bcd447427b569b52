"""Single sign-on (issue 28): who a provider's claims make a user, and with which role.

The role comes from the provider's groups claim through ``OIDC_GROUP_ROLES`` at every
sign-in and at every live re-check (``dashboard.sso``), and is stored as the user's Canopy
role group, which is what every permission check reads (``delegation.roles``). A user whose
groups map to no role is refused and, if they signed in before, loses the role they had.
Users are matched by (issuer, subject), never by email: a provider's user cannot take over a
local account by setting its address.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from delegation import roles
from delegation.errors import PermissionRefused
from delegation.models import AuditEntry, SsoIdentity
from delegation.services.audit import audit
from delegation.services.identity import Actor

_RANKED = (roles.ADMIN, roles.OPERATOR, roles.VIEWER)


def groups_in(claims: dict) -> list[str]:
    """The groups claim as a list: providers send a list, or (Google's ``hd``) one string."""
    value = claims.get(settings.OIDC_GROUPS_CLAIM)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    return []


def role_from_claims(claims: dict) -> str | None:
    """The strongest role any of the user's groups maps to, or None."""
    mapped = {settings.OIDC_GROUP_ROLES.get(group) for group in groups_in(claims)}
    return next((role for role in _RANKED if role in mapped), None)


def set_role(user, role: str | None) -> None:
    """Make ``role`` the user's only Canopy role group (None: no role)."""
    user.groups.remove(*Group.objects.filter(name__in=roles.ROLES))
    if role is not None:
        user.groups.add(Group.objects.get_or_create(name=role)[0])


def _username(claims: dict) -> str:
    """A free username from the claims a person recognises, made safe for Django."""
    wanted = claims.get("preferred_username") or claims.get("email") or claims["sub"]
    base = re.sub(r"[^\w.@+-]", "-", str(wanted))[:140] or "user"
    users = get_user_model().objects
    name, n = base, 1
    while users.filter(username=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def _actor_for(claims: dict, user=None) -> Actor:
    if user is not None:
        return Actor.for_user(user, AuditEntry.Via.DASHBOARD)
    return Actor(label=f"sso:{str(claims.get('sub', ''))[:150]}", via=AuditEntry.Via.DASHBOARD)


def do_sso_sign_in(*, issuer: str, claims: dict):
    """The user these verified claims sign in (created on the first sign-in), with the role
    their groups map to now; PermissionRefused (audited) when they map to none."""
    subject = str(claims.get("sub") or "")
    if not subject:
        raise PermissionRefused("the identity provider sent no subject")
    role = role_from_claims(claims)
    with transaction.atomic():
        identity = (
            SsoIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=issuer, subject=subject)
            .first()
        )
        user = identity.user if identity else None
        if role is None:
            if identity is not None:
                set_role(user, None)
                identity.role = ""
                identity.save(update_fields=["role"])
            audit(
                _actor_for(claims, user),
                "sso.sign_in",
                "user",
                subject,
                "refused: no mapped group",
                detail={"groups": groups_in(claims)[:50]},
            )
            refused = PermissionRefused("your groups at the identity provider give no Canopy role")
        else:
            if identity is None:
                user = get_user_model().objects.create_user(
                    _username(claims), email=str(claims.get("email") or "")
                )
                user.set_unusable_password()  # signs in through the provider only
                user.save()
                identity = SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject)
            elif claims.get("email") and user.email != claims["email"]:
                user.email = str(claims["email"])
                user.save(update_fields=["email"])
            set_role(user, role)
            previous = identity.role
            identity.role = role
            identity.last_seen_at = timezone.now()
            identity.save(update_fields=["role", "last_seen_at"])
            audit(
                _actor_for(claims, user),
                "sso.sign_in",
                "user",
                user.get_username(),
                "ok",
                detail={"role": role, "previousRole": previous},
            )
            refused = None
    if refused is not None:
        raise refused
    return user


def do_sso_recheck(*, user, claims: dict | None) -> str | None:
    """A live socket's periodic re-check: the role the provider's current claims give (None:
    none, or ``claims`` None because the provider no longer accepts the session's token), made
    the user's role; a change is audited."""
    role = role_from_claims(claims) if claims is not None else None
    with transaction.atomic():
        identity = SsoIdentity.objects.select_for_update().filter(user=user).first()
        if identity is None:
            return roles.role_of(user)
        if identity.role != (role or ""):
            set_role(user, role)
            audit(
                Actor.system("sso"),
                "sso.role",
                "user",
                user.get_username(),
                f"role {role or 'none'}",
                detail={"role": role, "previousRole": identity.role, "tokenValid": bool(claims)},
            )
            identity.role = role or ""
        identity.last_seen_at = timezone.now()
        identity.save(update_fields=["role", "last_seen_at"])
    return role


def identity_of(user) -> SsoIdentity | None:
    """The user's link to the provider, if they sign in through it."""
    return SsoIdentity.objects.filter(user=user).first()


def keep_provider_tokens(*, user, access_token: str, refresh_token: str) -> None:
    """The provider's tokens of the user's latest sign-in (or refresh): what a re-check
    without a browser asks the provider with."""
    SsoIdentity.objects.filter(user=user).update(
        access_token=access_token or "", refresh_token=refresh_token or ""
    )

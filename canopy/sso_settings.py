"""Single sign-on settings (issue 28), read and checked here so ``canopy/settings.py`` stays
one page per topic. ``sso_settings(namespace)`` answers the Django settings to add, given the
settings module's namespace (its env helpers and DEBUG).

Canopy's variables (``OIDC_ISSUER``, ``OIDC_CLIENT_ID``, ...) are the deployment's words; the
``OIDC_RP_*``/``OIDC_OP_*`` names answered alongside them are what mozilla-django-oidc reads.
The provider's endpoints are discovered from the issuer at the first sign-in
(``dashboard.sso``), so only the issuer is configured.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

ROLES = ("viewer", "operator", "admin")


def parse_group_roles(raw: str) -> dict[str, str]:
    """``group=role,group=role`` → {group: role}; a group may map to one role only."""
    mapping: dict[str, str] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        group, sep, role = item.rpartition("=")
        group, role = group.strip(), role.strip()
        if not sep or not group:
            raise ImproperlyConfigured(
                f"OIDC_GROUP_ROLES: {item!r} is not group=role (e.g. canopy-admins=admin)"
            )
        if role not in ROLES:
            raise ImproperlyConfigured(
                f"OIDC_GROUP_ROLES: {group!r} maps to {role!r}; the roles are {', '.join(ROLES)}"
            )
        if mapping.get(group, role) != role:
            raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: {group!r} is mapped twice")
        mapping[group] = role
    return mapping


def _check_issuer(issuer: str, debug: bool) -> None:
    parts = urlsplit(issuer)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperlyConfigured(f"OIDC_ISSUER must be an http(s) URL, got {issuer!r}")
    loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if parts.scheme == "http" and not (debug or loopback):
        raise ImproperlyConfigured(
            f"OIDC_ISSUER must use https (got {issuer!r}); plain http is allowed only on "
            "loopback or with DEBUG=true"
        )


def sso_settings(ns: dict) -> dict:
    env_str, env_bool, env_float = ns["env_str"], ns["env_bool"], ns["env_float"]
    issuer = env_str("OIDC_ISSUER", "").strip().rstrip("/")
    local_passwords = env_bool("OIDC_LOCAL_PASSWORDS", True)
    out = {"OIDC_ISSUER": issuer, "OIDC_LOCAL_PASSWORDS": local_passwords}
    if not issuer:
        if not local_passwords:
            raise ImproperlyConfigured(
                "OIDC_LOCAL_PASSWORDS=false needs OIDC_ISSUER: otherwise nobody can sign in"
            )
        return out
    _check_issuer(issuer, ns["DEBUG"])
    client_id = env_str("OIDC_CLIENT_ID", "").strip()
    secret_file = ns["secret_from_file"]("OIDC_CLIENT_SECRET_FILE")
    if secret_file is not None and env_str("OIDC_CLIENT_SECRET", ""):
        raise ImproperlyConfigured("set OIDC_CLIENT_SECRET or OIDC_CLIENT_SECRET_FILE, not both")
    secret = secret_file or env_str("OIDC_CLIENT_SECRET", "").strip()
    missing = [name for name, value in (("OIDC_CLIENT_ID", client_id),) if not value]
    if not secret:
        missing.append("OIDC_CLIENT_SECRET (or OIDC_CLIENT_SECRET_FILE)")
    scopes = env_str("OIDC_SCOPES", "openid email profile").split()
    if "openid" not in scopes:
        raise ImproperlyConfigured(f"OIDC_SCOPES must include openid, got {' '.join(scopes)!r}")
    group_roles = parse_group_roles(env_str("OIDC_GROUP_ROLES", ""))
    if not group_roles:
        missing.append("OIDC_GROUP_ROLES (e.g. canopy-viewers=viewer,canopy-admins=admin)")
    if missing:
        raise ImproperlyConfigured(f"OIDC_ISSUER is set, so set {' and '.join(missing)} too")
    out.update(
        OIDC_CLIENT_ID=client_id,
        OIDC_SCOPES=" ".join(scopes),
        OIDC_GROUPS_CLAIM=env_str("OIDC_GROUPS_CLAIM", "groups").strip() or "groups",
        OIDC_GROUP_ROLES=group_roles,
        OIDC_PROVIDER_NAME=env_str("OIDC_PROVIDER_NAME", "your identity provider").strip(),
        # How often a live socket asks the provider again (userinfo) whether its user still
        # holds the role: group changes reach open sockets within this.
        OIDC_RECHECK_SECONDS=env_float("OIDC_RECHECK_SECONDS", 900.0, minimum=0),
        OIDC_TIMEOUT=env_float("OIDC_TIMEOUT_SECONDS", 10.0, minimum=0.1),
        # mozilla-django-oidc's own names.
        OIDC_RP_CLIENT_ID=client_id,
        OIDC_RP_CLIENT_SECRET=secret,
        OIDC_RP_SCOPES=" ".join(scopes),
        OIDC_RP_SIGN_ALGO=env_str("OIDC_SIGN_ALGO", "RS256").strip(),
        OIDC_USE_PKCE=True,
        OIDC_PKCE_CODE_CHALLENGE_METHOD="S256",
        OIDC_USE_NONCE=True,
        OIDC_TOKEN_USE_BASIC_AUTH=True,
        # Kept in the session (server side) so the live socket can re-read the groups.
        OIDC_STORE_ACCESS_TOKEN=True,
        OIDC_CREATE_USER=True,
        OIDC_AUTHENTICATION_CALLBACK_URL="oidc-callback",
        LOGIN_REDIRECT_URL_FAILURE="/login/?sso=refused",
        # Placeholders: dashboard.sso fills them from the issuer's discovery document.
        OIDC_OP_AUTHORIZATION_ENDPOINT="",
        OIDC_OP_TOKEN_ENDPOINT="",
        OIDC_OP_USER_ENDPOINT="",
        OIDC_OP_JWKS_ENDPOINT="",
    )
    return out

"""OpenID Connect sign-in (issue 28) on mozilla-django-oidc: the provider's button, its
callback, the authentication backend, and the live socket's re-check of the groups.

The library does the protocol (authorization code flow with PKCE and a nonce, state kept in
the session, the ID token's signature checked against the provider's JWKS); this module finds
the provider's endpoints from ``OIDC_ISSUER`` (discovery, cached per process), checks what the
library leaves out (the ID token's issuer and audience, userinfo's subject), and hands the
verified claims to ``delegation.services.sso``, which decides the user and the role.
"""

from __future__ import annotations

import logging
import threading
import time
from importlib import import_module

import requests
from django.conf import settings
from django.contrib import auth
from django.core.exceptions import SuspiciousOperation
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from delegation.errors import PermissionRefused
from delegation.services import sso

log = logging.getLogger(__name__)

_discovered: dict = {}
_discovery_lock = threading.Lock()
# Session keys: the refresh token (when the provider gives one) and the last re-check's time.
REFRESH_TOKEN = "canopy_oidc_refresh_token"
CHECKED_AT = "canopy_oidc_checked_at"


class ProviderUnavailable(Exception):
    pass


def enabled() -> bool:
    return bool(getattr(settings, "OIDC_ISSUER", ""))


def discovery() -> dict:
    """The issuer's discovery document (fetched once per process, then cached)."""
    issuer = settings.OIDC_ISSUER
    with _discovery_lock:
        if _discovered.get("issuer") == issuer:
            return _discovered
        url = f"{issuer}/.well-known/openid-configuration"
        try:
            response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
            response.raise_for_status()
            document = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise ProviderUnavailable(f"cannot read {url}: {exc}") from None
        if document.get("issuer", "").rstrip("/") != issuer:
            raise ProviderUnavailable(
                f"{url} names issuer {document.get('issuer')!r}, not OIDC_ISSUER {issuer!r}"
            )
        _discovered.clear()
        _discovered.update(document, issuer=issuer)
        return _discovered


class ProviderBackend(OIDCAuthenticationBackend):
    """Authenticates the provider's callback; users come from ``services.sso``."""

    def authenticate(self, request, **kwargs):
        if request is None or "code_verifier" not in kwargs:
            return None  # a password sign-in: not this backend's
        document = discovery()
        self.OIDC_OP_TOKEN_ENDPOINT = document["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = document["userinfo_endpoint"]
        self.OIDC_OP_JWKS_ENDPOINT = document["jwks_uri"]
        return super().authenticate(request, **kwargs)

    def get_token(self, payload):
        tokens = super().get_token(payload)
        if tokens.get("refresh_token"):
            self.request.session[REFRESH_TOKEN] = tokens["refresh_token"]
        return tokens

    def verify_token(self, token, **kwargs):
        payload = super().verify_token(token, **kwargs)
        if "nonce" in kwargs:  # the ID token: the library checks its signature and nonce only
            audience = payload.get("aud")
            audiences = audience if isinstance(audience, list) else [audience]
            if str(payload.get("iss", "")).rstrip("/") != settings.OIDC_ISSUER:
                raise SuspiciousOperation("ID token from another issuer")
            if settings.OIDC_CLIENT_ID not in audiences:
                raise SuspiciousOperation("ID token for another client")
        return payload

    def verify_claims(self, claims):
        return bool(claims.get("sub"))

    def get_or_create_user(self, access_token, id_token, payload):
        info = self.get_userinfo(access_token, id_token, payload)
        if info.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("userinfo is about another subject than the ID token")
        # The ID token's claims, then userinfo's: some providers (Entra) put groups only in
        # the ID token, others only in userinfo.
        claims = {**payload, **info}
        try:
            user = sso.do_sso_sign_in(issuer=settings.OIDC_ISSUER, claims=claims)
            self.request.session[CHECKED_AT] = time.time()  # the groups were just read
            sso.keep_provider_tokens(
                user=user,
                access_token=access_token,
                refresh_token=self.request.session.get(REFRESH_TOKEN, ""),
            )
            return user
        except PermissionRefused as exc:
            self.request.canopy_sso_refusal = str(exc)
            return None

    def get_user(self, user_id):
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None


class ProviderSignIn(OIDCAuthenticationRequestView):
    """The sign-in page's provider button: off to the provider's authorization endpoint."""

    def get(self, request):
        try:
            self.OIDC_OP_AUTH_ENDPOINT = discovery()["authorization_endpoint"]
        except ProviderUnavailable as exc:
            log.warning("single sign-on unavailable: %s", exc)
            return HttpResponseRedirect(f"{reverse('login')}?sso=unavailable")
        return super().get(request)


class ProviderCallback(OIDCAuthenticationCallbackView):
    """The provider's answer. A tampered or replayed state, a wrong nonce or a bad token is
    refused without signing anyone in; so is a user whose groups map to no role."""

    @property
    def failure_url(self):
        why = "norole" if getattr(self.request, "canopy_sso_refusal", "") else "failed"
        return f"{reverse('login')}?sso={why}"

    def get(self, request):
        try:
            return super().get(request)
        except (SuspiciousOperation, ProviderUnavailable, requests.RequestException) as exc:
            log.warning("single sign-on refused: %s", exc)
            if request.user.is_authenticated:
                auth.logout(request)
            return HttpResponseRedirect(f"{reverse('login')}?sso=failed")


# --- The live socket's re-check ------------------------------------------------------------


def _userinfo(access_token: str) -> dict | None:
    """Userinfo's claims, None if the provider refuses the token; raises if it is down."""
    response = requests.get(
        discovery()["userinfo_endpoint"],
        headers={"Authorization": f"Bearer {access_token}"},
        timeout=settings.OIDC_TIMEOUT,
    )
    if response.status_code in (400, 401, 403):
        return None
    response.raise_for_status()
    return response.json()


def _refreshed(session) -> str | None:
    refresh = session.get(REFRESH_TOKEN)
    fresh = _refresh(refresh) if refresh else None
    if fresh is None:
        return None
    session["oidc_access_token"], session[REFRESH_TOKEN] = fresh
    return fresh[0] or None


def recheck_user(user) -> str:
    """For any request of a user signed in through the provider (a page, REST, an API token,
    a live socket), at most every ``OIDC_RECHECK_SECONDS``: ask the provider again with the
    tokens of the user's latest sign-in and make the role follow its groups (issue 35: a user
    removed from a group kept the role on pages, REST and API tokens). "ok" (nothing to do,
    or the provider cannot be reached: asked again next time), "changed" (the role was re-read)
    or "ended" (the provider no longer vouches for the user: no role)."""
    if not enabled() or settings.OIDC_RECHECK_SECONDS <= 0:
        return "ok"
    identity = sso.identity_of(user)
    if identity is None:
        return "ok"
    age = (timezone.now() - identity.last_seen_at).total_seconds()
    if age < settings.OIDC_RECHECK_SECONDS:
        return "ok"
    try:
        claims = _userinfo(identity.access_token) if identity.access_token else None
        if claims is None and identity.refresh_token:
            fresh = _refresh(identity.refresh_token)
            if fresh is not None:
                identity.access_token, identity.refresh_token = fresh
                sso.keep_provider_tokens(user=user, access_token=fresh[0], refresh_token=fresh[1])
                claims = _userinfo(fresh[0])
    except (requests.RequestException, ValueError, ProviderUnavailable) as exc:
        log.warning("single sign-on re-check of user %s deferred: %s", user.pk, exc)
        return "ok"
    if claims is not None and claims.get("sub") != identity.subject:
        claims = None
    role = sso.do_sso_recheck(user=user, claims=claims)
    return "changed" if role is not None else "ended"


def _refresh(refresh_token: str) -> tuple[str, str] | None:
    """A new (access token, refresh token) for ``refresh_token``, or None if refused."""
    response = requests.post(
        discovery()["token_endpoint"],
        data={"grant_type": "refresh_token", "refresh_token": refresh_token},
        auth=(settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET),
        timeout=settings.OIDC_TIMEOUT,
    )
    if response.status_code != 200:
        return None
    tokens = response.json()
    return tokens.get("access_token", ""), tokens.get("refresh_token") or refresh_token


class RecheckMiddleware:
    """Pages and REST (after authentication): a user signed in through the provider whose
    claims are older than ``OIDC_RECHECK_SECONDS`` is re-checked; one the provider no longer
    vouches for is signed out of this session."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user = getattr(request, "user", None)
        if enabled() and user is not None and user.is_authenticated:
            if recheck_user(user) == "ended":
                auth.logout(request)
        return self.get_response(request)


def recheck_session(user, session_key: str | None) -> str:
    """For a socket signed in through the provider, at most every ``OIDC_RECHECK_SECONDS``:
    ask the provider for the user's groups and make the role follow them. Answers "ok",
    "ended" (the provider no longer accepts the session: it is signed out) or "changed" (the
    role was re-read; the caller reads it again). A provider that cannot be reached changes
    nothing and is asked again at the next heartbeat."""
    if not enabled() or not session_key or settings.OIDC_RECHECK_SECONDS <= 0:
        return "ok"
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    token = session.get("oidc_access_token")
    if not token or time.time() - session.get(CHECKED_AT, 0) < settings.OIDC_RECHECK_SECONDS:
        return "ok"
    try:
        claims = _userinfo(token)
        if claims is None:
            fresh = _refreshed(session)
            claims = _userinfo(fresh) if fresh else None
    except (requests.RequestException, ValueError, ProviderUnavailable) as exc:
        log.warning("single sign-on re-check of user %s deferred: %s", user.pk, exc)
        return "ok"
    identity = getattr(user, "sso_identity", None)
    if claims is None or identity is None or claims.get("sub") != identity.subject:
        session.flush()  # signed out: the next sign-in goes through the provider again
        return "ended"
    sso.do_sso_recheck(user=user, claims=claims)
    session[CHECKED_AT] = time.time()
    session.save()
    return "changed"

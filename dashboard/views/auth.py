"""Sign-in and sign-out pages (password, and the identity provider's button)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import reverse

from dashboard.views.base import (
    refuse,
)

SSO_MESSAGES = {
    "norole": "Your groups at the identity provider give you no role in Canopy. Ask an admin "
    "to add you to a Canopy group.",
    "failed": "Sign-in with the identity provider failed or was refused. Please try again.",
    "unavailable": "The identity provider cannot be reached right now.",
    "refused": "Sign-in with the identity provider was refused.",
}


class LoginView(auth_views.LoginView):
    template_name = "registration/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        # Single sign-on (issue 28): the provider's button, and why its last attempt failed.
        status = self.request.GET.get("sso", "")
        return super().get_context_data(
            sso_enabled=bool(settings.OIDC_ISSUER),
            sso_provider=getattr(settings, "OIDC_PROVIDER_NAME", ""),
            local_passwords=settings.OIDC_LOCAL_PASSWORDS,
            sso_status=status,
            sso_message=SSO_MESSAGES.get(status, ""),
            **kwargs,
        )

    def post(self, request, *args, **kwargs):
        if not settings.OIDC_LOCAL_PASSWORDS:
            return refuse(request, "Password sign-in is off: sign in with the identity provider.")
        return super().post(request, *args, **kwargs)

    def get_default_redirect_url(self):
        return reverse("home")


class LogoutView(auth_views.LogoutView):
    pass

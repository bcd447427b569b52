"""The dashboard's pages and its REST API; ``canopy/urls.py`` mounts them at the root."""

from django.conf import settings
from django.urls import path

from dashboard import (
    alerts_views,
    fork_pause_views,
    inbox,
    leases_views,
    retention,
    run_forms,
    views,
)

urlpatterns = [
    path("api/", ("dashboard.api.urls", "api", "api")),
    path("", views.home, name="home"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("trees/", views.trees, name="trees"),
    path("launch/", views.launch, name="launch"),
    path("trees/<str:run_id>/", views.tree, name="tree"),
    path("runs/<str:run_id>/", views.run_detail, name="run"),
    path("runs/<str:run_id>/cancel/", views.run_cancel, name="run-cancel"),
    path("runs/<str:run_id>/budget/", run_forms.run_budget, name="run-budget"),
    path("runs/<str:run_id>/relaunch/", run_forms.run_relaunch, name="run-relaunch"),
    path("runs/<str:run_id>/compare/", run_forms.run_compare, name="run-compare"),
    # SPEC §14: fork from here, pause and resume (issue 37).
    path("runs/<str:run_id>/fork/", fork_pause_views.run_fork, name="run-fork"),
    path("runs/<str:run_id>/pause/", fork_pause_views.run_pause, name="run-pause"),
    path("runs/<str:run_id>/resume/", fork_pause_views.run_resume, name="run-resume"),
    path("leases/", leases_views.leases, name="leases"),
    path("leases/<int:pk>/release/", views.lease_release, name="lease-release"),
    path("runners/", views.runners, name="runners"),
    path("audit/", views.audit, name="audit"),
    # The admins' alerts page (issue 25).
    path("alerts/", alerts_views.alerts_page, name="alerts"),
    path("alerts/webhooks/", alerts_views.webhook_create, name="webhook-create"),
    path("alerts/webhooks/<int:pk>/test/", alerts_views.webhook_test, name="webhook-test"),
    path("alerts/webhooks/<int:pk>/active/", alerts_views.webhook_active, name="webhook-active"),
    path("alerts/webhooks/<int:pk>/delete/", alerts_views.webhook_delete, name="webhook-delete"),
    # Approvals (SPEC §11)
    path("approvals/", inbox.inbox, name="approvals"),
]

# Single sign-on (issue 28): the provider's button and its callback, when a provider is set.
if settings.OIDC_ISSUER:
    from dashboard import sso

    urlpatterns += [
        path("oidc/start/", sso.ProviderSignIn.as_view(), name="oidc-start"),
        path("oidc/callback/", sso.ProviderCallback.as_view(), name="oidc-callback"),
    ]

# Retention (issue 28): what the next pass deletes, and the last passes (admins).
urlpatterns += [
    path("retention/", retention.retention, name="retention"),
    path("retention/keep/", retention.keep, name="retention-keep"),
]

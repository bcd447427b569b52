"""The dashboard's pages and its REST API; ``canopy/urls.py`` mounts them at the root."""

from django.conf import settings
from django.urls import path

from dashboard.views import (
    alerts,
    approvals,
    audit,
    auth,
    fork_pause,
    launch,
    leases,
    retention,
    run_forms,
    runs,
    trees,
)

urlpatterns = [
    path("api/", ("dashboard.api.urls", "api", "api")),
    path("", trees.home, name="home"),
    path("login/", auth.LoginView.as_view(), name="login"),
    path("logout/", auth.LogoutView.as_view(), name="logout"),
    path("trees/", trees.trees, name="trees"),
    path("launch/", launch.launch, name="launch"),
    path("trees/<str:run_id>/", trees.tree, name="tree"),
    path("runs/<str:run_id>/", runs.run_detail, name="run"),
    path("runs/<str:run_id>/cancel/", runs.run_cancel, name="run-cancel"),
    path("runs/<str:run_id>/budget/", run_forms.run_budget, name="run-budget"),
    path("runs/<str:run_id>/relaunch/", run_forms.run_relaunch, name="run-relaunch"),
    path("runs/<str:run_id>/compare/", run_forms.run_compare, name="run-compare"),
    # SPEC §14: fork from here, pause and resume (issue 37).
    path("runs/<str:run_id>/fork/", fork_pause.run_fork, name="run-fork"),
    path("runs/<str:run_id>/pause/", fork_pause.run_pause, name="run-pause"),
    path("runs/<str:run_id>/resume/", fork_pause.run_resume, name="run-resume"),
    path("leases/", leases.leases, name="leases"),
    path("leases/<int:pk>/release/", leases.lease_release, name="lease-release"),
    path("runners/", audit.runners, name="runners"),
    path("audit/", audit.audit, name="audit"),
    # The admins' alerts page (issue 25).
    path("alerts/", alerts.alerts_page, name="alerts"),
    path("alerts/webhooks/", alerts.webhook_create, name="webhook-create"),
    path("alerts/webhooks/<int:pk>/test/", alerts.webhook_test, name="webhook-test"),
    path("alerts/webhooks/<int:pk>/active/", alerts.webhook_active, name="webhook-active"),
    path("alerts/webhooks/<int:pk>/delete/", alerts.webhook_delete, name="webhook-delete"),
    # Approvals (SPEC §11)
    path("approvals/", approvals.inbox, name="approvals"),
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

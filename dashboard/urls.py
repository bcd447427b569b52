"""The dashboard's pages and its REST API; ``canopy/urls.py`` mounts them at the root."""

from django.urls import path

from dashboard import inbox, views

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
    path("runs/<str:run_id>/budget/", views.run_budget, name="run-budget"),
    path("leases/<int:pk>/release/", views.lease_release, name="lease-release"),
    path("runners/", views.runners, name="runners"),
    path("audit/", views.audit, name="audit"),
    # Approvals (SPEC §11)
    path("approvals/", inbox.inbox, name="approvals"),
]

from django.contrib import admin
from django.urls import include, path

from dashboard.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("", include("dashboard.urls")),
]

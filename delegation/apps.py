from django.apps import AppConfig


class DelegationConfig(AppConfig):
    name = "delegation"
    verbose_name = "Delegation engine"

    def ready(self):
        from delegation import checks  # noqa: F401 (registers the deploy checks)

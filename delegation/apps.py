from django.apps import AppConfig


class DelegationConfig(AppConfig):
    name = "delegation"
    verbose_name = "Delegation engine"

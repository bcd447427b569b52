"""Django admin over the record, with the operator actions.

The records are read-only here (the runner protocol and the services write them); the
actions cancel, cancel subtree, steer (with its own form) and release lease call the same
service functions as the dashboard, the REST API and the runners, so they check the role and
write the audit entry the same way. Who may see what follows the Canopy roles: viewers read,
operators also act, admins also manage runners and API tokens.
"""

from django.contrib import admin

# Importing the modules registers their model admins.
from delegation.admin import (  # noqa: F401
    access,
    alerts,
    approvals,
    base,
    leases,
    prices,
    runners,
    runs,
    upkeep,
)
from delegation.admin.runs import SteerForm

admin.site.site_header = "Canopy admin"
admin.site.site_title = "Canopy admin"
admin.site.index_title = "The record"

__all__ = ["SteerForm"]

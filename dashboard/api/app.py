"""The REST API object: built here, with every resource's router added; ``urls`` mounts it."""

# traces adds GET /runs/{runId}/trace (SPEC §12) to the runs router.
from dashboard.api import (  # noqa: F401
    alerts,
    approvals,  # SPEC §11: the approval queue and policies
    audit,
    children,  # issue 24: adds /runs/{runId}/children
    compare,  # issue 25: two runs side by side
    forks,  # SPEC §14: POST /runs/{runId}/fork
    leases,
    overview,  # issue 25: the overview's headline numbers
    prices,  # issue 23: the price table
    run_actions,
    runners,
    runs,
    sessions,
    traces,
)
from dashboard.api.core import AUTH, ERRORS_DOC, CanopyAPI, StrictParser, install_error_handlers

DESCRIPTION = (
    """
Query and act on Canopy's delegation trees: sessions, runs (filter, detail, subtree, events,
NDJSON export), leases, runners and the audit log; cancel, steer and release; webhooks
and their delivery log (admins).

**Authentication.** `Authorization: Bearer <api token>` (create one with
`python manage.py api_token create USERNAME`; it acts with that user's role) or the browser's
Django session, in which case POST requests also need the CSRF token in `X-CSRFToken`.
Roles: **viewer** reads everything; **operator** may also cancel, steer and release;
**admin** also manages tokens and webhooks (alerts). A signed-in user with no role gets 403 everywhere.

**Names.** Query parameters are snake_case (`depth_min`, `created_after`, `lease_id`); JSON
bodies and responses use the wire's camelCase (`runId`, `requestId`). Unknown or repeated
query parameters are refused (422), so a typo never silently widens a filter.

**Pagination.** Every list answers `{"items": [...], "next": cursor|null}`; pass `next` back
as `cursor` for the following page. Cursors are keyset positions on a unique indexed key, so
rows added while you page never shift or repeat a page.

**Actions** run through the same engine functions as the runner protocol's `child.cancel`,
`child.steer` and `child.lease.release`, and every one (also a refused one) is audited.
"""
    + ERRORS_DOC
)

api = CanopyAPI(
    title="Canopy REST API",
    version="1",
    description=DESCRIPTION,
    auth=AUTH,
    parser=StrictParser(),
    urls_namespace="api",
    docs_url="/docs",
    openapi_url="/openapi.json",
)
install_error_handlers(api)

# The order here is the order of the OpenAPI document's operations. ``run_actions`` adds
# its operations to ``runs.router`` when imported.
for router in (
    runs.router,
    sessions.router,
    leases.router,
    runners.router,
    audit.router,
    alerts.router,
    overview.router,
    compare.router,
    approvals.router,
    prices.router,
):
    api.add_router("", router)

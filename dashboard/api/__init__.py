"""Canopy's REST API (SPEC §7), mounted at /api/ by ``dashboard.api.urls``.

``app`` builds the NinjaAPI and adds one router per resource (``runs`` and ``run_actions``,
``sessions``, ``leases``, ``runners``, ``audit``, ``alerts``); ``core`` holds what they share
(authentication, the error envelope, strict parsing, cursors); ``schemas`` the shapes, one
module per resource; ``rows`` how a run row is shown; ``export`` the NDJSON stream.
"""

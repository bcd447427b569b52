"""ASGI entry point: HTTP through Django, WebSockets for runners and live operators, and the
MCP server at /mcp (with the ASGI lifespan its session manager needs)."""

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "canopy.settings")

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

# The dashboard's CSS and ES modules are served by the same process (no build step, no CDN,
# no separate web server needed for the embedded default).
django_asgi_app = ASGIStaticFilesHandler(get_asgi_application())

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from canopy.backpressure import with_back_pressure  # noqa: E402
from canopy.bodylimit import (  # noqa: E402
    HTTP_MAX_BODY_BYTES,
    MCP_MAX_BODY_BYTES,
    BodyLimit,
    install_daphne_body_limit,
)
from canopy.direct_writes import install_direct_writes  # noqa: E402
from dashboard.live import live_application  # noqa: E402
from delegation import upkeep  # noqa: E402
from delegation.mcp.gate import McpGate  # noqa: E402
from delegation.runner_socket.consumer import RunnerSocketConsumer  # noqa: E402
from delegation.services.run_tokens import MCP_PATH  # noqa: E402

websocket_routes = [
    # Runners authenticate with their own bearer token; no session, no Origin check.
    path("ws/runner/", RunnerSocketConsumer.as_asgi()),
    # Operators: session (exact Origin checked) or an API bearer token.
    path("ws/live/", live_application()),
]

router = ProtocolTypeRouter(
    {
        # Streamed responses (NDJSON export) wait for a slow client instead of buffering.
        "http": with_back_pressure(django_asgi_app),
        "websocket": URLRouter(websocket_routes),
    }
)


async def _django_and_sockets(scope, receive, send):
    # Lease expiry and runner loss must be swept even when no runner is connected (that is
    # when a runner is lost): any request or socket starts the sweep in this process.
    if scope["type"] in ("http", "websocket"):
        upkeep.ensure_started()
    return await router(scope, receive, send)


# Bodies are bounded first, before any door authenticates (under daphne, while they arrive).
install_daphne_body_limit(HTTP_MAX_BODY_BYTES)
# Frames leave when they are written, not on the reactor's next turn (issue 39).
install_direct_writes()

# /mcp goes to the MCP SDK (agents, with a run token); lifespan is handled here because
# channels' router refuses it; everything else is Django and the two sockets.
application = BodyLimit(
    McpGate(_django_and_sockets),
    default=HTTP_MAX_BODY_BYTES,
    paths={MCP_PATH: MCP_MAX_BODY_BYTES},
)


# Everything loaded so far (Django, the apps, the SDKs: most of the heap) lives as long as the
# process: moved out of the collector's reach, a full collection no longer walks it. Before,
# one took 78-120 ms on the event loop now and then, and was the live push's p99 with one
# process (bench.fleet 1 20 200: 130 ms; with the freeze 13 ms).
gc.freeze()

"""ASGI entry point: HTTP through Django, WebSockets for runners and live operators."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from delegation.consumers import RunnerConsumer  # noqa: E402

websocket_routes = [
    path("ws/runner/", RunnerConsumer.as_asgi()),
]

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(websocket_routes),
    }
)

"""/api/docs works offline: every asset it loads is served by Canopy itself (ninja's bundled
Swagger UI through the ASGI app's static handler), nothing comes from a CDN."""

import re

from channels.testing import ApplicationCommunicator

from canopy.asgi import application


async def fetch(path: str) -> tuple[int, dict, bytes]:
    """GET ``path`` through the production ASGI application (as daphne would)."""
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    app = ApplicationCommunicator(application, scope)
    await app.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await app.receive_output(timeout=10)
    body = b""
    while True:
        message = await app.receive_output(timeout=10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await app.wait(timeout=10)
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, body


# No database mark: the docs, their assets and the schema are served without a query (the
# blocker would fail the test if one crept in).
async def test_it_serves_the_docs_and_all_their_assets_locally():
    status, headers, body = await fetch("/api/docs")
    assert status == 200 and headers["content-type"].startswith("text/html")
    html = body.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    assert all(a.startswith("/") and not a.startswith("//") for a in assets), assets
    for asset in assets:
        asset_status, _, asset_body = await fetch(asset)
        assert asset_status == 200 and asset_body, asset
    schema_status, _, schema = await fetch("/api/openapi.json")
    assert schema_status == 200 and b'"openapi"' in schema

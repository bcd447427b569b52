"""A real OTLP/HTTP trace receiver on a loopback port, decoding protobuf with opentelemetry-proto.

Not a mock of the exporter: the exporter under test sends real requests over TCP and this
answers as a collector does (200 with an empty ``ExportTraceServiceResponse``). Every span of
every request is kept, duplicates included, so a test can prove each arrived exactly once.
``stop()`` closes the port (the exporter sees connection refused, a collector that is down)
and ``start()`` opens the same port again.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class OtlpReceiver:
    def __init__(self):
        self.port = 0
        self.spans: list = []  # opentelemetry.proto.trace.v1.Span, in arrival order
        self.resources: list = []
        self.requests = 0
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.requests += 1
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                    for resource_spans in request.resource_spans:
                        receiver.resources.append(resource_spans.resource)
                        for scope_spans in resource_spans.scope_spans:
                            receiver.spans.extend(scope_spans.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def span_ids(self) -> list[str]:
        with self.lock:
            return [span.span_id.hex() for span in self.spans]

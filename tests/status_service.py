"""The status service the status example (examples/status_agent) calls: a real HTTP server
on a local port, for the tests that run the example locally and on the deployed shape."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class StatusService:
    """A local HTTP server: `/health/<name>` is 200 for the services in `up`, 503 otherwise;
    `POST /incidents` opens an incident once per `Idempotency-Key`, as a payment provider
    applies a charge once per key."""

    up: set[str] = field(default_factory=lambda: {"search"})
    posts: list[str] = field(default_factory=list)
    incidents: dict[str, dict[str, Any]] = field(default_factory=dict)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _answer(self, status: int, body: str, kind: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                name = self.path.removeprefix("/health/")
                if name in service.up:
                    self._answer(200, "ok")
                else:
                    self._answer(503, "database unreachable")

            def do_POST(self) -> None:
                key = self.headers["Idempotency-Key"]
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                service.posts.append(key)
                incident = service.incidents.setdefault(
                    key, {"id": f"INC-{len(service.incidents) + 1}", **body}
                )
                self._answer(201, json.dumps(incident), "application/json")

        return Handler


@contextmanager
def serving(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatusService]:
    """The service, listening, with `STATUS_API_URL` naming it for the example's resources."""
    service = StatusService()
    server = ThreadingHTTPServer(("127.0.0.1", 0), service.handler())
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("STATUS_API_URL", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield service
    finally:
        server.shutdown()
        server.server_close()

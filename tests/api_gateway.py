"""API Gateway's REST proxy in front of the runs API function, on a local port: what a program
(`ratchet doctor`) calls over HTTP, as it calls the deployed stack's.

Each request becomes the proxy event API Gateway makes (`tests.integration.aws.harness.
api_event`) and goes to the real `ratchet.handlers.api.handler`, in this process. As the stack's
API does with IAM authorization, a request without a SigV4 signature for `execute-api` is
refused with 403 before the function runs. The base URL ends in the stage, `/v1`, as the
stack's `RATCHET_PUBLIC_URL` does.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

STAGE = "v1"
ROUTES = ("/runs", "/runs/{run_id}")
SIGNED = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=[^/]+/\d{8}/(?P<region>[a-z0-9-]+)/execute-api/aws4_request, "
    r"SignedHeaders=[a-z0-9;-]*host[a-z0-9;-]*, Signature=[0-9a-f]{64}$"
)

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass
class Gateway:
    url: str
    """The stage's base URL: `http://127.0.0.1:PORT/v1`."""
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    """Each request as (method, path and query, the region its signature names or '')."""
    refuse_with: int | None = None
    """When set, every request is answered with this status (a misconfigured API)."""


@contextmanager
def local_gateway(handler: Handler, context: Any) -> Iterator[Gateway]:
    """The runs API on a free local port for the span of the block."""
    gateway = Gateway(url="")

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._proxy()

        def do_POST(self) -> None:
            self._proxy()

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _proxy(self) -> None:
            from tests.integration.aws.harness import api_event

            parts = urlsplit(self.path)
            signed = SIGNED.fullmatch(self.headers.get("Authorization", ""))
            gateway.requests.append(
                (self.command, self.path, signed.group("region") if signed else "")
            )
            path = parts.path.removeprefix(f"/{STAGE}")
            resource = next(
                (r for r in ROUTES if re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", r), path)), None
            )
            if gateway.refuse_with is not None or signed is None or resource is None:
                status = gateway.refuse_with or 403
                self._answer(status, {"error": "Forbidden", "problems": []})
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode("utf-8") if length else None
            query = parse_qs(parts.query) or None
            event = api_event(self.command, path, body, query=query, resource=resource, stage=STAGE)
            response = handler(event, context)
            self._answer(response["statusCode"], json.loads(response["body"] or "null"))

        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    gateway.url = f"http://127.0.0.1:{server.server_address[1]}/{STAGE}"
    thread = threading.Thread(target=server.serve_forever, name="local-gateway", daemon=True)
    thread.start()
    try:
        yield gateway
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

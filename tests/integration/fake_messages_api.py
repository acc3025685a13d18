"""A local stand-in for the Anthropic Messages API, for driving the real SDK in tests.

It also answers Bedrock's InvokeModel route (`POST /model/<id>/invoke`), which the SDK's
`AnthropicBedrock` client posts the same Messages body to, SigV4-signed.

`FakeMessagesApi` is a real HTTP server on 127.0.0.1 that answers `POST /v1/messages` from a
queue of scripted responses and records every request, so a test can assert on exactly what
the SDK sent. Response bodies have the shape of the real API's, so the SDK parses them the way
it would parse production traffic.

    with FakeMessagesApi() as api:
        api.enqueue(tool_use_response("list_files", {"path": "/"}))
        client = anthropic.Anthropic(api_key="test-key", base_url=api.url, max_retries=0)
        ...
        assert api.requests[0].body["model"] == "claude-test"
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from ratchet.adapters.anthropic_model import Pacing

MESSAGES_PATH = "/v1/messages"
BEDROCK_PATH = re.compile(r"^/model/[^/]+/invoke$")
"""Bedrock's InvokeModel route, which the SDK's Bedrock client posts the same body to."""
DEFAULT_USAGE = {
    "input_tokens": 120,
    "output_tokens": 30,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}

HANG_LIMIT_S = 30.0
"""A hanging response gives up after this long even if nobody releases it, so a broken test
fails instead of leaving a thread blocked forever."""

_ids = itertools.count(1)


@dataclass(frozen=True)
class ScriptedResponse:
    """One answer the server gives, in the order it was queued.

    `payload` is sent as JSON; `raw_body` is sent as-is (for bodies that are not valid JSON).
    With `echo_model`, the payload's `model` is set to the model the request named, as the
    real API does. With `hang`, the server holds the request until the fake is reset or
    stopped.
    """

    status: int = 200
    payload: dict[str, Any] | None = None
    raw_body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    echo_model: bool = False
    hang: bool = False

    def render(self, request_body: dict[str, Any] | None) -> bytes:
        if self.raw_body is not None:
            return self.raw_body
        payload = dict(self.payload or {})
        if self.echo_model and request_body is not None:
            payload["model"] = request_body.get("model")
        return json.dumps(payload).encode()


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    """Header names are lower-cased."""
    body: dict[str, Any] | None
    """The parsed JSON body, or None if the body was not a JSON object."""


def _message(
    content: list[dict[str, Any]], stop_reason: str, usage: dict[str, int] | None = None
) -> ScriptedResponse:
    number = next(_ids)
    return ScriptedResponse(
        payload={
            "id": f"msg_fake{number:06d}",
            "type": "message",
            "role": "assistant",
            "model": None,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {**DEFAULT_USAGE, **(usage or {})},
        },
        headers={"request-id": f"req_fake{number:06d}"},
        echo_model=True,
    )


def tool_use_response(
    name: str,
    arguments: dict[str, Any],
    *,
    preamble: str | None = None,
    usage: dict[str, int] | None = None,
) -> ScriptedResponse:
    """The model calls one tool, optionally after a text block, as Claude often does.
    `usage` overrides fields of the reported usage (`DEFAULT_USAGE`)."""
    content: list[dict[str, Any]] = []
    if preamble is not None:
        content.append({"type": "text", "text": preamble})
    content.append(
        {"type": "tool_use", "id": f"toolu_fake{next(_ids):06d}", "name": name, "input": arguments}
    )
    return _message(content, stop_reason="tool_use", usage=usage)


def text_response(*texts: str, usage: dict[str, int] | None = None) -> ScriptedResponse:
    """The model answers in text only: one text block per argument."""
    return _message(
        [{"type": "text", "text": text} for text in texts], stop_reason="end_turn", usage=usage
    )


def error_response(
    status: int, error_type: str, message: str, *, headers: dict[str, str] | None = None
) -> ScriptedResponse:
    """An error in the API's envelope: `{"type": "error", "error": {"type", "message"}}`."""
    request_id = f"req_fake{next(_ids):06d}"
    return ScriptedResponse(
        status=status,
        payload={
            "type": "error",
            "error": {"type": error_type, "message": message},
            "request_id": request_id,
        },
        headers={"request-id": request_id, **(headers or {})},
    )


def rate_limited(*, retry_after_s: int = 1) -> ScriptedResponse:
    return error_response(
        429,
        "rate_limit_error",
        "Number of request tokens has exceeded your per-minute rate limit.",
        headers={"retry-after": str(retry_after_s)},
    )


def overloaded(*, retry_after_s: int | None = None) -> ScriptedResponse:
    """A 529: the API is overloaded for everyone, not just this key."""
    headers = {"retry-after": str(retry_after_s)} if retry_after_s is not None else None
    return error_response(529, "overloaded_error", "Overloaded", headers=headers)


def server_error(*, retry_after_ms: int | None = None) -> ScriptedResponse:
    """A 500. `retry_after_ms` sets the header the SDK prefers over its own backoff."""
    headers = {"retry-after-ms": str(retry_after_ms)} if retry_after_ms is not None else None
    return error_response(500, "api_error", "Internal server error", headers=headers)


def malformed_json() -> ScriptedResponse:
    """A 200 whose body is cut off mid-JSON, as a broken proxy or a dropped stream leaves it."""
    return ScriptedResponse(raw_body=b'{"id": "msg_fake", "type": "message", "content": [{"ty')


def unexpected_shape() -> ScriptedResponse:
    """A 200 with valid JSON that is not a message at all."""
    return ScriptedResponse(payload={"status": "ok", "detail": "not a message"})


def hanging_response() -> ScriptedResponse:
    """Holds the request open until the fake is reset or stopped, so the client times out."""
    return ScriptedResponse(hang=True, payload={"type": "error"})


class FakeMessagesApi:
    """A Messages API server on an ephemeral local port, serving queued responses in order.

    Use it as a context manager (or call `start` and `stop`). `url` is the base URL to give
    the SDK. A request that finds the queue empty gets a 400, which the SDK does not retry,
    so a test that under-scripts the server fails loudly rather than hanging.
    """

    def __init__(self) -> None:
        self._queue: deque[ScriptedResponse] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        # A short poll interval keeps `stop` quick: shutdown waits for the loop's next poll.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="fake-messages-api",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def enqueue(self, *responses: ScriptedResponse) -> None:
        with self._lock:
            self._queue.extend(responses)

    def reset(self) -> None:
        """Forget queued responses and recorded requests, and release any hanging request, so
        one server can serve many tests."""
        with self._lock:
            self._queue.clear()
            self._requests.clear()
            # Handlers already waiting hold the old event, which this releases; later hangs
            # wait on the new one.
            self._release.set()
            self._release = threading.Event()

    def start(self) -> FakeMessagesApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        # Release hanging handlers first: shutdown only stops the accept loop, and a handler
        # still blocked would keep its thread (and the client's socket) alive.
        with self._lock:
            self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeMessagesApi:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _next_response(self, request: RecordedRequest) -> tuple[ScriptedResponse, threading.Event]:
        """Record `request` and pick its answer, plus the event a hanging answer waits for
        (taken under the same lock, so a concurrent `reset` cannot strand it on a new event)."""
        with self._lock:
            self._requests.append(request)
            release = self._release
            path = request.path.split("?")[0]
            if path != MESSAGES_PATH and not BEDROCK_PATH.fullmatch(path):
                scripted = error_response(404, "not_found_error", f"no route for {request.path}")
            elif self._queue:
                scripted = self._queue.popleft()
            else:
                scripted = error_response(
                    400, "invalid_request_error", "fake Messages API: no scripted response left"
                )
        return scripted, release

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    parsed = json.loads(raw)
                except ValueError:
                    parsed = None
                body = parsed if isinstance(parsed, dict) else None
                request = RecordedRequest(
                    method="POST",
                    path=self.path,
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=body,
                )
                scripted, release = fake._next_response(request)
                if scripted.hang:
                    release.wait(HANG_LIMIT_S)
                self._send(scripted, body)

            def _send(self, scripted: ScriptedResponse, body: dict[str, Any] | None) -> None:
                data = scripted.render(body)
                try:
                    self.send_response(scripted.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in scripted.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    # The client gave up (the timeout case): nobody is left to answer.
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                # Keep pytest output clean; the recorded requests are the log.
                pass

        return Handler


EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass
class FakeClock:
    """The adapter's clock and sleep, without waiting: `sleep` records the delay and moves
    the clock on. `jitter` is the share of each backoff bound the adapter draws (1.0: the
    whole bound, so delays are predictable)."""

    seconds: float = 0.0
    slept: list[float] = field(default_factory=list)
    jitter: float = 1.0

    def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.seconds += delay

    def pacing(self) -> Pacing:
        return Pacing(
            sleep=self.sleep,
            clock=lambda: self.seconds,
            jitter=lambda: self.jitter,
            now=lambda: EPOCH + timedelta(seconds=self.seconds),
        )

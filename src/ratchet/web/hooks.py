"""The webhook route: GitHub, Stripe or a CI server delivers an event to a waiting run.

    POST /hooks/{hook_id}     a signed delivery (`ratchet.waiting.hooks`: the signature
                              schemes, and what makes a hook); the answer is the event
                              desk's, as for any sender: delivered, queued or a duplicate

The route carries no AWS credentials (GitHub has none): the hook's signature, the replay
window, throttling and an id of 128 bits protect it, and no route lists hooks. It answers at
once: it keeps and delivers the event in the request (a few reads and one write) and never
waits for the run's next step. Every refusal is a 4xx JSON naming the field, with nothing
written, in the runs API's envelope: `{"error": ..., "problems": [{"field", "message"}]}`; a
store out of reach is a 503 in it, with Retry-After (`ratchet.web.outages`).
Nothing it logs holds the hook's secret, a signature or the payload.

The same app serves `ratchet serve` locally (with `Throttle`, since serve has no throttle of
its own) and the `hooks` Lambda function on AWS (`ratchet.handlers.hooks`, throttled by API
Gateway). The throttle counts refusals, per address: a delivery is checked (its length, its
hook, its signature) before any bucket is looked at, so one signed with the hook's secret is
never refused because someone else posted junk to the URL, even from the same address (a
tunnel in front of serve gives every sender its address).
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response

from ratchet.errors import InvalidInput, PayloadTooLarge, WaitError
from ratchet.ports import HookBook
from ratchet.state import MAX_EVENT_BYTES
from ratchet.waiting.desk import EventDesk, EventInvalid
from ratchet.waiting.hooks import (
    DeliveryInvalid,
    HookKeys,
    HookRefused,
    check_length,
    deliver,
    find_hook,
    verify_delivery,
)
from ratchet.web.outages import Outage, answer_outages, outage_words

BODY_LIMIT = ("/hooks/", MAX_EVENT_BYTES)
"""`ratchet serve` refuses a longer body on its Content-Length, before reading it (413)."""
THROTTLE_RATE_PER_SECOND = 5.0
THROTTLE_BURST = 10
"""Refused deliveries an address may make (ratchet/cdk/api.py's public rate): a sender that
signs gets a refusal only while it is being set up; far above that is abuse."""
MAX_THROTTLED_SOURCES = 1024
"""Buckets kept at once (the least recently used go first): addresses an attacker has cost
memory only up to this."""


class Throttle:
    """A token bucket per key (a sender's address), for `ratchet serve`: `rate` a second,
    after a burst of `burst`. Kept in memory (a refusal writes nothing), on the monotonic
    clock."""

    def __init__(
        self,
        rate: float = THROTTLE_RATE_PER_SECOND,
        burst: int = THROTTLE_BURST,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_THROTTLED_SOURCES,
    ) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def allow(self, key: str) -> bool:
        with self._lock:
            now = self._clock()
            tokens, then = self._buckets.pop(key, (self._burst, now))
            tokens = min(self._burst, tokens + (now - then) * self._rate)
            allowed = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
            return allowed


@dataclass(frozen=True)
class HookServices:
    book: HookBook
    keys: HookKeys
    desk: EventDesk
    logger: Any = None
    throttle: Throttle | None = None
    """`ratchet serve`'s, for the refusals of each address; none on AWS, where API Gateway
    throttles the route."""


def build_app(services: Callable[[], HookServices]) -> APIGatewayRestResolver:
    app = APIGatewayRestResolver()
    routes = HookRoutes(app, services)
    app.post("/hooks/<hook_id>")(routes.deliver)
    # A store out of reach, from the hook's lookup to the event's write: 503 with Retry-After,
    # nothing written, and the sender delivers again (a duplicate if it had been kept).
    answer_outages(app, "the webhooks", routes.outage, lambda: services().logger)
    return app


class HookRoutes:
    def __init__(self, app: APIGatewayRestResolver, services: Callable[[], HookServices]) -> None:
        self.app = app
        self.services = services

    def deliver(self, hook_id: str) -> Response[str]:
        """One delivery: checked in full before anything is written, then sent to the run."""
        wired = self.services()
        event = self.app.current_event
        headers = dict(event.headers or {})
        try:
            check_length(headers)  # before the body is looked at
            hook = find_hook(wired.book, hook_id)
            delivery = verify_delivery(
                headers,
                _raw_body(event.body, bool(event.is_base64_encoded)),
                wired.keys.secret(hook.hook_id),
                now=wired.desk.clock().timestamp(),
            )
        except (HookRefused, PayloadTooLarge) as refused:
            return self._refuse_unchecked(wired, refused)
        try:
            if delivery.ping:
                return _json(HTTPStatus.OK, {"status": "pong", "name": hook.name})
            sent = deliver(wired.desk, hook, delivery)
        except HookRefused as refused:
            return self._refuse(wired, refused.http_status, str(refused), refused.field)
        except PayloadTooLarge as large:
            return self._refuse(wired, large.http_status, str(large), "body")
        except EventInvalid as invalid:
            # The run waits with a schema and the payload does not match it: the message
            # names the payload's field (`data.<field>`), the payload sent as the body.
            where = str(invalid).split(":", 1)[0].replace("data", "body", 1)
            return self._refuse(wired, invalid.http_status, str(invalid), where)
        except WaitError as refused:  # the run ended, takes no such event, a full mailbox
            return self._refuse(wired, refused.http_status, str(refused), "hook")
        except InvalidInput as invalid:  # a payload the desk cannot keep (too deep, ...)
            return self._refuse(wired, HTTPStatus.BAD_REQUEST, str(invalid), "body")
        answer = sent.answer()
        if wired.logger is not None:
            wired.logger.info(
                "webhook delivery taken",
                extra={
                    "run_id": answer["run_id"],
                    "event_name": answer["name"],
                    "event_id": answer["event_id"],
                    "status": answer["status"],
                    "duplicate": answer["duplicate"],
                    "scheme": delivery.scheme,
                },
            )
        return _json(HTTPStatus.OK, answer)

    def outage(self, error: Outage) -> Response[str]:
        _, said = outage_words(error)
        body = {"error": said, "problems": [{"field": "hook", "message": said}]}
        return _json(HTTPStatus.SERVICE_UNAVAILABLE, body)

    def _refuse_unchecked(
        self, wired: HookServices, refused: HookRefused | PayloadTooLarge
    ) -> Response[str]:
        """A delivery refused before it was known to be signed: what a flood of junk posted
        to the URL gets. Only now does the sender's bucket count (one taken before the
        signature was checked let such a flood turn away the hook's signed deliveries), and
        an address past its refusals is told to slow down."""
        source = self.app.current_event.request_context.identity.source_ip or "unknown"
        if wired.throttle is not None and not wired.throttle.allow(source):
            error = "too many refused deliveries from this address: try again in a second"
            return self._refuse(wired, HTTPStatus.TOO_MANY_REQUESTS, error, "hook")
        field = refused.field if isinstance(refused, HookRefused) else "body"
        return self._refuse(wired, refused.http_status, str(refused), field)

    @staticmethod
    def _refuse(wired: HookServices, status: int, error: str, field_name: str) -> Response[str]:
        if wired.logger is not None:
            # The status and the field only: a refusal's words are the sender's to read, and
            # nothing of what was sent (its signature, its body) is ever logged.
            wired.logger.info(
                "webhook delivery refused", extra={"status": int(status), "field": field_name}
            )
        body = {"error": error, "problems": [{"field": field_name, "message": error}]}
        answer = _json(status, body)
        if status == HTTPStatus.TOO_MANY_REQUESTS:
            answer.headers["Retry-After"] = "1"
        return answer


def _raw_body(body: str | None, is_base64: bool) -> bytes:
    """The exact bytes the sender signed: API Gateway (and `ratchet serve`) pass a JSON body
    as its text, anything else base64-encoded."""
    if not body:
        return b""
    if is_base64:
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise DeliveryInvalid("body: could not be read", field="body") from None
    return body.encode("utf-8", "surrogatepass")


def _json(status: int, body: dict[str, Any]) -> Response[str]:
    return Response(
        status_code=int(status),
        content_type="application/json",
        body=json.dumps(body, separators=(",", ":"), ensure_ascii=False),
    )

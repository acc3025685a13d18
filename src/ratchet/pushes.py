"""What a run pushes when its status changes: the change (`StatusChange`), the same for an
outbound webhook and an EventBridge event, and the webhooks' signature (the URLs they may go to
are `ratchet.webhook_urls`, a floor down, where an agent's are checked too).

A change is read from the records the store already keeps: each record whose status differs
from the record before it (the first record, `started`, changes nothing into `running`). A
run that parks, is approved and finishes makes four: running, waiting, running, done. Its id,
`<run_id>:<version>`, is the same however often it is sent: a consumer deduplicates on it.

A webhook's delivery is signed as Stripe's are: `Ratchet-Signature: t=<unix seconds>,v1=<hex
HMAC-SHA256 of "<t>.<body>" under the deployment's secret>`; `verify` is the receiver's check
(docs/following-runs.md has it as a snippet that needs no Ratchet).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from ratchet.feed import FeedEvent, FeedWait, feed_event
from ratchet.state import RunStatus, StoredCheckpoint

SIGNATURE_HEADER = "Ratchet-Signature"
DELIVERY_HEADER = "Ratchet-Delivery"
"""The delivery's id: the same on every attempt at it."""
SIGNATURE_TOLERANCE_SECONDS = 300
"""How old a signature `verify` takes: a delivery captured and replayed later is refused."""
DETAIL_TYPE = "Ratchet Run Status Change"
"""The EventBridge event's `detail-type`, and a webhook body's `type`."""
SOURCE = "ratchet"
"""The EventBridge event's `source`."""


class StatusChange(BaseModel):
    """A change of a run's status: a webhook's body, an EventBridge event's `detail`. It
    never carries a task token, a signed link or a secret: what a wait waits for is the
    feed's (`FeedWait`: the runs API's paths)."""

    model_config = ConfigDict(frozen=True)

    id: str
    """`<run_id>:<version>`: the same on every delivery of this change (deduplicate on it)."""
    type: str = DETAIL_TYPE
    run_id: str
    agent: str
    status: RunStatus
    previous: RunStatus | None
    """The status before (None for the run's start)."""
    version: int
    """The record's version: the feed's event id (resume the feed after it)."""
    step: int
    at: datetime
    event: str
    """The feed event that changed it (`started`, `waiting`, `decided`, `done`, ...)."""
    wait: FeedWait | None = None
    summary: str | None = None
    error: str | None = None

    @classmethod
    def of(cls, agent: str, previous: RunStatus | None, event: FeedEvent) -> StatusChange:
        return cls(
            id=f"{event.run_id}:{event.id}",
            run_id=event.run_id,
            agent=agent,
            status=event.status,
            previous=previous,
            version=event.id,
            step=event.step,
            at=event.at,
            event=event.type,
            wait=event.wait,
            summary=event.summary,
            error=event.error,
        )

    def body(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()


def status_changes(
    agent: str, previous: RunStatus | None, records: Iterable[StoredCheckpoint]
) -> list[StatusChange]:
    """The changes among `records` (in order, after one whose status was `previous`)."""
    changes = []
    for record in records:
        if record.status is not previous:
            changes.append(StatusChange.of(agent, previous, feed_event(record)))
        previous = record.status
    return changes


# --- signatures -----------------------------------------------------------------------------


def signature(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The `Ratchet-Signature` header of `body`, signed now (or at `timestamp`)."""
    at = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{at}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={at},v1={digest}"


def verify(
    secret: str,
    header: str,
    body: bytes,
    *,
    tolerance: int = SIGNATURE_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """Whether `header` signs `body` under `secret`, at most `tolerance` seconds ago."""
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        parts.setdefault(key, []).append(value)
    stamps = parts.get("t", [])
    if len(stamps) != 1 or not stamps[0].isdigit():
        return False
    at = int(stamps[0])
    if abs((time.time() if now is None else now) - at) > tolerance:
        return False
    expected = signature(secret, body, timestamp=at).partition("v1=")[2]
    return any(hmac.compare_digest(expected, given) for given in parts.get("v1", []))


# --- retries ----------------------------------------------------------------------------------

RETRY_SECONDS = 24 * 3600
"""How long a delivery is retried, from its change: then it is recorded as failed."""
MAX_BACKOFF_SECONDS = 300.0


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones: 1, 2, 4, ... 300."""
    return float(min(2 ** max(attempts - 1, 0), MAX_BACKOFF_SECONDS))

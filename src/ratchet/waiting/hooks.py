"""Signed webhooks: a URL per run and event name that GitHub, Stripe or a CI server posts to,
and the check of every delivery before it becomes an event (pure: no I/O but the `HookBook`).

    POST <public url>/hooks/<hook id>

The hook id is 128 bits of an HMAC of the run id and the event name under the deployment's
hook key, so it cannot be guessed, and the same run and name always give the same id: making
a hook twice finds the first, with no index from (run, name) to id. The id opens nothing by
itself: each delivery must be signed with the hook's secret, HMAC-SHA256(hook key, hook id),
derived whenever it is needed and never stored, so a leaked table leaks no secret and a
rotated key revokes every hook at once. The hook record (id -> run, name) is kept because an
HMAC cannot be inverted: it is how a delivery finds its run.

Two ways to sign, both HMAC-SHA256 keyed with the secret's text (as GitHub uses the secret it
is given), compared in constant time:

- GitHub's: `X-Hub-Signature-256: sha256=<hex HMAC of the raw body>`, the delivery id in
  `X-GitHub-Delivery`. GitHub signs no time: a delivery sent again is refused as a duplicate
  by its id, which the event keeps.
- Any other sender: `X-Signature-256: sha256=<hex HMAC of "<timestamp>.<raw body>">`, with
  `X-Signature-Timestamp` (unix seconds) and `X-Delivery-Id`. The timestamp must be within
  `REPLAY_WINDOW_SECONDS` of the server's clock, either way: a captured delivery cannot be
  replayed later.

The delivery id becomes the event id, so a sender's redelivery (GitHub's "Redeliver", a retry
after a timeout) is taken once: the event desk answers it as a duplicate, the same answer.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

from ratchet.approvals.links import LazyKey
from ratchet.errors import InvalidInput, JsonOverLimit, PayloadTooLarge, RunNotFound, WaitError
from ratchet.ports import HOOK_ID_PATTERN, Hook, HookBook
from ratchet.state import MAX_EVENT_BYTES, EventWait, RunStatus
from ratchet.untrusted import check_text
from ratchet.waiting.desk import EventDesk, Sent, check_event_id, check_event_name

REPLAY_WINDOW_SECONDS = 300
"""How far a signed timestamp may be from the server's clock, past or future."""
_ID_LABEL = b"ratchet-hook-id-v1"
_SECRET_LABEL = b"ratchet-hook-secret-v1"
_SIGNATURE = re.compile(r"sha256=([0-9a-f]{64})")
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_HOOK_ID = re.compile(HOOK_ID_PATTERN)

GITHUB_SIGNATURE = "X-Hub-Signature-256"
GITHUB_DELIVERY = "X-GitHub-Delivery"
GITHUB_EVENT = "X-GitHub-Event"
SIGNATURE = "X-Signature-256"
TIMESTAMP = "X-Signature-Timestamp"
DELIVERY = "X-Delivery-Id"


# --- refusals: each a 4xx naming the field, with nothing written -------------------------------


class HookRefused(WaitError):
    """A delivery the hook route refuses; `field` is what the sender got wrong."""

    field = "hook"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        if field is not None:
            self.field = field


class HookNotFound(HookRefused):
    """No such hook. The same words for an id never issued, a malformed one and a hook whose
    run is gone, so the answer tells a prober nothing."""

    http_status = 404
    field = "hook_id"

    def __init__(self) -> None:
        super().__init__("no such hook", field="hook_id")


class SignatureInvalid(HookRefused):
    """Missing, malformed or wrong signature, or a timestamp outside the replay window."""

    http_status = 401


class DeliveryInvalid(HookRefused):
    http_status = 400


class NotJson(HookRefused):
    http_status = 415
    field = "Content-Type"


class WebhooksNotTaken(HookRefused):
    """The run waits for this event, but its wait does not take it from a webhook
    (`wait_for_event(..., webhook=False)`)."""

    http_status = 403


# --- the hook key and what derives from it ---------------------------------------------------


class HookKeys:
    """Hook ids and secrets, derived from the deployment's hook key (locally a file beside the
    store, `<store>.hook-key`; on AWS a Secrets Manager secret)."""

    def __init__(self, key: bytes | Callable[[], bytes]) -> None:
        """`key`, or a function that gets it when an id or secret is first needed (so that a
        store nobody makes a hook for never needs, or makes, a key file)."""
        self._lazy_key = LazyKey(key, what="a hook key")

    @property
    def _key(self) -> bytes:
        return self._lazy_key()

    def hook_id(self, run_id: str, name: str) -> str:
        """The hook of `name` on `run_id`: the same each time, unguessable without the key."""
        # Length-prefixed: no two (run, name) pairs serialize to the same bytes. A label of its
        # own keeps an id from ever being some other derivation's output (a secret).
        return self._mac(_ID_LABEL, run_id, name)[:32]

    def secret(self, hook_id: str) -> str:
        """The hook's signing secret (64 hex characters): what the sender is configured with."""
        return self._mac(_SECRET_LABEL, hook_id)

    def _mac(self, label: bytes, *parts: str) -> str:
        message = label
        for part in parts:
            data = part.encode("utf-8", "surrogatepass")
            message += len(data).to_bytes(4, "big") + data
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


def open_hook(book: HookBook, keys: HookKeys, run_id: str, name: str, *, at: datetime) -> Hook:
    """The hook of `name` on `run_id`, made if it is new (`InvalidInput` for a bad name). It
    checks nothing about the run: the caller does (`ratchet.runtime.hooks.open_hook`)."""
    check_event_name(name)
    hook = Hook(hook_id=keys.hook_id(run_id, name), run_id=run_id, name=name, created_at=at)
    stored, _ = book.add(hook)
    return stored


def find_hook(book: HookBook, hook_id: str) -> Hook:
    """The hook a delivery's URL names; `HookNotFound` for a malformed id (the store is not
    asked) as for an unknown one."""
    if not _HOOK_ID.fullmatch(hook_id):
        raise HookNotFound()
    hook = book.get(hook_id)
    if hook is None:
        raise HookNotFound()
    return hook


def hook_url(public_url: str, hook_id: str) -> str:
    return f"{public_url.rstrip('/')}/hooks/{quote(hook_id)}"


# --- one delivery ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """A delivery whose signature, time and body were checked."""

    event_id: str
    payload: Any
    scheme: Literal["github", "generic"]
    ping: bool = False
    """GitHub's `ping` (sent when a hook is made, and by its "Test" button): answered, not
    kept, so it never settles the run's wait in place of the event it waits for."""


def check_length(headers: Mapping[str, str]) -> None:
    """`PayloadTooLarge` if the request says its body is over `MAX_EVENT_BYTES`: checked
    before the body is read."""
    declared = _header(headers, "Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > MAX_EVENT_BYTES:
        raise _too_large(int(declared))


def verify_delivery(
    headers: Mapping[str, str], body: bytes, secret: str, *, now: float
) -> Delivery:
    """The delivery in `body`, once its content type, size, signature (and, for the generic
    scheme, its timestamp), delivery id and JSON are checked, in that order; a `HookRefused`
    or `PayloadTooLarge` naming the field otherwise. `now` is unix seconds. The message of
    a refusal never holds the secret, the signature or the body."""
    media = (_header(headers, "Content-Type") or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        shown = f"{media!r}" if media else "none"
        raise NotJson(
            f"Content-Type: a hook takes application/json, not {shown[:80]} (on GitHub, "
            "set the webhook's Content type to application/json)"
        )
    if len(body) > MAX_EVENT_BYTES:
        raise _too_large(len(body))
    if _header(headers, GITHUB_SIGNATURE) is not None:
        _check_signature(headers, GITHUB_SIGNATURE, secret, body)
        scheme: Literal["github", "generic"] = "github"
        delivery_header = GITHUB_DELIVERY
    elif _header(headers, SIGNATURE) is not None:
        stamp = _header(headers, TIMESTAMP) or ""
        if not _TIMESTAMP.fullmatch(stamp):
            raise SignatureInvalid(
                f"{TIMESTAMP}: the unix time the delivery was signed at, in seconds, is "
                "missing or not a number",
                field=TIMESTAMP,
            )
        _check_signature(headers, SIGNATURE, secret, stamp.encode("ascii") + b"." + body)
        # After the signature: the time is known to be the sender's own.
        if abs(now - int(stamp)) > REPLAY_WINDOW_SECONDS:
            raise SignatureInvalid(
                f"{TIMESTAMP}: signed {abs(now - int(stamp)):.0f} s from the server's time, "
                f"more than the {REPLAY_WINDOW_SECONDS // 60} minutes a delivery may be",
                field=TIMESTAMP,
            )
        scheme = "generic"
        delivery_header = DELIVERY
    else:
        raise SignatureInvalid(
            f"{GITHUB_SIGNATURE}: a delivery must be signed ({GITHUB_SIGNATURE}, or "
            f"{SIGNATURE} with {TIMESTAMP}); see docs/webhooks.md",
            field=GITHUB_SIGNATURE,
        )
    delivery_id = _header(headers, delivery_header)
    if not delivery_id:
        raise DeliveryInvalid(
            f"{delivery_header}: the delivery id is missing (it is what makes a redelivery "
            "count once)",
            field=delivery_header,
        )
    try:
        event_id = check_event_id(delivery_id)
    except InvalidInput:
        raise DeliveryInvalid(
            f"{delivery_header}: a delivery id is 1-128 letters, digits and . _ : @ / + = - "
            "(starting with a letter or digit)",
            field=delivery_header,
        ) from None
    payload = _json(body)
    ping = scheme == "github" and _header(headers, GITHUB_EVENT) == "ping"
    return Delivery(event_id=event_id, payload=payload, scheme=scheme, ping=ping)


def deliver(desk: EventDesk, hook: Hook, delivery: Delivery) -> Sent:
    """Send the checked delivery to the hook's run through the event desk, as every sender
    does: kept once per delivery id, delivered if the run waits for it, queued if it does not
    wait yet (as any early event: the wait for its name takes it when it comes).

    `WebhooksNotTaken` if the run waits for this event now and its wait does not take
    webhooks; `HookNotFound` if the run is gone. A delivery the mailbox holds already is the
    sender's redelivery: it gets the desk's answer for a duplicate, whatever the run waits for
    now."""
    if desk.mailbox.get(hook.run_id, delivery.event_id) is None:
        run = desk.store.load_head(hook.run_id)
        if run is None:
            raise HookNotFound()
        request = run.waiting.request if run.waiting is not None else None
        if (
            run.status is RunStatus.WAITING
            and isinstance(request, EventWait)
            and request.name == hook.name
            and not request.webhook
        ):
            raise WebhooksNotTaken(
                f"run {hook.run_id!r} waits for {hook.name!r} from senders it trusts, not from "
                "a webhook (wait_for_event(..., webhook=True) takes one); nothing was kept"
            )
    try:
        return desk.send(
            hook.run_id,
            hook.name,
            delivery.payload,
            event_id=delivery.event_id,
            source="webhook",
        )
    except RunNotFound:
        raise HookNotFound() from None


def github_signature(secret: str, body: bytes) -> str:
    """`X-Hub-Signature-256` as GitHub computes it."""
    return "sha256=" + _hmac(secret, body)


def generic_signature(secret: str, timestamp: int, body: bytes) -> str:
    """`X-Signature-256` for a delivery signed at `timestamp` (unix seconds)."""
    return "sha256=" + _hmac(secret, str(timestamp).encode("ascii") + b"." + body)


def _hmac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def _check_signature(headers: Mapping[str, str], name: str, secret: str, signed: bytes) -> None:
    given = _SIGNATURE.fullmatch((_header(headers, name) or "").strip())
    if given is None:
        raise SignatureInvalid(
            f"{name}: expected sha256=<64 hex digits> (HMAC-SHA256 with the hook's secret)",
            field=name,
        )
    expected = _hmac(secret, signed)
    if not hmac.compare_digest(expected.encode("ascii"), given.group(1).encode("ascii")):
        raise SignatureInvalid(
            f"{name}: the signature does not match (another secret, or the body was changed "
            "on the way: sign the exact bytes sent)",
            field=name,
        )


def _json(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise DeliveryInvalid("body: the body is not UTF-8 text", field="body") from None
    try:
        check_text(text, field="body", max_chars=MAX_EVENT_BYTES)
    except JsonOverLimit as over:
        raise DeliveryInvalid(f"body: {over.reason}", field="body") from None
    try:
        return json.loads(text, parse_constant=_not_a_number)
    except ValueError as error:
        # The decoder's words say where, never what: they quote nothing of the body.
        raise DeliveryInvalid(f"body: not JSON ({error})"[:300], field="body") from None


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _too_large(size: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"body: {size:,} bytes, over the {MAX_EVENT_BYTES:,}-byte limit")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """A header whatever its case (API Gateway passes them as the sender wrote them)."""
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None

"""The webhook sender: each change of a run's status (`ratchet.pushes`), POSTed signed to
every URL of `RATCHET_WEBHOOKS` and of the run's agent (`Agent.webhooks`), retried with backoff
for `RETRY_SECONDS`, each delivery and its outcome kept in the store
(`ratchet.adapters.sqlite.deliveries`, `ratchet.adapters.postgres.deliveries`, read by `ratchet
deliveries` and the dashboard).

It runs on a thread of its own with a store connection of its own, in each process that works or
serves runs with `RATCHET_WEBHOOKS` set (`ratchet serve`, `ratchet worker`, `ratchet run`, which
also starts one for an agent that declares webhooks), and keeps nothing in memory that the store
does not: a sender killed at any point owes on its next start what it owed, and sends again what
it was sending (with the same delivery id: a receiver deduplicates on it). Several senders on one
store (two workers, a worker and `ratchet serve`, or on Postgres workers on many hosts) share
the work through the store: a change is owed once (`DeliveryBook.enqueue`), and a delivery is
sent by one sender at a time (`DeliveryBook.claim`); only a sender that dies mid-send, or
outlives its claim, leaves it to be sent again.

A delivery is sent once its URL's host resolves to no link-local address (a name may resolve
to one though its URL did not say so); a redirect is not followed (it is an answer that is not
2xx, and so retried). The body is JSON, a `StatusChange`; the headers `Ratchet-Delivery` (its
id) and `Ratchet-Signature`.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from ratchet.adapters.sqlite.deliveries import Delivery, Moved, Owed
from ratchet.agents import load_agent
from ratchet.approvals.links import token_file
from ratchet.errors import InvalidInput, RatchetError, StoreBusy
from ratchet.pushes import (
    DELIVERY_HEADER,
    RETRY_SECONDS,
    SIGNATURE_HEADER,
    backoff,
    signature,
    status_changes,
)
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus
from ratchet.webhook_urls import any_link_local

SEND_TIMEOUT_SECONDS = 10.0
"""How long a receiver has to answer; slower is a failed attempt, tried again."""
POLL_SECONDS = 0.2
"""How often the sender reads the store for runs that moved: a commit is sent within this."""
STOP_SECONDS = 15.0
DRAIN_SECONDS = 10.0
"""How long a process that works runs and exits (`ratchet run`, `ratchet worker --until-idle`)
waits for what it owes to be sent: the first attempts and a few retries."""

_log = logging.getLogger("ratchet.webhooks")


class DeliveryBook(Protocol):
    """The store's book of deliveries the sender works through: SQLite's
    (`ratchet.adapters.sqlite.deliveries`, whose docstring is the contract) or Postgres's;
    tests/conformance/test_deliveries_contract.py holds both to it."""

    def prepare(self) -> None: ...

    def moved(self) -> list[Moved]: ...

    def enqueue(
        self, moved: Moved, *, version: int, status: RunStatus, owed: Sequence[Owed]
    ) -> bool: ...

    def due(self, *, limit: int = 20) -> list[Delivery]: ...

    def owing(self, run_id: str | None = None, *, due_by: float | None = None) -> int: ...

    def claim(self, delivery: Delivery) -> bool: ...

    def record(
        self, delivery: Delivery, *, delivered: bool, error: str | None, retry_at: float | None
    ) -> None: ...


def webhook_secret_file(runtime: LocalRuntime) -> Path:
    """`<store>.webhook-secret`, beside the store's keys, owner-only."""
    return Path(f"{runtime.root}.webhook-secret")


def webhook_secret(runtime: LocalRuntime) -> str:
    """`RATCHET_WEBHOOK_SECRET`, or the secret in `webhook_secret_file` (made on first use);
    `InvalidInput` on a store that workers on many hosts share (`runtime.one_host`), where a
    secret made here would sign this host's deliveries only."""
    given = runtime.settings.webhook_secret
    if given:
        return given.get_secret_value()
    if not runtime.one_host:
        raise InvalidInput(
            "webhooks on a postgresql:// store need RATCHET_WEBHOOK_SECRET, the same on every "
            "host that sends: a secret made here would sign this host's deliveries only"
        )
    return token_file(webhook_secret_file(runtime))


def delivery_id(change_id: str, url: str) -> str:
    """A delivery's id: its change's, and which URL (the same on every attempt)."""
    return f"{change_id}@{hashlib.sha256(url.encode()).hexdigest()[:8]}"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx is the answer: a delivery is not sent on elsewhere


_OPENER = urllib.request.build_opener(_NoRedirects)


class WebhookSender:
    """Sends the store's status changes to `urls` on a thread of its own (`start`, `stop`)."""

    def __init__(
        self,
        settings: LocalSettings,
        *,
        secret: str,
        poll_seconds: float = POLL_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
        runtime: type[LocalRuntime] = LocalRuntime,
    ) -> None:
        self._settings = settings
        # The kind of runtime the sender's own connections open: a sqlite:// store's, or a
        # postgresql:// one's (`ratchet.runtime.postgres.PostgresRuntime`).
        self._runtime = runtime
        self._urls = settings.webhooks
        self._agent_urls: dict[str, tuple[str, ...]] = {}
        self._secret = secret
        self._poll = poll_seconds
        self._retry_seconds = retry_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ratchet webhooks", daemon=True)

    def start(self) -> None:
        """Start sending. The store's delivery tables are made first, here, so that a run
        created once this returns is owed from its start even on a store's first sender."""
        runtime = self._runtime.open(self._settings, create=False)
        try:
            runtime.deliveries.prepare()
        finally:
            runtime.close()
        self._thread.start()

    def drain(self, run_id: str | None = None, timeout: float = DRAIN_SECONDS) -> int | None:
        """Wait (at most `timeout` seconds) until nothing (of `run_id`) that can be sent within
        them is owed: what a process that works runs and then exits does, so that what it
        committed is sent before it goes. Returns what is still owed then (None if the store
        was too busy to say): a delivery retried later than the bound stays in the store, for
        the next sender, and is not waited for."""
        deadline = time.time() + timeout
        owed: int | None = None
        runtime = self._runtime.open(self._settings, create=False)
        try:
            while self._thread.is_alive():
                with suppress(StoreBusy):
                    if runtime.deliveries.owing(run_id, due_by=deadline) == 0:
                        break
                if time.time() >= deadline:
                    break
                time.sleep(self._poll)
            with suppress(StoreBusy):
                owed = runtime.deliveries.owing(run_id)
            return owed
        finally:
            runtime.close()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        runtime = self._runtime.open(self._settings, create=False)
        try:
            book = runtime.deliveries
            while not self._stop.is_set():
                try:
                    self.pass_once(runtime, book)
                except StoreBusy:
                    pass  # the store is busy for now: the next pass reads it again
                except RatchetError as error:
                    _log.warning("webhooks: a pass failed", extra={"error": str(error)})
                self._stop.wait(self._poll)
        finally:
            runtime.close()

    def pass_once(self, runtime: LocalRuntime, book: DeliveryBook) -> None:
        """Owe the changes of the runs that moved, then send what is due."""
        for moved in book.moved():
            self._owe(runtime, book, moved)
        for delivery in book.due():
            if self._stop.is_set():
                return
            if book.claim(delivery):
                self._send(book, delivery)

    def _owe(self, runtime: LocalRuntime, book: DeliveryBook, moved: Moved) -> None:
        # Read after `moved`: every record up to its version is here, and perhaps later ones
        # (the cursor then moves past them, with their changes owed).
        records = runtime.store.list_checkpoints(moved.run_id, after=moved.cursor or 0)
        head = runtime.store.load_head(moved.run_id)
        if head is None:
            return
        changes = status_changes(head.agent, moved.status, records)
        last = records[-1] if records else None
        book.enqueue(
            moved,
            version=max(moved.version, last.version if last else 0),
            status=last.status if last else (moved.status or head.status),
            owed=[
                Owed(delivery_id(c.id, url), c.id, c.run_id, url, c.body().decode())
                for c in changes
                for url in self.urls_of(head.agent)
            ],
        )

    def urls_of(self, agent: str) -> tuple[str, ...]:
        """Where a change of a run of `agent` (its stored reference) goes: the deployment's
        URLs, then the agent's own (`Agent.webhooks`). An agent this process cannot load (its
        code is not here) is sent the deployment's only, and the log says so, once."""
        if agent not in self._agent_urls:
            try:
                declared = tuple(load_agent(agent).webhooks)
            except RatchetError as error:
                _log.warning(
                    "webhooks: the agent's own URLs are unknown here (it does not load)",
                    extra={"agent": agent, "error": str(error)},
                )
                declared = ()
            self._agent_urls[agent] = declared
        return tuple(dict.fromkeys([*self._urls, *self._agent_urls[agent]]))

    def _send(self, book: DeliveryBook, delivery: Delivery) -> None:
        error = refusal(delivery.url)
        if error is not None:
            book.record(delivery, delivered=False, error=error, retry_at=None)
            return
        body = delivery.body.encode()
        request = urllib.request.Request(
            delivery.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "ratchet-webhooks",
                DELIVERY_HEADER: delivery.delivery_id,
                SIGNATURE_HEADER: signature(self._secret, body),
            },
        )
        try:
            with _OPENER.open(request, timeout=SEND_TIMEOUT_SECONDS) as answer:
                status = int(answer.status)
        except urllib.error.HTTPError as refused:
            status = refused.code
        except (OSError, ValueError) as failed:  # refused, reset, timed out, no such host
            status, error = 0, f"not sent: {failed}"[:300]
        if 200 <= status < 300:
            book.record(delivery, delivered=True, error=None, retry_at=None)
            return
        error = error or f"answered HTTP {status}"
        retry_at = time.time() + backoff(delivery.attempts + 1)
        if retry_at - delivery.created_at > self._retry_seconds:
            book.record(delivery, delivered=False, error=error, retry_at=None)
        else:
            book.record(delivery, delivered=False, error=error, retry_at=retry_at)


def refusal(url: str) -> str | None:
    """Why a delivery is not sent to `url` (its host resolves to a link-local address), or
    None. A host that does not resolve now is left to the send, which fails and is retried."""
    parts = urlsplit(url)
    try:
        addresses = socket.getaddrinfo(parts.hostname or "", parts.port or 0)
    except OSError:
        return None
    if any_link_local(addresses):
        return "refused: the host resolves to a link-local address"
    return None


def open_sender(runtime: LocalRuntime, urls: Sequence[str] | None = None) -> WebhookSender:
    """The sender of `runtime`'s store and settings (its secret made if need be)."""
    settings = runtime.settings
    if urls is not None:
        settings = settings.model_copy(update={"webhooks": tuple(urls)})
    return WebhookSender(settings, secret=webhook_secret(runtime), runtime=type(runtime))

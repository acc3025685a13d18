"""`ratchet serve`'s routes that hold a connection open: a run's feed as Server-Sent Events
(`GET /runs/{run_id}/feed`), and the runs API's long poll (`GET /runs/{run_id}/history?wait=`).

Both are served on the connection's own thread with a store connection of their own, beside
the app's one thread (`ratchet.web.serve`): a browser holding a feed open for an hour, or a
program waiting twenty seconds for a change, holds up no other request.

The feed (`FeedStreams`), as the EventSource API expects it:

    retry: 1000                      reconnect a second after a dropped connection
    id: 7                            each event: its id (the checkpoint's version) and its
    data: {"id": 7, "type": ...}     JSON (`ratchet.feed.FeedEvent`), on one line
    : keep-alive                     a comment every `HEARTBEAT_SECONDS` while nothing happens
    event: end                       once the run has ended (done, failed, stopped or
    data: {"status": "done"}         cancelled); then the server closes the stream

A browser reconnects by itself after a dropped connection (a restart of `ratchet serve`, a
proxy's timeout), sending the last id it read as `Last-Event-ID`: the feed resumes after it,
with no event missed or repeated. The first request may say where to start with `?after=<id>`
(the header wins). Once the run has ended and nothing is left after the id given, the answer
is 204, which tells a browser to stop reconnecting. Refusals are the runs API's JSON: 400 for
an id that is not one, 404 for no such run, 503 when `MAX_FEEDS` feeds are open already.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from werkzeug.wrappers import Request, Response

from ratchet.errors import RatchetError, RunNotFound, StoreBusy
from ratchet.feed import FeedCursor, FeedStore, hold_until_written
from ratchet.state import FINISHED, RUN_ID_PATTERN
from ratchet.web.runs import HISTORY_POLL_SECONDS, MAX_HISTORY_WAIT_SECONDS

HEARTBEAT_SECONDS = 15.0
"""A comment line this often while nothing happens: proxies and load balancers that close a
connection idle for 30-60 s keep it, and a reader that went away is noticed (the write fails)."""
POLL_SECONDS = 0.1
"""How often an open feed reads the run's records while nothing is new: one range read of a
local store (microseconds), so a commit reaches the browser within about this long."""
RETRY_MILLISECONDS = 1000
MAX_FEEDS = 16
"""Feeds open at once (each holds a thread of the server while it is open); one more is
refused with 503 until another closes."""
LAST_VERSION = 10**12 - 1
"""The highest id an event can have (the stores' versions have 12 digits)."""

FEED_PATH = re.compile(r"^/runs/(?P<run_id>[^/]+)/feed$")
HISTORY_PATH = re.compile(r"^/runs/(?P<run_id>[^/]+)/history$")

_log = logging.getLogger("ratchet.serve")


def _refusal(status: int, error: str, field: str, message: str, **headers: str) -> Response:
    body = json.dumps({"error": error, "problems": [{"field": field, "message": message}]})
    return Response(body, status=status, content_type="application/json", headers=headers)


def parse_event_id(text: str) -> int | None:
    """An event id as a request gives it (`Last-Event-ID`, `after`), or None if it is none."""
    text = text.strip()
    if not re.fullmatch(r"[0-9]{1,12}", text):
        return None
    return int(text)


class FeedStreams:
    """`GET /runs/{run_id}/feed`: the run's feed as Server-Sent Events (see the module)."""

    def __init__(
        self,
        store: FeedStore,
        *,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        limit: int = MAX_FEEDS,
    ) -> None:
        self._store = store
        self._heartbeat = heartbeat_seconds
        self._poll = poll_seconds
        self._slots = threading.BoundedSemaphore(limit)
        self._stopping = threading.Event()

    def claims(self, request: Request) -> bool:
        return FEED_PATH.fullmatch(request.path) is not None

    def stop(self) -> None:
        """End every open feed at its next read (the server is stopping)."""
        self._stopping.set()

    def __call__(self, request: Request, environ: dict[str, Any], start_response: Any) -> Any:
        matched = FEED_PATH.fullmatch(request.path)
        assert matched is not None, "claims() said it is a feed"
        refused = self._refused(request, matched["run_id"])
        if isinstance(refused, Response):
            return refused(environ, start_response)
        run_id, after = refused
        if not self._slots.acquire(blocking=False):
            return _refusal(
                503,
                "too many feeds are open; try again",
                "(path)",
                f"at most {MAX_FEEDS} at once",
                **{"Retry-After": "5"},
            )(environ, start_response)
        try:
            cursor = FeedCursor(self._store, run_id, after=after, until=FINISHED)
            if cursor.has_ended():
                self._slots.release()
                # No event is left and none will come: 204 tells a browser's EventSource to
                # stop reconnecting.
                return Response(status=204)(environ, start_response)
        except RunNotFound:
            self._slots.release()
            return _refusal(404, "no such run", "run_id", "no run has this id")(
                environ, start_response
            )
        except BaseException:
            self._slots.release()
            raise
        start_response(
            "200 OK",
            [
                ("Content-Type", "text/event-stream; charset=utf-8"),
                ("Cache-Control", "no-store"),
                # Proxies that buffer answers (nginx) pass this one on as it comes.
                ("X-Accel-Buffering", "no"),
            ],
        )
        return _Stream(self._events(cursor), self._slots.release)

    def _refused(self, request: Request, run_id: str) -> Response | tuple[str, int]:
        if request.method not in ("GET", "HEAD"):
            return _refusal(405, "use GET", "(method)", "a feed is read with GET")
        if not RUN_ID_PATTERN.fullmatch(run_id):
            return _refusal(
                400, "invalid request", "run_id", "1-128 letters, digits, '.', '_', ':' or '-'"
            )
        given = request.headers.get("Last-Event-ID")
        field = "Last-Event-ID"
        if given is None:
            given, field = request.args.get("after"), "after"
        if given is None:
            return run_id, 0
        after = parse_event_id(given)
        if after is None:
            return _refusal(
                400,
                "invalid request",
                field,
                "must be an event id: a whole number, the id of the last event read",
            )
        return run_id, after

    def _events(self, cursor: FeedCursor) -> Iterator[bytes]:
        yield f"retry: {RETRY_MILLISECONDS}\n\n".encode()
        quiet_since = time.monotonic()
        while not self._stopping.is_set():
            try:
                batch = cursor.read()
            except StoreBusy:
                batch = None  # the store is busy for now: read again at the next poll
            except RatchetError as error:
                _log.warning("a run's feed stopped", extra={"error": str(error)})
                return
            if batch is not None and batch.events:
                yield b"".join(_event_lines(e.id, e.data()) for e in batch.events)
                quiet_since = time.monotonic()
            if batch is not None and batch.ended:
                last = batch.events[-1].status.value if batch.events else "ended"
                yield b"event: end\ndata: " + json.dumps({"status": last}).encode() + b"\n\n"
                return
            if time.monotonic() - quiet_since >= self._heartbeat:
                yield b": keep-alive\n\n"
                quiet_since = time.monotonic()
            self._stopping.wait(self._poll)


def _event_lines(event_id: int, data: dict[str, Any]) -> bytes:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"id: {event_id}\ndata: {text}\n\n".encode()


class _Stream:
    """An open feed's body: its chunks, and its slot given back once, however it ends (the
    server closes the body when it is done with it, even before its first chunk)."""

    def __init__(self, chunks: Iterator[bytes], release: Callable[[], None]) -> None:
        self._chunks = chunks
        self._release: Callable[[], None] | None = release

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        release, self._release = self._release, None
        if release is not None:
            release()


class HistoryWaits:
    """The runs API's long poll, served by `ratchet serve`: `GET /runs/{run_id}/history
    ?after=<version>&wait=<seconds>` is held on its connection's thread until the run has a
    record after `after`, has ended, or `wait` seconds have passed; then the app answers it
    as it would answer at once. A request the app would refuse (a bad `wait`, no such run) is
    handed on at once, for the app to refuse."""

    def __init__(self, store: FeedStore, *, poll_seconds: float = POLL_SECONDS) -> None:
        self._store = store
        self._poll = poll_seconds
        self._stopping = threading.Event()

    def claims(self, request: Request) -> bool:
        return (
            request.method == "GET"
            and "wait" in request.args
            and HISTORY_PATH.fullmatch(request.path) is not None
        )

    def stop(self) -> None:
        self._stopping.set()

    def __call__(self, request: Request, environ: dict[str, Any], start_response: Any) -> None:
        matched = HISTORY_PATH.fullmatch(request.path)
        assert matched is not None, "claims() said it is a history"
        run_id = matched["run_id"]
        after = parse_event_id(request.args.get("after", "0"))
        wait = parse_event_id(request.args.get("wait", ""))
        if (
            after is None
            or wait is None
            or wait > MAX_HISTORY_WAIT_SECONDS
            or not RUN_ID_PATTERN.fullmatch(run_id)
        ):
            return
        hold_until_written(
            self._store,
            run_id,
            after=after,
            seconds=wait,
            poll=min(self._poll, HISTORY_POLL_SECONDS),
            stopping=self._stopping,
        )

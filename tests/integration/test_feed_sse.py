"""The feed as Server-Sent Events (`ratchet.web.feed.FeedStreams`), driven as a WSGI app on a
real SQLite store (issue 35): the stream says how soon to reconnect, sends each event with its
id, a keep-alive comment while nothing happens, and an `end` event once the run has ended, then
closes; a reconnection after the last id finds nothing and is told to stop (204); a feed more
than the server holds is refused with 503 until one closes."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client as WsgiClient
from werkzeug.wrappers import Request

import ratchet
from ratchet.web.feed import FeedStreams

PATIENCE = 30.0


@pytest.fixture
def client(tmp_path: Path) -> Iterator[ratchet.Client]:
    with ratchet.connect(f"sqlite:///{tmp_path}/runs.db", environ={}) as connected:
        yield connected


def _app(streams: FeedStreams) -> Any:
    def application(environ: dict[str, Any], start_response: Any) -> Any:
        return streams(Request(environ), environ, start_response)

    return application


def _lines(chunks: Iterable[bytes] | Iterable[str]) -> Iterator[str]:
    for chunk in chunks:
        yield from (chunk.decode() if isinstance(chunk, bytes) else chunk).split("\n")


def test_the_stream_sends_events_keep_alives_and_its_end(client, tmp_path):
    client.run(run_id="s1", scenario="migration", input={"batches": 1})
    reader = ratchet.connect(f"sqlite:///{tmp_path}/runs.db", environ={})
    streams = FeedStreams(reader.runtime.store, heartbeat_seconds=0.05, poll_seconds=0.01)
    answer = WsgiClient(_app(streams)).get("/runs/s1/feed", buffered=False)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/event-stream")

    lines = _lines(answer.response)
    seen: list[str] = []
    answered = threading.Event()
    for line in lines:
        seen.append(line)
        if line == ": keep-alive" and not answered.is_set():
            answered.set()  # the run is parked and the feed idle: answer it now
            threading.Thread(target=_approve_and_work, args=(tmp_path,)).start()
        if line == "event: end":
            seen.append(next(lines))
            break
    answer.close()
    reader.close()

    assert seen[0] == "retry: 1000"
    ids = [int(line.removeprefix("id: ")) for line in seen if line.startswith("id: ")]
    assert ids == [c.version for c in client.history("s1")]
    assert seen[-2:] == ["event: end", 'data: {"status": "done"}']
    assert ": keep-alive" in seen


def _approve_and_work(tmp_path: Path) -> None:
    with ratchet.connect(f"sqlite:///{tmp_path}/runs.db", environ={}) as other:
        other.approve("s1", by="dana")
        other.work("s1")


def test_a_reconnection_after_the_end_is_told_to_stop_and_a_feed_too_many_is_refused(
    client, tmp_path
):
    client.run(run_id="s2", scenario="migration", input={"batches": 1})
    last = client.head("s2").version
    streams = FeedStreams(client.runtime.store, limit=1)
    wsgi = WsgiClient(_app(streams))

    held = wsgi.get("/runs/s2/feed", buffered=False)
    refused = wsgi.get("/runs/s2/feed")
    held.close()
    again = wsgi.get("/runs/s2/feed", headers={"Last-Event-ID": str(last)}, buffered=False)
    again.close()
    client.approve("s2", by="dana")
    client.work("s2")
    ended = wsgi.get("/runs/s2/feed", headers={"Last-Event-ID": str(client.head("s2").version)})

    assert held.status_code == 200
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "5"
    assert again.status_code == 200  # the slot came back when the first feed closed
    assert ended.status_code == 204

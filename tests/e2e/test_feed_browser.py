"""A run's feed in a real browser (issue 35): Debian's Chromium, driven by Playwright, holds an
`EventSource` on `ratchet serve`'s `GET /runs/{id}/feed` while the run parks; `ratchet serve` is
SIGKILLed, the run is answered and worked to its end while nothing serves, and a new `ratchet
serve` on the same port takes the browser's reconnection (its `Last-Event-ID`). The page sees
every event of the run exactly once, in order, then the end, and stops reconnecting. The feed's
refusals (no such run, an id that is not one, a long poll beyond its bound) are one 4xx each,
with nothing written."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext

from tests.e2e.test_approval_browser import (
    OPERATOR,
    RATCHET,
    SCRUBBED,
    SERVER_START_SECONDS,
    _accepts_connections,
    _free_port,
    chromium,
)

pytestmark = pytest.mark.slow

PATIENCE = 30.0
FOLLOWER = """
window.feed = {events: [], opened: 0, errors: 0, ended: null};
const source = new EventSource(%s);
source.onopen = () => { window.feed.opened += 1; };
source.onerror = () => { window.feed.errors += 1; };
source.onmessage = (m) => {
  window.feed.events.push({lastEventId: m.lastEventId, data: JSON.parse(m.data)});
};
source.addEventListener("end", (m) => { window.feed.ended = JSON.parse(m.data); source.close(); });
"""


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = root / "ratchet.db"
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        self.env = env | {
            "RATCHET_STORE": f"sqlite:///{self.db}",
            "LOGNAME": OPERATOR,
            "USER": OPERATOR,
            "PYTHONUNBUFFERED": "1",
        }

    def ok(self, *args: str) -> str:
        done = subprocess.run(
            [str(RATCHET), *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=PATIENCE * 2,
            check=False,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def serve(self, port: int, log: str, host: str = "127.0.0.1") -> subprocess.Popen[str]:
        """`ratchet serve --no-worker` on `host:port`, once it listens."""
        out = self.root / log
        with out.open("w") as output:
            process = subprocess.Popen(
                [str(RATCHET), "serve", "--no-worker", "--host", host, "--port", str(port)],
                env=self.env | {"RATCHET_PUBLIC_URL": f"http://{host}:{port}"},
                cwd=self.root,
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
            )
        deadline = time.monotonic() + SERVER_START_SECONDS
        while not ("Serving approvals on" in out.read_text() and _listens(host, port)):
            assert process.poll() is None, out.read_text()
            assert time.monotonic() < deadline, f"ratchet serve did not listen: {out.read_text()}"
            time.sleep(0.05)
        return process

    def feed_ids(self, run_id: str) -> list[int]:
        rows = json.loads(self.ok("history", run_id, "--json"))["checkpoints"]
        return [int(row["version"]) for row in rows]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[BrowserContext]:
    with chromium(tmp_path / "chromium-profile", width=800, height=600) as context:
        yield context


def _until(what: str, check: Any) -> Any:
    deadline = time.monotonic() + PATIENCE
    while not (value := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)
    return value


def test_a_browser_follows_a_run_to_its_end_through_a_restart_of_serve(store, browser):
    store.ok("run", "--scenario", "migration", "--batches", "2", "--run-id", "m1")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    first = store.serve(port, "serve-1.log")
    page = browser.new_page()
    page.goto(f"{base}/runs/m1")  # a page of the origin the feed is on
    page.evaluate(FOLLOWER % json.dumps("/runs/m1/feed"))
    parked = _until(
        "the browser reads up to the wait",
        lambda: page.evaluate("window.feed.events.map(e => e.data.type)").count("waiting"),
    )
    assert parked == 1

    # The server dies with the feed open; the run goes on while nothing serves.
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=PATIENCE)
    _until("the browser notices", lambda: page.evaluate("window.feed.errors") >= 1)
    store.ok("approve", "m1", "--comment", "ok")
    store.ok("worker", "--until-idle")
    second = store.serve(port, "serve-2.log")
    try:
        ended = _until("the feed ends", lambda: page.evaluate("window.feed.ended"))
        feed = page.evaluate("window.feed")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=PATIENCE)

    assert ended == {"status": "done"}
    assert feed["opened"] == 2  # the first connection, and the one that resumed
    events = [e["data"] for e in feed["events"]]
    ids = [e["id"] for e in events]
    assert ids == store.feed_ids("m1")  # every record, once each, in order
    assert [int(e["lastEventId"]) for e in feed["events"]] == ids
    assert [e["type"] for e in events] == [
        "started",
        "step",
        "step",
        "step",
        "waiting",
        "decided",
        "step",
        "step",
        "done",
    ]


def _listens(host: str, port: int) -> bool:
    if host == "127.0.0.1":
        return _accepts_connections(port)
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def test_off_loopback_the_feed_and_the_long_poll_take_the_runs_apis_token(store):
    if not _can_bind("127.0.0.2"):
        pytest.skip("127.0.0.2 cannot be bound here")
    store.ok("run", "--scenario", "migration", "--batches", "1", "--run-id", "m4")
    store.ok("approve", "m4")
    store.ok("worker", "--until-idle")
    port = _free_port()
    base = f"http://127.0.0.2:{port}"
    server = store.serve(port, "serve.log", host="127.0.0.2")
    try:
        token = (store.root / "ratchet.serve-token").read_text().strip()
        refused = [_get(f"{base}{path}") for path in ("/runs/m4/feed", "/runs/m4/history?wait=1")]
        wrong = _get(f"{base}/runs/m4/feed", Authorization="Bearer not-the-token")
        held = _get(f"{base}/runs/m4/history?after=0&wait=1", Authorization=f"Bearer {token}")
        fed = _get(f"{base}/runs/m4/feed", Authorization=f"Bearer {token}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=PATIENCE)

    assert [status for status, _ in refused] == [401, 401]
    assert wrong[0] == 401
    assert held[0] == 200
    assert json.loads(held[1])["checkpoints"]
    assert fed[0] == 200
    assert fed[1].endswith('event: end\ndata: {"status": "done"}\n\n')


def _can_bind(host: str) -> bool:
    try:
        with socket.socket() as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True


def _get(url: str, **headers: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=PATIENCE
        ) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_the_feed_refuses_what_it_cannot_follow_and_writes_nothing(store):
    store.ok("run", "--scenario", "migration", "--batches", "1", "--run-id", "m2")
    before = store.ok("history", "m2", "--json"), store.ok("list", "--json")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = store.serve(port, "serve.log")
    try:
        unknown = _get(f"{base}/runs/nope/feed")
        not_an_id = _get(f"{base}/runs/m2/feed", **{"Last-Event-ID": "seven"})
        after_not_an_id = _get(f"{base}/runs/m2/feed?after=-1")
        too_long = _get(f"{base}/runs/m2/history?after=0&wait=21")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=PATIENCE)

    assert unknown[0] == 404
    assert json.loads(unknown[1])["error"] == "no such run"
    assert not_an_id[0] == 400
    assert [p["field"] for p in json.loads(not_an_id[1])["problems"]] == ["Last-Event-ID"]
    assert after_not_an_id[0] == 400
    assert [p["field"] for p in json.loads(after_not_an_id[1])["problems"]] == ["after"]
    assert too_long[0] == 400
    assert [p["field"] for p in json.loads(too_long[1])["problems"]] == ["wait"]
    assert (store.ok("history", "m2", "--json"), store.ok("list", "--json")) == before


def test_the_feed_carries_each_commit_within_its_poll(store):
    store.ok("run", "--scenario", "migration", "--batches", "1", "--run-id", "m3")
    port = _free_port()
    server = store.serve(port, "serve.log")
    received: list[tuple[float, dict[str, Any]]] = []
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/runs/m3/feed", headers={"Last-Event-ID": "0"}
        )
        with urllib.request.urlopen(request, timeout=PATIENCE) as stream:
            reader = threading.Thread(target=_read_events, args=(stream, received))
            reader.start()
            _until("the wait is read", lambda: any(e["type"] == "waiting" for _, e in received))
            store.ok("approve", "m3", "--comment", "ok")
            store.ok("worker", "--until-idle")
            reader.join(PATIENCE)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=PATIENCE)

    assert received[-1][1]["type"] == "done"
    # The events written while the feed was open: those after the wait it found first.
    parked = next(i for i, (_, e) in enumerate(received) if e["type"] == "waiting")
    after_wait = received[parked + 1 :]
    latencies = [at - datetime.fromisoformat(e["at"]).timestamp() for at, e in after_wait]
    assert max(latencies) < 2.0
    print(
        f"commit to feed event: max {max(latencies) * 1000:.0f} ms, "
        f"median {sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms over {len(latencies)}"
    )


def _read_events(stream: Any, received: list[tuple[float, dict[str, Any]]]) -> None:
    for raw in stream:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: ") and '"run_id"' in line:
            received.append((time.time(), json.loads(line[len("data: ") :])))
        if line.startswith("event: end"):
            return

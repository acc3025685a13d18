"""Idle workers on a Postgres store wait for word of new work (LISTEN/NOTIFY) instead of
asking for it every tenth of a second, and one that missed the word finds the work by its
fallback poll, within that poll's bound."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ratchet.runtime.local import LocalSettings
from ratchet.runtime.postgres import PostgresRuntime
from ratchet.state import RunStatus
from ratchet.worker import WakeUps, Worker
from tests.keyed_effects_agent import AGENT
from tests.postgres_support import Cluster

DEADLINE_SECONDS = 30.0


@pytest.fixture
def runtime(
    postgres: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PostgresRuntime]:
    monkeypatch.chdir(tmp_path)  # the agent's world (world.db) and the store's host files
    name = postgres.fresh_database(store=True)
    opened = PostgresRuntime.open(LocalSettings(store=postgres.url(name)))
    yield opened
    opened.close()
    postgres.drop_database(name)


@dataclass
class CountedClaims:
    """The worker's leases, counting its claims: each is a query of the runs table."""

    leases: Any
    claims: int = 0

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return self.leases.claim(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.leases, name)


@dataclass
class MissesOne:
    """The worker's wake-ups, deaf to the first notification after it listens (as a worker
    whose connection was busy, or cut, when it came): it waits on as if none had come."""

    heard: WakeUps
    calls: int = 0
    missed: int = 0

    def wait(self, seconds: float) -> bool:
        self.calls += 1
        started = time.monotonic()
        told = self.heard.wait(seconds)
        if told and self.calls > 1 and not self.missed:
            self.missed += 1
            self.heard.wait(max(0.0, seconds - (time.monotonic() - started)))
            return False
        return told

    def close(self) -> None:
        self.heard.close()


def _working(runtime: PostgresRuntime, fallback: float) -> tuple[Worker, CountedClaims]:
    worker = runtime.worker(worker_id="listener", logger=logging.getLogger("listener"))
    counted = CountedClaims(worker.leases)
    worker.leases = counted
    worker.fallback_poll_seconds = fallback
    return worker, counted


def _wait_until(condition: Any, failure: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < DEADLINE_SECONDS, failure
        time.sleep(0.02)
    return time.monotonic() - started


def _listening(runtime: PostgresRuntime) -> bool:
    with psycopg.connect(runtime.pg.url.conninfo, autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN %%' AND state = 'idle'"
        ).fetchone()
    return bool(row and row[0])


def _done(runtime: PostgresRuntime, run_id: str) -> bool:
    head = runtime.store.load_head(run_id)
    return head is not None and head.status is RunStatus.DONE


def _client(runtime: PostgresRuntime) -> Any:
    from ratchet.client import Client

    return Client(runtime, worker_id="starter")


def test_an_idle_worker_waits_for_word_and_a_new_run_wakes_it(runtime: PostgresRuntime) -> None:
    # Given an idle worker listening, whose fallback poll is far off
    fallback = 60.0
    worker, counted = _working(runtime, fallback)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        _wait_until(lambda: _listening(runtime), "the worker never listened")
        claims_before = counted.claims
        window = 1.0
        time.sleep(window)  # a measuring window, not a wait for a condition
        idle_claims = counted.claims - claims_before

        # When a run is started
        _client(runtime).start(run_id="new", agent=AGENT, input={"steps": 1})

        # Then the worker takes it at once, long before its poll would have looked
        took = _wait_until(lambda: _done(runtime, "new"), "the worker never took the run")
    finally:
        worker.stop.set()
        # A notification ends its wait now, rather than its fallback poll a minute on.
        _client(runtime).start(run_id="wake", agent=AGENT, input={"steps": 1})
        thread.join(timeout=DEADLINE_SECONDS)
    print(f"\nidle {window:.0f}s: {idle_claims} claims; a new run done in {took * 1000:.0f} ms")
    assert idle_claims <= 1, f"{idle_claims} claims in {window}s idle: a tight poll"
    assert took < fallback / 2


def test_a_worker_that_missed_the_word_finds_the_run_by_its_fallback_poll(
    runtime: PostgresRuntime,
) -> None:
    # Given an idle worker that will miss the next notification, polling every 1.5 s
    fallback = 1.5
    worker, _ = _working(runtime, fallback)
    assert worker.wake_ups is not None
    deaf = MissesOne(worker.wake_ups)
    worker.wake_ups = deaf
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        _wait_until(lambda: _listening(runtime), "the worker never listened")

        # When a run is started, its notification lost on this worker
        _client(runtime).start(run_id="missed", agent=AGENT, input={"steps": 1})

        # Then the worker finds it all the same, by its fallback poll, within its bound
        took = _wait_until(lambda: _done(runtime, "missed"), "the run was never taken")
    finally:
        worker.stop.set()
        thread.join(timeout=DEADLINE_SECONDS)
    print(f"\nnotification missed: the run done {took * 1000:.0f} ms after its start")
    assert deaf.missed == 1
    assert took < fallback + 5.0

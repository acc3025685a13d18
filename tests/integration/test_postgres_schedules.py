"""The schedule book on a real Postgres store, reached by workers that share nothing but the
database (each with a pool of its own)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.postgres.schedules import PostgresScheduleBook
from ratchet.schedules import ScheduleSpec, new_schedule
from tests.postgres_support import scratch_store

T0 = datetime(2026, 3, 1, 9, 0, 0, 500_000, tzinfo=UTC)
WORKERS = 8


@pytest.fixture
def open_store() -> Iterator[Callable[[], PostgresDatabase]]:
    with scratch_store() as open_store:
        yield open_store


def spec(name: str = "nightly") -> ScheduleSpec:
    return ScheduleSpec(name=name, agent="tests.waits_agent:agent", every_seconds=3600)


def test_a_schedule_reads_back_as_added_once_and_is_due_from_its_next_fire(open_store):
    book = PostgresScheduleBook(open_store())
    added = new_schedule(spec(), T0)

    assert book.add(added)
    assert not book.add(new_schedule(spec(), T0 + timedelta(days=1)))  # the first stands

    assert book.get("nightly") == added
    assert book.all() == [added]
    assert book.due(added.next_fire - timedelta(microseconds=1)) == []
    assert book.due(added.next_fire) == [added]
    paused = added.model_copy(update={"paused": True})
    assert book.replace(paused, expected=added)
    assert book.due(added.next_fire) == []
    assert not book.replace(added, expected=added), "not what it read: nothing written"
    assert book.remove("nightly")
    assert book.get("nightly") is None
    assert not book.remove("nightly")


def test_of_workers_firing_one_time_at_once_one_moves_the_schedule_on(open_store):
    first = PostgresScheduleBook(open_store())
    fired = new_schedule(spec(), T0)
    first.add(fired)
    books = [PostgresScheduleBook(open_store()) for _ in range(WORKERS)]
    start = threading.Barrier(WORKERS)

    def move(n: int) -> bool:
        start.wait(timeout=30)
        return books[n].move_on(
            fired, next_fire=fired.next_fire + timedelta(hours=1), last_run=f"run-by-{n}"
        )

    with ThreadPoolExecutor(WORKERS) as pool:
        moved = list(pool.map(move, range(WORKERS)))

    assert moved.count(True) == 1
    stored = first.get("nightly")
    assert stored is not None
    assert stored.next_fire == fired.next_fire + timedelta(hours=1)
    assert stored.last_run == f"run-by-{moved.index(True)}"


def test_a_pause_that_landed_while_a_fire_started_its_run_is_kept(open_store):
    book = PostgresScheduleBook(open_store())
    fired = new_schedule(spec(), T0)
    book.add(fired)
    book.replace(fired.model_copy(update={"paused": True}), expected=fired)

    assert book.move_on(fired, next_fire=fired.next_fire + timedelta(hours=1), last_run="r")

    stored = book.get("nightly")
    assert stored is not None
    assert (stored.paused, stored.last_run) == (True, "r")

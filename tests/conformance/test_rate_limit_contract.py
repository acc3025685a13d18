"""The contract every RateLimit backend must honour (`ratchet.ports.RateLimit`, the deployment's
model calls a minute): SQLite locally, DynamoDB (on moto) on AWS, one suite."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ratchet.adapters.dynamodb.rate import DynamoDbRateLimit
from ratchet.adapters.postgres.rate import PostgresRateLimit
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.rate import SqliteRateLimit
from ratchet.ports import RateLimit
from tests.dynamodb_support import SETTINGS, serialized_moto_tables
from tests.postgres_support import scratch_store

MINUTE = 28_000_000 * 60  # the start of a minute


class Clock:
    def __init__(self) -> None:
        self.now = MINUTE + 12.5

    def __call__(self) -> float:
        return self.now


def _sqlite(tmp_path: Path, clock: Clock) -> Iterator[Callable[[], RateLimit]]:
    path = tmp_path / "ratchet.db"
    opened: list[SqliteDatabase] = []

    def another() -> RateLimit:
        # Each taker on its own connection, as each worker process has its own.
        db = SqliteDatabase(path, create=True, any_thread=True)
        opened.append(db)
        return SqliteRateLimit(db, clock=clock)

    yield another
    for db in opened:
        db.close()


def _dynamodb(tmp_path: Path, clock: Clock) -> Iterator[Callable[[], RateLimit]]:
    with serialized_moto_tables() as client:
        yield lambda: DynamoDbRateLimit(client, SETTINGS.checkpoints_table, clock=clock)


def _postgres(tmp_path: Path, clock: Clock) -> Iterator[Callable[[], RateLimit]]:
    with scratch_store() as open_store:
        # Each taker with a pool of its own, as each worker process has its own.
        yield lambda: PostgresRateLimit(open_store(), clock=clock)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "dynamodb", "postgres"])
def limits(request, tmp_path, clock) -> Iterator[Callable[[], RateLimit]]:
    backend = {"sqlite": _sqlite, "dynamodb": _dynamodb, "postgres": _postgres}[request.param]
    yield from backend(tmp_path, clock)


def test_a_minute_takes_its_limit_and_then_says_when_the_next_begins(limits, clock):
    rate = limits()
    assert [rate.take("model", 3) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.take("model", 3) == pytest.approx(47.5)
    assert rate.take("other", 3) == 0.0  # each name counts apart
    clock.now = MINUTE + 60  # the next minute
    assert rate.take("model", 3) == 0.0


def test_a_refused_request_is_not_counted(limits, clock):
    rate = limits()
    assert rate.take("model", 1) == 0.0
    for _ in range(5):
        assert rate.take("model", 1) > 0
    clock.now = MINUTE + 61
    assert rate.take("model", 2) == 0.0
    assert rate.take("model", 2) == 0.0
    assert rate.take("model", 2) > 0


def test_takers_at_once_share_one_count(limits):
    takers = [limits() for _ in range(8)]
    barrier = threading.Barrier(len(takers))
    granted: list[bool] = []

    def take(rate: RateLimit) -> None:
        barrier.wait()
        for _ in range(3):
            granted.append(rate.take("model", 10) == 0.0)

    threads = [threading.Thread(target=take, args=(rate,)) for rate in takers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert granted.count(True) == 10

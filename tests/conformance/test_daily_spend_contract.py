"""The contract every DailySpend backend must honour (`ratchet.ports.DailySpend`, an agent's
spend per day shared by all its runs and workers): SQLite locally, DynamoDB (on moto) on AWS,
Postgres (the tests' throwaway cluster), one suite. Issue 38, item 2: the counter; the engine
does not use it yet."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ratchet.adapters.dynamodb.daily_spend import DynamoDbDailySpend
from ratchet.adapters.postgres.daily_spend import PostgresDailySpend
from ratchet.adapters.sqlite.daily_spend import SqliteDailySpend
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.ports import DailySpend
from tests.dynamodb_support import SETTINGS, serialized_moto_tables
from tests.postgres_support import scratch_store

DAY = "2026-12-06"


def _sqlite(tmp_path: Path) -> Iterator[Callable[[], DailySpend]]:
    path = tmp_path / "ratchet.db"
    opened: list[SqliteDatabase] = []

    def another() -> DailySpend:
        # Each reserver on its own connection, as each worker process has its own.
        db = SqliteDatabase(path, create=True, any_thread=True)
        opened.append(db)
        return SqliteDailySpend(db)

    yield another
    for db in opened:
        db.close()


def _dynamodb(tmp_path: Path) -> Iterator[Callable[[], DailySpend]]:
    with serialized_moto_tables() as client:
        yield lambda: DynamoDbDailySpend(client, SETTINGS.checkpoints_table)


def _postgres(tmp_path: Path) -> Iterator[Callable[[], DailySpend]]:
    with scratch_store() as open_store:
        # Each reserver with a pool of its own, as each worker process has.
        yield lambda: PostgresDailySpend(open_store())


@pytest.fixture(params=["sqlite", "dynamodb", "postgres"])
def counters(request, tmp_path) -> Iterator[Callable[[], DailySpend]]:
    backend = {"sqlite": _sqlite, "dynamodb": _dynamodb, "postgres": _postgres}[request.param]
    yield from backend(tmp_path)


def test_a_day_takes_reservations_up_to_its_limit_and_refuses_the_rest_uncounted(counters):
    spend = counters()
    assert spend.spent("support", DAY) == 0
    assert spend.reserve("support", DAY, 60, 100)
    assert spend.reserve("support", DAY, 40, 100)  # exactly the limit
    assert not spend.reserve("support", DAY, 1, 100)
    assert not spend.reserve("other", DAY, 101, 100)  # over the limit on its own
    assert spend.spent("support", DAY) == 100
    assert spend.spent("other", DAY) == 0
    assert spend.reserve("support", "2026-12-07", 100, 100)  # each day counts apart
    assert spend.reserve("other", DAY, 100, 100)  # each agent too


def test_settling_gives_back_what_a_call_did_not_use(counters):
    spend = counters()
    assert spend.reserve("support", DAY, 80, 100)
    assert not spend.reserve("support", DAY, 30, 100)
    spend.settle("support", DAY, reserved=80, used=55)
    assert spend.spent("support", DAY) == 55
    assert spend.reserve("support", DAY, 30, 100)
    spend.settle("support", DAY, reserved=30, used=30)
    assert spend.spent("support", DAY) == 85


def test_reservers_at_once_never_take_more_than_the_limit(counters):
    reservers = [counters() for _ in range(8)]
    barrier = threading.Barrier(len(reservers))
    granted: list[bool] = []

    def reserve(spend: DailySpend) -> None:
        barrier.wait()
        for _ in range(5):
            granted.append(spend.reserve("support", DAY, 3, 100))

    threads = [threading.Thread(target=reserve, args=(spend,)) for spend in reservers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert granted.count(True) == 33  # 99 of 100: a 34th would pass it
    assert reservers[0].spent("support", DAY) == 99


def test_a_raise_lets_the_day_spend_that_much_more_and_spent_stays_what_was_spent(counters):
    spend = counters()
    assert not spend.reserve("support", DAY, 130, 100)  # over the limit on its own
    assert spend.reserve("support", DAY, 90, 100)
    assert not spend.reserve("support", DAY, 40, 100)
    assert spend.raise_budget("support", DAY, 50) == 50
    assert spend.reserve("support", DAY, 40, 100)  # 130 of 150
    assert not spend.reserve("support", DAY, 21, 100)
    spend.settle("support", DAY, reserved=40, used=10)
    assert spend.spent("support", DAY) == 100
    assert spend.raised("support", DAY) == 50
    assert spend.raise_budget("support", DAY, 30) == 80  # raises add up
    assert spend.reserve("support", DAY, 80, 100)  # 180 of 180
    assert spend.spent("support", DAY) == 180
    assert spend.raised("other", DAY) == 0
    # A raise before any spend, and a first reservation above the limit alone but within it
    assert spend.raise_budget("other", DAY, 100) == 100
    assert spend.reserve("other", DAY, 150, 100)
    assert spend.spent("other", DAY) == 150

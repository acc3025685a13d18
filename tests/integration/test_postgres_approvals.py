"""Approval requests on a real Postgres store, opened and decided by workers and pages that
share nothing but the database (each with a pool of its own), at the same moment."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest

from ratchet.adapters.postgres.approvals import PostgresApprovalBook
from ratchet.errors import ApprovalDecided
from ratchet.waits import Approval, Verdict
from tests.postgres_support import scratch_store

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
RACERS = 8
T = TypeVar("T")


@pytest.fixture
def books() -> Iterator[list[PostgresApprovalBook]]:
    with scratch_store() as open_store:
        yield [PostgresApprovalBook(open_store()) for _ in range(RACERS)]


def request(n: int) -> Approval:
    return Approval(
        approval_id=f"approval-{n:04d}-run-1-step-3",
        run_id="run-1",
        step=3,
        created_at=T0,
        expires_at=T0 + timedelta(days=1),
    )


def at_once(work: Callable[[int], T]) -> list[T]:
    start = threading.Barrier(RACERS)

    def each(n: int) -> T:
        start.wait(timeout=30)
        return work(n)

    with ThreadPoolExecutor(RACERS) as pool:
        return list(pool.map(each, range(RACERS)))


def test_workers_opening_one_parked_step_at_once_open_one_request(books):
    opened = at_once(lambda n: books[n].open(request(n)))

    assert len({a.approval_id for a in opened}) == 1
    assert books[0].of_run("run-1") == [opened[0]]


def test_people_deciding_one_request_at_once_make_one_decision(books):
    opened = books[0].open(request(0))

    def decide(n: int) -> str:
        verdict = Verdict(approved=n % 2 == 0, by=f"person-{n}@example.com")
        try:
            books[n].settle(opened, verdict, channel="link", at=T0 + timedelta(minutes=1))
        except ApprovalDecided:
            return "refused"
        return verdict.by

    outcomes = at_once(decide)

    deciders = [o for o in outcomes if o != "refused"]
    assert len(deciders) == 1, outcomes
    stored = books[0].get("run-1", opened.approval_id)
    assert stored is not None
    assert stored.decided_by == deciders[0]

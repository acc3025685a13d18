"""Leases and live worker ids on a real Postgres store, with workers that share nothing but the
database (each its own pool, as each process on each machine has) and a clock the tests move
by hand."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.postgres.leases import PostgresLeases
from ratchet.adapters.postgres.store import PostgresCheckpointStore
from ratchet.adapters.sqlite.leases import WorkerIdInUse
from ratchet.ports import ConcurrencyBound
from tests.conformance.test_store_contract import new_run
from tests.postgres_support import scratch_store

WORKERS = 8
ROUNDS = 10


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def open_store() -> Iterator[Callable[[], PostgresDatabase]]:
    with scratch_store() as open_store:
        yield open_store


def _runs(open_store: Callable[[], PostgresDatabase], count: int) -> list[str]:
    store = PostgresCheckpointStore(open_store())
    ids = [f"run-{n:02d}" for n in range(count)]
    for run_id in ids:
        store.create_run(*new_run(run_id))
    return ids


def _race(workers: list[PostgresLeases], work: Callable[[int, PostgresLeases], list[str]]):
    start = threading.Barrier(len(workers))

    def each(n: int) -> list[str]:
        start.wait(timeout=30)
        return work(n, workers[n])

    with ThreadPoolExecutor(len(workers)) as pool:
        return list(pool.map(each, range(len(workers))))


def test_workers_claiming_at_once_each_take_other_runs_and_every_run_once(open_store, clock):
    ids = _runs(open_store, 20)
    workers = [PostgresLeases(open_store(), clock=clock) for _ in range(WORKERS)]

    def claim_all(n: int, leases: PostgresLeases) -> list[str]:
        taken: list[str] = []
        while (run := leases.claim(f"w{n}", 60, skip=taken)) is not None:
            taken.append(run)
        return taken

    claimed = _race(workers, claim_all)

    every = [run for taken in claimed for run in taken]
    assert sorted(every) == ids, "each run claimed by exactly one worker"
    for n, taken in enumerate(claimed):
        assert all(workers[0].holder(run) == (f"w{n}", clock.now + 60) for run in taken)


def test_a_live_lease_keeps_others_out_and_a_lapsed_one_is_taken(open_store, clock):
    _runs(open_store, 1)
    mine, theirs = (PostgresLeases(open_store(), clock=clock) for _ in range(2))
    assert mine.claim("a", 10) == "run-00"

    assert theirs.claim("b", 10) is None
    assert theirs.held_by_others("b") == [("run-00", "a", clock.now + 10)]
    clock.now += 8
    assert mine.renew("run-00", "a", 10)
    clock.now += 7  # past the first expiry, inside the renewed one
    assert theirs.claim("b", 10) is None
    clock.now += 4  # past the renewed one: the holder died
    assert theirs.claim("b", 10) == "run-00"

    assert not mine.renew("run-00", "a", 10)
    mine.release("run-00", "a")  # no longer its own: nothing happens
    assert mine.holder("run-00") == ("b", clock.now + 10)
    theirs.release("run-00", "b")
    assert mine.holder("run-00") is None
    assert mine.running_runs() == 1


def test_a_bounded_agent_never_holds_more_leases_than_its_bound_under_racing_claims(
    open_store, clock
):
    _runs(open_store, 6)
    workers = [PostgresLeases(open_store(), clock=clock) for _ in range(WORKERS)]

    def bound(reference: str) -> ConcurrencyBound | None:
        return ConcurrencyBound("fake", 2) if reference == "fake" else None

    def claim_one(n: int, leases: PostgresLeases) -> list[str]:
        run = leases.claim(f"w{n}", 60, limit_of=bound)
        return [run] if run else []

    # Rounds of eight claims at once, each after the last round's holders died (their
    # leases lapsed, and their slots with them): a claim that counted the slots while
    # another took one would show in one round or another.
    for round in range(ROUNDS):
        claimed = [run for taken in _race(workers, claim_one) for run in taken]
        assert len(claimed) == 2 == len(set(claimed)), f"round {round}: {claimed}"
        clock.now += 61


def test_a_worker_id_is_held_by_one_live_process_at_a_time(open_store, clock):
    first, second = (PostgresLeases(open_store(), clock=clock) for _ in range(2))
    first.register_worker("w", "token-1", 10, host="host-a", pid=11)

    with pytest.raises(WorkerIdInUse, match="pid 11 on host-a"):
        second.register_worker("w", "token-2", 10, host="host-b", pid=22)
    assert first.beat("w", "token-1", 10, None).registered
    clock.now += 11  # the first stopped beating
    second.register_worker("w", "token-2", 10, host="host-b", pid=22)

    assert not first.beat("w", "token-1", 10, None).registered
    first.unregister_worker("w", "token-1")  # not its own any more: nothing happens
    with pytest.raises(WorkerIdInUse, match="pid 22 on host-b"):
        first.register_worker("w", "token-1", 10)

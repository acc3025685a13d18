"""What one step of a running run sends a Postgres store, counted by `bench.postgres_requests`
on the tests' throwaway cluster: each request waits for its answer, so over a network every
round trip is a wait of its own (0.3-1 ms within a zone), and a step's round trips are a floor
under its time that no engine work can lower. And what the fewer statements keep of the
transactions they replaced."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bench.postgres_requests import PostgresRequests
from bench.step_cost import MAX_STEPS, BenchRun
from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.postgres.ledger import PostgresLedger
from ratchet.adapters.postgres.store import PostgresCheckpointStore, PostgresWaitBook
from ratchet.errors import StaleVersion
from ratchet.ports import LedgerEntry, LedgerStatus
from ratchet.state import (
    RunStatus,
    StepCompleted,
    TimerWait,
    ToolCall,
    ToolOutput,
    WaitSettled,
    utcnow,
)
from tests.conformance.test_store_contract import commit_of, new_run, step_commit
from tests.postgres_support import Cluster, scratch_store

WARM_UP, COUNTED = 10, 10
"""Steps taken before counting, and steps counted."""

MAX_ROUND_TRIPS = 8
"""A step's round trips, at most: its head and window read in one REPEATABLE READ transaction
(BEGIN, its two reads, COMMIT), then one statement each, their own transactions: the attempt's
count, the ledger's read and reserve, and the commit (head, ledger key and record in one).
Was 20, in five transactions of a BEGIN and a COMMIT each."""


@pytest.fixture
def store_url(postgres: Cluster) -> Iterator[str]:
    name = postgres.fresh_database()
    yield postgres.url(name)
    postgres.drop_database(name)


def test_a_running_runs_step_sends_postgres_at_most_eight_round_trips(
    store_url: str, tmp_path: Path
) -> None:
    steps = WARM_UP + COUNTED
    with BenchRun(tmp_path, steps=steps + 1, max_steps=MAX_STEPS, url=store_url) as run:
        run.advance_to(WARM_UP, start=0)
        with PostgresRequests() as meter:
            before = meter.take()
            run.advance_to(steps, start=WARM_UP)
            sent = meter.take() - before

    # psycopg prepares a statement once it has sent it 5 times on a connection, a round trip
    # once a connection and statement, whichever of the pool's connections a step is given:
    # not the step's own.
    trips = (sent.round_trips - sent.prepares) / COUNTED
    print(
        f"a step sends {trips:g} round trips, {sent.transactions / COUNTED:g} transactions "
        f"(and {sent.prepares / COUNTED:g} prepares): "
        + ", ".join(f"{n / COUNTED:g} {kind}" for kind, n in sorted(sent.by_kind.items()))
    )
    assert trips <= MAX_ROUND_TRIPS
    # Only the read is a transaction of more than one statement: the writes are one each.
    assert sent.by_kind["BEGIN"] == sent.by_kind["COMMIT"] == COUNTED
    assert "SET" not in sent.by_kind  # the read's isolation goes with its BEGIN


# The commit is one statement (head, ledger key and record), a transaction of its own when the
# run's status stays as it was: these pin what that statement must keep of the transaction it
# replaced.


@pytest.fixture
def db() -> Iterator[PostgresDatabase]:
    with scratch_store() as open_store:
        yield open_store()


def test_a_stale_commit_leaves_the_ledger_key_as_it_was(db: PostgresDatabase) -> None:
    store, ledger = PostgresCheckpointStore(db), PostgresLedger(db)
    state, created = new_run()
    store.create_run(state, created)
    key = "r1/step-1"
    ledger.begin(LedgerEntry(key=key, run_id="r1", step=1, args_hash="h", decision={"d": 1}))

    # The run moved on (another worker counted its attempt) while the key is in progress.
    store.begin_attempt("r1", state.version)
    with pytest.raises(StaleVersion):
        store.commit(step_commit(state, 1, text="stale"))
    pending = ledger.get(key)
    assert pending is not None
    assert (pending.status, pending.decision, pending.result) == (
        LedgerStatus.IN_PROGRESS,
        {"d": 1},
        None,
    )

    # Once completed by the step that landed, a stale writer's result does not replace it.
    bumped = state.model_copy(update={"version": state.version + 1, "attempts": 1})
    store.commit(step_commit(bumped, 1, text="winner"))
    with pytest.raises(StaleVersion):
        store.commit(step_commit(bumped, 1, text="loser"))
    done = ledger.get(key)
    assert done is not None
    assert (done.status, done.result) == (LedgerStatus.COMPLETED, "winner")
    assert [c.version for c in store.list_checkpoints("r1")] == [1, 3]


def test_a_commit_that_parks_or_wakes_a_run_books_its_wait(db: PostgresDatabase) -> None:
    store, book = PostgresCheckpointStore(db), PostgresWaitBook(db)
    state, created = new_run()
    store.create_run(state, created)
    until = utcnow() + timedelta(hours=1)
    sleep = StepCompleted(
        step=1,
        key="r1/step-1",
        call=ToolCall(name="sleep", arguments={"seconds": 3600}),
        output=ToolOutput(step=1, tool="sleep", text="Sleeping"),
        wait=TimerWait(until=until),
        attempt=1,
        duration_ms=1.0,
    )

    parked = commit_of(state, sleep, step=1)
    store.commit(parked)

    assert parked.head.status is RunStatus.WAITING
    assert [(w.run_id, w.due_at) for w in book.due(until)] == [("r1", until)]

    woke = commit_of(parked.head, WaitSettled(step=1, how="due", text="woke"), step=1)
    store.commit(woke)

    assert woke.head.status is RunStatus.RUNNING
    assert book.due(until) == []
    assert store.load_head("r1") == woke.head

"""The database stops in the middle of a step, exactly: the step's tool stops the server after
its effect, so the step's commit meets a store that is gone. An outage is not the step's
failure: the engine records no failed attempt, the worker gives back the attempt the outage
cut short once the store answers, and the step commits at its first attempt; the worker says
so in one line when the store goes and one when it is back.

A Postgres failure that is not an outage (a statement the server cancelled) stays `StoreBusy`
and is not said to be one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from ratchet import Client
from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl, notify_work
from ratchet.adapters.postgres.wakeups import PostgresWakeUps
from ratchet.errors import StoreBusy, StoreUnreachable
from ratchet.runtime.local import LocalSettings
from ratchet.runtime.postgres import PostgresRuntime
from ratchet.state import AttemptFailed, RunStatus, StepCompleted
from ratchet.tools import Agent, Done, Tool, ToolCall, ToolContext
from tests.postgres_support import Cluster, private_cluster

AGENT = f"{__name__}:agent"


class Nothing(BaseModel):
    pass


_server: list[Cluster] = []
"""The cluster whose server the tool stops, set by the test (the tool runs in its process)."""
_calls: list[str] = []


def stop_the_database(args: Nothing, ctx: ToolContext) -> str:
    _calls.append(ctx.idempotency_key)
    if len(_calls) == 1:
        _server[0].stop_server()
    return "stopped"


agent = Agent(
    name="stops-its-database",
    tools=[Tool("stop", "Stop the database.", Nothing, stop_the_database)],
    goal="Stop the database once",
    policy=lambda view: (
        ToolCall(name="stop", arguments={}) if not view.messages else Done(summary="ok")
    ),
)


@pytest.fixture
def own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.chdir(tmp_path)  # the store's host files live here
    with private_cluster() as cluster:
        _server[:] = [cluster]
        _calls.clear()
        yield cluster
        _server.clear()


def test_a_step_cut_short_by_the_database_stopping_commits_at_its_first_attempt(
    own: Cluster,
) -> None:
    # Given a run whose first step's tool stops the database after its effect
    runtime = PostgresRuntime.open(LocalSettings(store=own.url(own.fresh_database())))
    Client(runtime, worker_id="starter", logger=logging.getLogger("starter")).start(
        run_id="cut", agent=AGENT
    )
    said: list[str] = []
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        # The database comes back at the worker's second pause, so that two of its tries
        # have failed by then: it says so once all the same.
        pauses.append(seconds)
        if len(pauses) == 2:
            own.start_server()

    worker = runtime.worker(worker_id="w", logger=logging.getLogger("w"), on_wait=said.append)
    worker.sleep = pause

    # When a worker works it until it is done
    worker.run(until_idle=True)

    # Then the step committed once, at its first attempt, with no failed attempt on record
    history = runtime.store.list_checkpoints("cut")
    head = runtime.store.load_head("cut")
    assert head is not None
    assert head.status is RunStatus.DONE, head.error
    steps = [c.event for c in history if isinstance(c.event, StepCompleted)]
    assert [(s.step, s.attempt) for s in steps] == [(1, 1)]
    assert not [c for c in history if isinstance(c.event, AttemptFailed)]
    assert _calls == ["cut/step-1", "cut/step-1"]  # the tool ran again, with the same key
    # And the worker said so once each way, trying again 0.5 s then 1 s after a failed try
    outage = [line for line in said if "store is" in line]
    print(f"\nthe worker said: {outage}; paused {pauses}")
    assert pauses[:2] == [0.5, 1.0], pauses
    assert len(outage) == 2, said
    assert outage[0].startswith("the store is unreachable (the Postgres store"), outage
    assert outage[0].endswith("); retrying"), outage
    assert outage[1].startswith("the store is reachable again after "), outage
    runtime.close()


def test_an_idle_workers_wait_outlives_the_database_and_listens_again(own: Cluster) -> None:
    # Given a worker's wake-ups listening on a store, whose server then stops
    db = PostgresDatabase(PostgresUrl.parse(own.url(own.fresh_database(store=True))))
    wake_ups = PostgresWakeUps(db)
    try:
        assert wake_ups.wait(0.1)  # the first wait listens, then says to look once
        own.stop_server()

        # When it waits while the server is down, and again once it is back
        while_down = wake_ups.wait(0.1)
        own.start_server()
        back = wake_ups.wait(0.1)

        # Then the wait while down ended quietly, told of nothing; the one after listened
        # anew and said to look (whatever was notified meanwhile told no one), and a write
        # notified now reaches it
        assert while_down is False
        assert back is True
        with db.write() as tx:
            notify_work(tx, "new-run")
        assert wake_ups.wait(30)
    finally:
        wake_ups.close()
        db.close()


def test_a_pool_drops_the_idle_connections_an_outage_cut(own: Cluster) -> None:
    # Given a pool holding three connections, idle, when the server stops
    db = PostgresDatabase(
        PostgresUrl.parse(own.url(own.fresh_database(store=True)) + "&pool_size=3")
    )
    try:
        with db.pool.connection(), db.pool.connection(), db.pool.connection():
            pass
        own.stop_server()

        # When a transaction finds it gone, and the server starts again
        with pytest.raises(StoreUnreachable):
            _read_one(db)
        own.start_server()

        # Then no connection the outage cut is left to fail a transaction after it
        answered = [_read_one(db) for _ in range(6)]
        assert answered == [1] * 6
    finally:
        db.close()


def _read_one(db: PostgresDatabase) -> int:
    with db.read() as tx:
        row = tx.execute("SELECT 1").fetchone()
    return int(row[0]) if row else 0


def test_a_statement_the_server_cancelled_is_busy_and_not_an_outage(postgres: Cluster) -> None:
    # A statement past its time limit is cancelled by the server (QueryCanceled, an
    # OperationalError as a lost connection is): the database is there, so it is no outage.
    name = postgres.fresh_database(store=True)
    db = PostgresDatabase(PostgresUrl.parse(postgres.url(name)))
    try:
        with pytest.raises(StoreBusy) as cancelled:
            _sleep_past_its_limit(db)
        assert "canceling statement due to statement timeout" in str(cancelled.value)
        assert not isinstance(cancelled.value, StoreUnreachable), cancelled.value
        with db.read() as tx:
            assert tx.execute("SELECT 1").fetchone() == (1,)
    finally:
        db.close()
        postgres.drop_database(name)


def _sleep_past_its_limit(db: PostgresDatabase) -> None:
    with db.write() as tx:
        tx.execute("SET LOCAL statement_timeout = 1")
        tx.execute("SELECT pg_sleep(5)")

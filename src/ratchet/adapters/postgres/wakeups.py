"""Workers told of new work by Postgres (`LISTEN`), rather than asking for it in a tight loop.

The writes that give workers something to do send a `NOTIFY` on `WORK_CHANNEL` in their own
transaction (`notify_work`): a new run, an event posted to a run, a run that goes on again (a
decision, a settled wait). An idle worker waits on its own connection for one, and for the
next due timer of the book of open waits (a timer is due by the clock, not by a write); a
notification it missed (it was not listening yet, its connection was cut) is found by the
worker's fallback poll (`ratchet.worker.FALLBACK_POLL_SECONDS`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ratchet.adapters.postgres.database import WORK_CHANNEL, PostgresDatabase
from ratchet.errors import StoreBusy

if TYPE_CHECKING:
    import psycopg

_CONNECT_SECONDS = 10
MIN_WAIT_SECONDS = 0.1


class PostgresWakeUps:
    """`ratchet.worker.WakeUps` on a connection of its own, outside the store's pool (a
    listening session must last between waits)."""

    def __init__(
        self, db: PostgresDatabase, *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._db = db
        self._clock = clock
        self._connection: psycopg.Connection[Any] | None = None

    def wait(self, seconds: float) -> bool:
        import psycopg

        try:
            due_in = self._until_due()
        except StoreBusy:
            # The database is out of reach (the worker says so, once, when its next claim
            # fails): no timer is known, and the listening connection below fails too.
            due_in = float("inf")
        # Never less than the old poll's pause: a wait due but not settled yet (a store
        # busy meanwhile) must not turn this into a tight loop.
        timeout = max(MIN_WAIT_SECONDS, min(seconds, due_in))
        try:
            if self._connection is None:
                self._connection = psycopg.connect(
                    self._db.url.conninfo, autocommit=True, connect_timeout=_CONNECT_SECONDS
                )
                self._connection.execute(f"LISTEN {WORK_CHANNEL}")
                # Work written before the LISTEN took hold told no one here: look once more.
                return True
            for _ in self._connection.notifies(timeout=timeout, stop_after=1):
                return True
        except psycopg.Error:
            # The connection was cut (the database restarted): listen anew at the next wait;
            # meanwhile this one waits out its time, and the worker's poll finds the work.
            self.close()
            time.sleep(timeout)
            return False
        return due_in <= timeout

    def _until_due(self) -> float:
        """Seconds until the next open wait is due (a timer, an event's timeout), read once a
        wait: a due timer wakes the worker as a notification does."""
        from ratchet.adapters.postgres.store import PostgresWaitBook

        due = PostgresWaitBook(self._db).next_due()
        return float("inf") if due is None else (due - self._clock()).total_seconds()

    def close(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            connection.close()

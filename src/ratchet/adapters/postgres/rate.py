"""`ratchet.ports.RateLimit` in a Postgres store: a row per name and minute, counted up by one
conditional upsert, so every worker on every machine sharing the database shares the count."""

from __future__ import annotations

import time
from collections.abc import Callable

from ratchet.adapters.postgres.database import PostgresDatabase


class PostgresRateLimit:
    def __init__(self, db: PostgresDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._clock = clock

    def take(self, name: str, per_minute: int) -> float:
        now = self._clock()
        minute = int(now // 60)
        with self._db.write() as tx:
            tx.execute("DELETE FROM rate_windows WHERE name = %s AND minute < %s", (name, minute))
            # The upsert holds the minute's row while it counts: a taker at the same moment
            # waits, then sees the count this one left, so the minute's limit is never
            # passed; a refused request (the count at its limit) changes no row.
            counted = tx.execute(
                "INSERT INTO rate_windows AS w (name, minute, count) VALUES (%s, %s, 1) "
                "ON CONFLICT (name, minute) DO UPDATE SET count = w.count + 1 "
                "WHERE w.count < %s",
                (name, minute, per_minute),
            ).rowcount
        return 0.0 if counted else (minute + 1) * 60 - now

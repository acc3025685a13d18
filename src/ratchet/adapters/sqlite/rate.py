"""`ratchet.ports.RateLimit` in a local store: a row per name and minute, counted up in a write
transaction, so every worker process on the store shares the count."""

from __future__ import annotations

import time
from collections.abc import Callable

from ratchet.adapters.sqlite.database import SqliteDatabase

RATE_SCHEMA = """
-- ratchet.adapters.sqlite.rate counts requests here, a row per name and minute.
CREATE TABLE IF NOT EXISTS rate_windows (
    name   TEXT NOT NULL,
    minute INTEGER NOT NULL,
    count  INTEGER NOT NULL,
    PRIMARY KEY (name, minute)
) WITHOUT ROWID;
"""


class SqliteRateLimit:
    def __init__(self, db: SqliteDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._clock = clock
        self._table_checked = False

    def take(self, name: str, per_minute: int) -> float:
        now = self._clock()
        minute = int(now // 60)
        with self._db.write() as tx:
            if not self._table_checked:  # a store made before the limit existed gets it here
                tx.execute(RATE_SCHEMA)
            tx.execute("DELETE FROM rate_windows WHERE name = ? AND minute < ?", (name, minute))
            counted = tx.execute(
                "INSERT INTO rate_windows (name, minute, count) VALUES (?, ?, 1) "
                "ON CONFLICT (name, minute) DO UPDATE SET count = count + 1 "
                "WHERE count < ?",
                (name, minute, per_minute),
            ).rowcount
        self._table_checked = True
        return 0.0 if counted else (minute + 1) * 60 - now

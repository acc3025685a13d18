"""`ratchet.ports.DailySpend` in a local store: a row per agent and day, moved in a write
transaction whose update holds its own condition (the new total within the limit), so every
worker process on the store shares one counter."""

from __future__ import annotations

import sqlite3

from ratchet.adapters.sqlite.database import SqliteDatabase

DAILY_SPEND_SCHEMA = """
-- ratchet.adapters.sqlite.daily_spend counts an agent's spend here, a row per agent and day.
CREATE TABLE IF NOT EXISTS daily_spend (
    agent  TEXT NOT NULL,
    day    TEXT NOT NULL,
    micros INTEGER NOT NULL,
    PRIMARY KEY (agent, day)
) WITHOUT ROWID;
"""


class SqliteDailySpend:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db
        self._table_checked = False

    def reserve(self, agent: str, day: str, amount: int, limit: int) -> bool:
        if amount > limit:
            return False
        with self._db.write() as tx:
            self._check_table(tx)
            # The insert and the conditional update are one statement under the write lock:
            # two processes reserving at once take turns, and the second sees the first's.
            counted = tx.execute(
                "INSERT INTO daily_spend (agent, day, micros) VALUES (?, ?, ?) "
                "ON CONFLICT (agent, day) DO UPDATE SET micros = micros + excluded.micros "
                "WHERE micros + excluded.micros <= ?",
                (agent, day, amount, limit),
            ).rowcount
        return bool(counted)

    def settle(self, agent: str, day: str, reserved: int, used: int) -> None:
        with self._db.write() as tx:
            self._check_table(tx)
            tx.execute(
                "UPDATE daily_spend SET micros = MAX(micros + ?, 0) WHERE agent = ? AND day = ?",
                (used - reserved, agent, day),
            )

    def spent(self, agent: str, day: str) -> int:
        with self._db.write() as tx:
            self._check_table(tx)
            row = tx.execute(
                "SELECT micros FROM daily_spend WHERE agent = ? AND day = ?", (agent, day)
            ).fetchone()
        return int(row[0]) if row else 0

    def _check_table(self, tx: sqlite3.Connection) -> None:
        if not self._table_checked:  # a store made before the counter existed gets it here
            tx.execute(DAILY_SPEND_SCHEMA)
            self._table_checked = True

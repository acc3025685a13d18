"""`ratchet.ports.DailySpend` in a local store: a row per agent and day, moved in a write
transaction whose update holds its own condition (the new total within the limit), so every
worker process on the store shares one counter.

The row keeps what the day's raises add (`raised`) and the spend net of them (`micros`): a
raise moves both in one update, and a reservation is checked against the limit alone, as the
DynamoDB counter is (whose condition cannot add two attributes)."""

from __future__ import annotations

import sqlite3

from ratchet.adapters.sqlite.database import SqliteDatabase

DAILY_SPEND_SCHEMA = """
-- ratchet.adapters.sqlite.daily_spend counts an agent's spend here, a row per agent and day:
-- micros is the spend less the day's raises (raised), so it may go below 0.
CREATE TABLE IF NOT EXISTS daily_spend (
    agent  TEXT NOT NULL,
    day    TEXT NOT NULL,
    micros INTEGER NOT NULL,
    raised INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, day)
) WITHOUT ROWID;
"""


class SqliteDailySpend:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db
        self._table_checked = False

    def reserve(self, agent: str, day: str, amount: int, limit: int) -> bool:
        with self._db.write() as tx:
            self._check_table(tx)
            # Both statements run under the write lock: two processes reserving at once take
            # turns, and the second sees the first's.
            tx.execute(
                "INSERT OR IGNORE INTO daily_spend (agent, day, micros) VALUES (?, ?, 0)",
                (agent, day),
            )
            counted = tx.execute(
                "UPDATE daily_spend SET micros = micros + ? "
                "WHERE agent = ? AND day = ? AND micros + ? <= ?",
                (amount, agent, day, amount, limit),
            ).rowcount
        return bool(counted)

    def settle(self, agent: str, day: str, reserved: int, used: int) -> None:
        with self._db.write() as tx:
            self._check_table(tx)
            tx.execute(
                "UPDATE daily_spend SET micros = MAX(micros + ?, -raised) "
                "WHERE agent = ? AND day = ?",
                (used - reserved, agent, day),
            )

    def raise_budget(self, agent: str, day: str, amount: int) -> int:
        with self._db.write() as tx:
            self._check_table(tx)
            row = tx.execute(
                "INSERT INTO daily_spend (agent, day, micros, raised) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (agent, day) DO UPDATE SET micros = micros - excluded.raised, "
                "raised = raised + excluded.raised RETURNING raised",
                (agent, day, -amount, amount),
            ).fetchone()
        return int(row[0])

    def spent(self, agent: str, day: str) -> int:
        return self._read(agent, day)[0]

    def raised(self, agent: str, day: str) -> int:
        return self._read(agent, day)[1]

    def _read(self, agent: str, day: str) -> tuple[int, int]:
        if not self._table_checked:  # once: then a look at the counter waits for no writer
            with self._db.write() as tx:
                self._check_table(tx)
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT micros + raised, raised FROM daily_spend WHERE agent = ? AND day = ?",
                (agent, day),
            ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def _check_table(self, tx: sqlite3.Connection) -> None:
        if not self._table_checked:  # a store made before the counter existed gets it here
            tx.execute(DAILY_SPEND_SCHEMA)
            columns = {row[1] for row in tx.execute("PRAGMA table_info(daily_spend)")}
            if "raised" not in columns:  # made before a day's budget could be raised
                tx.execute("ALTER TABLE daily_spend ADD COLUMN raised INTEGER NOT NULL DEFAULT 0")
            self._table_checked = True

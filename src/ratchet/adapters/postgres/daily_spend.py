"""`ratchet.ports.DailySpend` in a Postgres store: table `daily_spend`, a row per agent and day,
moved by one statement whose update holds its own condition (the new total within the limit),
so every worker on every host shares one counter."""

from __future__ import annotations

from ratchet.adapters.postgres.database import PostgresDatabase


class PostgresDailySpend:
    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    def reserve(self, agent: str, day: str, amount: int, limit: int) -> bool:
        if amount > limit:
            return False
        with self._db.write() as tx:
            # At READ COMMITTED, a conflicting insert locks the day's row and checks the
            # update's condition on the row as the last reserver left it: of reservers at
            # once, each counts the others' amounts, and none passes the limit.
            counted = tx.execute(
                "INSERT INTO daily_spend AS d (agent, day, micros) VALUES (%s, %s, %s) "
                "ON CONFLICT (agent, day) DO UPDATE SET micros = d.micros + excluded.micros "
                "WHERE d.micros + excluded.micros <= %s",
                (agent, day, amount, limit),
            ).rowcount
        return bool(counted)

    def settle(self, agent: str, day: str, reserved: int, used: int) -> None:
        with self._db.write() as tx:
            tx.execute(
                "UPDATE daily_spend SET micros = GREATEST(micros + %s, 0) "
                "WHERE agent = %s AND day = %s",
                (used - reserved, agent, day),
            )

    def spent(self, agent: str, day: str) -> int:
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT micros FROM daily_spend WHERE agent = %s AND day = %s", (agent, day)
            ).fetchone()
        return int(row[0]) if row else 0

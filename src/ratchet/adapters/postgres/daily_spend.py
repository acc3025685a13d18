"""`ratchet.ports.DailySpend` in a Postgres store: table `daily_spend`, a row per agent and day,
moved by statements whose update holds its own condition (the new total within the limit), so
every worker on every host shares one counter.

The row keeps what the day's raises add (`raised`) and the spend net of them (`micros`), as the
local counter does: a raise moves both in one update, and a reservation is checked against the
limit alone."""

from __future__ import annotations

from ratchet.adapters.postgres.database import PostgresDatabase


class PostgresDailySpend:
    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    def reserve(self, agent: str, day: str, amount: int, limit: int) -> bool:
        with self._db.write() as tx:
            tx.execute(
                "INSERT INTO daily_spend (agent, day, micros) VALUES (%s, %s, 0) "
                "ON CONFLICT (agent, day) DO NOTHING",
                (agent, day),
            )
            # At READ COMMITTED, an update waits for a reserver holding the day's row and then
            # checks its condition on the row as that one left it: of reservers at once, each
            # counts the others' amounts, and none passes the limit.
            counted = tx.execute(
                "UPDATE daily_spend SET micros = micros + %s "
                "WHERE agent = %s AND day = %s AND micros + %s <= %s",
                (amount, agent, day, amount, limit),
            ).rowcount
        return bool(counted)

    def settle(self, agent: str, day: str, reserved: int, used: int) -> None:
        with self._db.write() as tx:
            tx.execute(
                "UPDATE daily_spend SET micros = GREATEST(micros + %s, -raised) "
                "WHERE agent = %s AND day = %s",
                (used - reserved, agent, day),
            )

    def raise_budget(self, agent: str, day: str, amount: int) -> int:
        with self._db.write() as tx:
            row = tx.execute(
                "INSERT INTO daily_spend AS d (agent, day, micros, raised) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (agent, day) DO UPDATE SET "
                "micros = d.micros - excluded.raised, raised = d.raised + excluded.raised "
                "RETURNING raised",
                (agent, day, -amount, amount),
            ).fetchone()
        assert row is not None  # an upsert returns its row
        return int(row[0])

    def spent(self, agent: str, day: str) -> int:
        return self._read(agent, day)[0]

    def raised(self, agent: str, day: str) -> int:
        return self._read(agent, day)[1]

    def _read(self, agent: str, day: str) -> tuple[int, int]:
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT micros + raised, raised FROM daily_spend WHERE agent = %s AND day = %s",
                (agent, day),
            ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

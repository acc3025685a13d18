"""`ratchet.schedules.ScheduleBook` in a local store: a row per schedule, its JSON and its next
fire; moving a schedule on is one conditional update, so of the workers that fire the same
time one moves it (the run they start is the same one: its id derives from the fire)."""

from __future__ import annotations

from datetime import UTC, datetime

from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.schedules import Schedule

SCHEDULES_SCHEMA = """
-- ratchet.adapters.sqlite.schedules keeps the schedules here.
CREATE TABLE IF NOT EXISTS schedules (
    name      TEXT PRIMARY KEY,
    next_fire TEXT NOT NULL,
    paused    INTEGER NOT NULL,
    record    TEXT NOT NULL
) WITHOUT ROWID;
"""


class SqliteScheduleBook:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    def add(self, schedule: Schedule) -> bool:
        with self._db.write() as tx:
            # The table is made with the first schedule: a store that has none (a worker
            # reading it included) is left as it is.
            tx.execute(SCHEDULES_SCHEMA)
            inserted = tx.execute(
                "INSERT INTO schedules (name, next_fire, paused, record) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO NOTHING",
                (
                    schedule.name,
                    _stamp(schedule.next_fire),
                    schedule.paused,
                    schedule.model_dump_json(),
                ),
            ).rowcount
        return bool(inserted)

    def get(self, name: str) -> Schedule | None:
        if not self._db.has_table("schedules"):
            return None
        row = self._db.connection.execute(
            "SELECT record FROM schedules WHERE name = ?", (name,)
        ).fetchone()
        return Schedule.model_validate_json(row[0]) if row else None

    def all(self) -> list[Schedule]:
        if not self._db.has_table("schedules"):
            return []
        rows = self._db.connection.execute("SELECT record FROM schedules ORDER BY name")
        return [Schedule.model_validate_json(record) for (record,) in rows]

    def due(self, now: datetime) -> list[Schedule]:
        """One read of the rows due (what a worker makes every second): not every schedule."""
        if not self._db.has_table("schedules"):
            return []
        rows = self._db.connection.execute(
            "SELECT record FROM schedules WHERE paused = 0 AND next_fire <= ? ORDER BY name",
            (_stamp(now),),
        )
        return [Schedule.model_validate_json(record) for (record,) in rows]

    def remove(self, name: str) -> bool:
        if not self._db.has_table("schedules"):
            return False
        with self._db.write() as tx:
            return bool(tx.execute("DELETE FROM schedules WHERE name = ?", (name,)).rowcount)

    def replace(self, schedule: Schedule, *, expected_next: datetime) -> bool:
        with self._db.write() as tx:
            moved = tx.execute(
                "UPDATE schedules SET next_fire = ?, paused = ?, record = ? "
                "WHERE name = ? AND next_fire = ?",
                (
                    _stamp(schedule.next_fire),
                    schedule.paused,
                    schedule.model_dump_json(),
                    schedule.name,
                    _stamp(expected_next),
                ),
            ).rowcount
        return bool(moved)


def _stamp(moment: datetime) -> str:
    """A UTC time of fixed width, so that the text sorts as the time does."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

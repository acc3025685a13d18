"""`ratchet.schedules.ScheduleBook` in a local store: a row per schedule, its JSON and its next
fire; every change after the add is one write transaction that reads the row and writes it only
if it is still the schedule its caller read (a fire: but for whether it is paused), so of the
workers that fire the same time one moves it (the run they start is the same one: its id
derives from the fire), and a pause, resume or removal that answered stays done."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.schedules import Schedule
from ratchet.sealing import PayloadCodec
from ratchet.stored import open_sealed_text, sealed_text

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
    def __init__(self, db: SqliteDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        # Seals each schedule's record (the input and params its runs start with), bound to
        # its name; what a worker selects on (its next fire, whether it is paused) stays in
        # its own columns.
        self._codec = codec

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
                    self._sealed(schedule),
                ),
            ).rowcount
        return bool(inserted)

    def get(self, name: str) -> Schedule | None:
        if not self._db.has_table("schedules"):
            return None
        row = self._db.connection.execute(
            "SELECT name, record FROM schedules WHERE name = ?", (name,)
        ).fetchone()
        return self._schedule(*row) if row else None

    def all(self) -> list[Schedule]:
        if not self._db.has_table("schedules"):
            return []
        rows = self._db.connection.execute("SELECT name, record FROM schedules ORDER BY name")
        return [self._schedule(name, record) for name, record in rows]

    def due(self, now: datetime) -> list[Schedule]:
        """One read of the rows due (what a worker makes every second): not every schedule."""
        if not self._db.has_table("schedules"):
            return []
        rows = self._db.connection.execute(
            "SELECT name, record FROM schedules WHERE paused = 0 AND next_fire <= ? ORDER BY name",
            (_stamp(now),),
        )
        return [self._schedule(name, record) for name, record in rows]

    def remove(self, name: str) -> bool:
        if not self._db.has_table("schedules"):
            return False
        with self._db.write() as tx:
            return bool(tx.execute("DELETE FROM schedules WHERE name = ?", (name,)).rowcount)

    def replace(self, schedule: Schedule, *, expected: Schedule) -> bool:
        # Compared whole, not by its next fire alone: a schedule removed and added again
        # under the name while a pause was under way has the same next fire when its rule
        # is the same and not yet due, and the pause would write the removed one back.
        return self._rewrite(schedule.name, lambda stored: schedule if stored == expected else None)

    def move_on(self, fired: Schedule, *, next_fire: datetime, last_run: str) -> bool:
        def moved(stored: Schedule) -> Schedule | None:
            # Whether it is paused is the pause's and the resume's to say: a pause that
            # landed while the fire started its run is kept, not written back to what the
            # fire read. Anything else changed (a resume sets the next fire; another worker
            # moved it on; a new schedule of the name) leaves this fire nothing to move.
            if stored.model_copy(update={"paused": fired.paused}) != fired:
                return None
            return stored.model_copy(update={"next_fire": next_fire, "last_run": last_run})

        return self._rewrite(fired.name, moved)

    def _rewrite(self, name: str, change: Callable[[Schedule], Schedule | None]) -> bool:
        """Write `change` of the stored schedule, read in the same write transaction (which
        holds SQLite's write lock from its first statement, so nothing lands between the read
        and the write); False, and nothing written, if there is none or `change` says None."""
        if not self._db.has_table("schedules"):
            return False
        with self._db.write() as tx:
            row = tx.execute("SELECT record FROM schedules WHERE name = ?", (name,)).fetchone()
            changed = change(self._schedule(name, row[0])) if row else None
            if changed is None:
                return False
            tx.execute(
                "UPDATE schedules SET next_fire = ?, paused = ?, record = ? WHERE name = ?",
                (_stamp(changed.next_fire), changed.paused, self._sealed(changed), name),
            )
        return True

    def _sealed(self, schedule: Schedule) -> str:
        return sealed_text(
            schedule.model_dump_json(), self._codec, part="schedule", run_id=schedule.name
        )

    def _schedule(self, name: str, record: str) -> Schedule:
        return Schedule.model_validate_json(
            open_sealed_text(record, self._codec, part="schedule", run_id=name)
        )


def _stamp(moment: datetime) -> str:
    """A UTC time of fixed width, so that the text sorts as the time does."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

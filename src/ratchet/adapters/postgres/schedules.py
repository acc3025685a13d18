"""`ratchet.schedules.ScheduleBook` in a Postgres store: a row per schedule, its JSON and its
next fire; every change after the add reads the row locked (`FOR UPDATE`) and writes it only if
it is still the schedule its caller read (a fire: but for whether it is paused), in one
transaction, so of the workers on any machines that fire the same time one moves it (the run
they start is the same one: its id derives from the fire), and a pause, resume or removal that
answered stays done. With a codec, each record is sealed as a local store's is
(`ratchet.adapters.sqlite.schedules`); one written in clear before the codec reads as it is."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.schedules import Schedule
from ratchet.sealing import PayloadCodec
from ratchet.stored import open_sealed_text, sealed_text


class PostgresScheduleBook:
    def __init__(self, db: PostgresDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        # Seals each schedule's record (the input and params its runs start with), bound to
        # its name; what a worker selects on (its next fire, whether it is paused) stays in
        # its own columns.
        self._codec = codec

    def add(self, schedule: Schedule) -> bool:
        with self._db.write() as tx:
            inserted = tx.execute(
                "INSERT INTO schedules (name, next_fire, paused, record) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (name) DO NOTHING",
                (
                    schedule.name,
                    schedule.next_fire,
                    schedule.paused,
                    self._sealed(schedule),
                ),
            ).rowcount
        return bool(inserted)

    def get(self, name: str) -> Schedule | None:
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT name, record FROM schedules WHERE name = %s", (name,)
            ).fetchone()
        return self._schedule(*row) if row else None

    def all(self) -> list[Schedule]:
        with self._db.read() as tx:
            rows = tx.execute("SELECT name, record FROM schedules ORDER BY name").fetchall()
        return [self._schedule(name, record) for name, record in rows]

    def due(self, now: datetime) -> list[Schedule]:
        """One read of the rows due (what a worker makes every second): not every schedule."""
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT name, record FROM schedules "
                "WHERE NOT paused AND next_fire <= %s ORDER BY name",
                (now,),
            ).fetchall()
        return [self._schedule(name, record) for name, record in rows]

    def remove(self, name: str) -> bool:
        with self._db.write() as tx:
            return bool(tx.execute("DELETE FROM schedules WHERE name = %s", (name,)).rowcount)

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
        """Write `change` of the stored schedule, read locked in the same transaction (a
        second writer's read waits for this one's commit, then reads what it wrote); False,
        and nothing written, if there is none or `change` says None."""
        with self._db.write() as tx:
            row = tx.execute(
                "SELECT record FROM schedules WHERE name = %s FOR UPDATE", (name,)
            ).fetchone()
            changed = change(self._schedule(name, row[0])) if row else None
            if changed is None:
                return False
            tx.execute(
                "UPDATE schedules SET next_fire = %s, paused = %s, record = %s WHERE name = %s",
                (changed.next_fire, changed.paused, self._sealed(changed), name),
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

"""The events sent to runs, in the local SQLite store: one row per event id, in order of
arrival. The checkpoint store's commit consumes one (`Commit.consumes`) in the write that
settles the wait it answers."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from ratchet.adapters.sqlite.database import WAITS_SCHEMA, SqliteDatabase
from ratchet.sealing import PayloadCodec
from ratchet.stored import open_record_text, sealed_record_text
from ratchet.waits import MAX_MAILBOX_EVENTS, SentEvent, mailbox_full

_COLUMNS = "record, consumed_step, refused"


class SqliteMailbox:
    def __init__(self, db: SqliteDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        self._codec = codec  # seals each event's record: its payload, who sent it
        if not db.read_only and not db.has_table("mailbox"):
            # A store made before events existed gets the tables on first use.
            db.connection.executescript(WAITS_SCHEMA)

    def post(self, event: SentEvent, *, reserved: Collection[str] = ()) -> tuple[SentEvent, bool]:
        with self._db.write() as tx:
            row = tx.execute(
                f"SELECT {_COLUMNS} FROM mailbox WHERE run_id = ? AND event_id = ?",
                (event.run_id, event.event_id),
            ).fetchone()
            if row is not None:
                return _event(row, self._codec), False
            # The room the event goes in: its name's own, or the one every other name shares.
            if event.name in reserved:
                room, argument = "name = ?", event.name
            else:
                room, argument = (
                    "name NOT IN (SELECT value FROM json_each(?))",
                    json.dumps(sorted(reserved)),
                )
            (pending,) = tx.execute(
                "SELECT COUNT(*) FROM mailbox WHERE run_id = ? AND consumed_step IS NULL "
                f"AND refused IS NULL AND {room}",
                (event.run_id, argument),
            ).fetchone()
            if pending >= MAX_MAILBOX_EVENTS:
                raise mailbox_full(event.run_id, event.name, pending, reserved=reserved)
            tx.execute(
                "INSERT INTO mailbox (run_id, event_id, name, record) VALUES (?, ?, ?, ?)",
                (
                    event.run_id,
                    event.event_id,
                    event.name,
                    sealed_record_text(
                        event.model_dump_json(exclude={"consumed_step", "refused"}),
                        self._codec,
                        part="mail",
                        run_id=event.run_id,
                    ),
                ),
            )
        return event, True

    def get(self, run_id: str, event_id: str) -> SentEvent | None:
        if not self._db.has_table("mailbox"):
            return None
        row = self._db.connection.execute(
            f"SELECT {_COLUMNS} FROM mailbox WHERE run_id = ? AND event_id = ?",
            (run_id, event_id),
        ).fetchone()
        return _event(row, self._codec) if row else None

    def of_run(self, run_id: str) -> list[SentEvent]:
        if not self._db.has_table("mailbox"):
            return []
        rows = self._db.connection.execute(
            f"SELECT {_COLUMNS} FROM mailbox WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
        return [_event(r, self._codec) for r in rows]

    def next_for(self, run_id: str, name: str) -> SentEvent | None:
        if not self._db.has_table("mailbox"):
            return None
        row = self._db.connection.execute(
            f"SELECT {_COLUMNS} FROM mailbox WHERE run_id = ? AND name = ? "
            "AND consumed_step IS NULL AND refused IS NULL ORDER BY seq LIMIT 1",
            (run_id, name),
        ).fetchone()
        return _event(row, self._codec) if row else None

    def refuse(self, run_id: str, event_id: str, reason: str) -> None:
        with self._db.write() as tx:
            tx.execute(
                "UPDATE mailbox SET refused = ? WHERE run_id = ? AND event_id = ? "
                "AND consumed_step IS NULL AND refused IS NULL",
                (reason, run_id, event_id),
            )


def _event(row: tuple[Any, ...], codec: PayloadCodec | None) -> SentEvent:
    record, consumed_step, refused = row
    opened = open_record_text(record, codec, part="mail")
    return SentEvent.model_validate_json(opened).model_copy(
        update={"consumed_step": consumed_step, "refused": refused}
    )

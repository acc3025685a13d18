"""The events sent to runs, in a Postgres store: one row per event id, in order of arrival.
The checkpoint store's commit consumes one (`Commit.consumes`) in the transaction that settles
the wait it answers."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ratchet.adapters.postgres.database import PostgresDatabase, notify_work
from ratchet.sealing import PayloadCodec
from ratchet.stored import open_record_text, sealed_record_text
from ratchet.waits import MAX_MAILBOX_EVENTS, SentEvent, mailbox_full

_COLUMNS = "record, consumed_step, refused"


class PostgresMailbox:
    def __init__(self, db: PostgresDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        self._codec = codec  # seals each event's record: its payload, who sent it

    def post(self, event: SentEvent, *, reserved: Collection[str] = ()) -> tuple[SentEvent, bool]:
        with self._db.write() as tx:
            # Posts to one run take turns (a lock on the run's mailbox, held to the end of the
            # transaction): the count below and the insert it allows must not interleave with
            # another sender's, or two senders that each counted one free place would both
            # take it. The next sender, let in, counts again and finds the first's event.
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"ratchet:mailbox:{event.run_id}",),
            )
            row = tx.execute(
                f"SELECT {_COLUMNS} FROM mailbox WHERE run_id = %s AND event_id = %s",
                (event.run_id, event.event_id),
            ).fetchone()
            if row is not None:
                return _event(row, self._codec), False
            # The room the event goes in: its name's own, or the one every other name shares.
            argument: object
            if event.name in reserved:
                room, argument = "name = %s", event.name
            else:
                room, argument = "name <> ALL(%s)", sorted(reserved)
            counted = tx.execute(
                "SELECT count(*) FROM mailbox WHERE run_id = %s AND consumed_step IS NULL "
                f"AND refused IS NULL AND {room}".encode(),
                (event.run_id, argument),
            ).fetchone()
            pending = counted[0] if counted else 0
            if pending >= MAX_MAILBOX_EVENTS:
                raise mailbox_full(event.run_id, event.name, pending, reserved=reserved)
            tx.execute(
                "INSERT INTO mailbox (run_id, event_id, name, record) VALUES (%s, %s, %s, %s)",
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
            # A waiting run's event: a worker settles its wait (`settle_waits`).
            notify_work(tx, event.run_id)
        return event, True

    def get(self, run_id: str, event_id: str) -> SentEvent | None:
        with self._db.read() as tx:
            row = tx.execute(
                f"SELECT {_COLUMNS} FROM mailbox WHERE run_id = %s AND event_id = %s",
                (run_id, event_id),
            ).fetchone()
        return _event(row, self._codec) if row else None

    def of_run(self, run_id: str) -> list[SentEvent]:
        with self._db.read() as tx:
            rows = tx.execute(
                f"SELECT {_COLUMNS} FROM mailbox WHERE run_id = %s ORDER BY seq", (run_id,)
            ).fetchall()
        return [_event(r, self._codec) for r in rows]

    def next_for(self, run_id: str, name: str) -> SentEvent | None:
        with self._db.read() as tx:
            row = tx.execute(
                f"SELECT {_COLUMNS} FROM mailbox WHERE run_id = %s AND name = %s "
                "AND consumed_step IS NULL AND refused IS NULL ORDER BY seq LIMIT 1",
                (run_id, name),
            ).fetchone()
        return _event(row, self._codec) if row else None

    def refuse(self, run_id: str, event_id: str, reason: str) -> None:
        with self._db.write() as tx:
            tx.execute(
                "UPDATE mailbox SET refused = %s WHERE run_id = %s AND event_id = %s "
                "AND consumed_step IS NULL AND refused IS NULL",
                (reason, run_id, event_id),
            )


def _event(row: tuple[Any, ...], codec: PayloadCodec | None) -> SentEvent:
    record, consumed_step, refused = row
    opened = open_record_text(record, codec, part="mail")
    return SentEvent.model_validate_json(opened).model_copy(
        update={"consumed_step": consumed_step, "refused": refused}
    )

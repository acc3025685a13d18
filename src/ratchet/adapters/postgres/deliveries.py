"""The webhooks' delivery record in a Postgres store (`ratchet deliveries`): the same book as
`ratchet.adapters.sqlite.deliveries`, whose docstring says what it keeps, for senders on many
hosts at once (every `ratchet worker` with `RATCHET_WEBHOOKS` sends).

What SQLite's single writer gives it, row locks give here, each write one transaction at READ
COMMITTED:

- `enqueue` moves a run's cursor with an `UPDATE ... WHERE version = <the one read>` (or the
  first cursor's `INSERT ... ON CONFLICT DO NOTHING`): of two senders that read the same change,
  the second waits on the first's row lock, then finds the cursor gone on and owes nothing, in
  the transaction that would have owed the deliveries, so none is owed twice.
- `claim` locks the delivery's row with `FOR UPDATE SKIP LOCKED`: a sender meeting a delivery
  another is claiming at that moment goes on to the next rather than waiting for it, and one
  that reads it after finds it held (`claimed_until`) or sent (`attempts` moved).

The tables are the store's (`ratchet.adapters.postgres.database`): `prepare` only marks where
the store's first sender starts. Times are the senders' clocks, in seconds since the epoch, as
the leases' are.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.sqlite.deliveries import CLAIM_SECONDS, Delivery, Moved, Owed
from ratchet.sealing import PayloadCodec
from ratchet.state import RunStatus
from ratchet.stored import open_sealed_text, sealed_text

_COLUMNS = (
    "delivery_id, change_id, run_id, url, body, state, attempts, created_at, next_at, "
    "answered_at, last_error"
)

_BEHIND = (
    "SELECT r.run_id, r.version, c.version, c.status FROM runs AS r "
    "LEFT JOIN push_cursors AS c ON c.run_id = r.run_id "
    "WHERE (c.version IS NULL OR r.version > c.version)"
)


class PostgresDeliveries:
    def __init__(
        self,
        db: PostgresDatabase,
        codec: PayloadCodec | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db = db
        self._ready = False
        # Seals each delivery's body (the run's status change, its summary or error), bound to
        # its run: the sender opens it to send it, `ratchet deliveries` to show it.
        self._codec = codec
        self._clock = clock

    def prepare(self) -> None:
        """Mark where the store's webhooks start, if no sender has yet: a sender does it
        before it starts, so that a run created just after is owed from its start."""
        if self._ready:
            return
        with self._db.write() as tx:
            # Two first senders at once: the second's insert waits on the first's row, then
            # finds it there, and marks nothing.
            first = tx.execute(
                "INSERT INTO push_start (one, started_at) VALUES (1, %s) "
                "ON CONFLICT (one) DO NOTHING",
                (self._clock(),),
            ).rowcount
            if first:
                tx.execute(
                    "INSERT INTO push_cursors (run_id, version, status) "
                    "SELECT run_id, version, status FROM runs ON CONFLICT (run_id) DO NOTHING"
                )
        self._ready = True

    def moved(self) -> list[Moved]:
        """The runs whose head is past their cursor."""
        self.prepare()
        with self._db.read() as tx:
            rows = tx.execute(_BEHIND).fetchall()
        return [
            Moved(run_id, version, cursor, RunStatus(status) if status else None)
            for run_id, version, cursor, status in rows
        ]

    def enqueue(
        self,
        moved: Moved,
        *,
        version: int,
        status: RunStatus,
        owed: Sequence[Owed],
    ) -> bool:
        """Owe each of `owed` and move the run's cursor to `version` (its status
        there `status`); False if another sender moved the cursor first (it owes them)."""
        now = self._clock()
        with self._db.write() as tx:
            # The cursor moves only from where `moved` read it, under its row's lock: a second
            # sender that read the same changes waits for the first's commit, then finds the
            # cursor gone on (or made), and owes nothing.
            if moved.cursor is None:
                taken = tx.execute(
                    "INSERT INTO push_cursors (run_id, version, status) VALUES (%s, %s, %s) "
                    "ON CONFLICT (run_id) DO NOTHING",
                    (moved.run_id, version, status.value),
                ).rowcount
            else:
                taken = tx.execute(
                    "UPDATE push_cursors SET version = %s, status = %s "
                    "WHERE run_id = %s AND version = %s",
                    (version, status.value, moved.run_id, moved.cursor),
                ).rowcount
            if not taken:
                return False
            if owed:
                with tx.cursor() as cursor:
                    cursor.executemany(
                        "INSERT INTO deliveries (delivery_id, change_id, run_id, url, body, "
                        "state, attempts, created_at, next_at, claimed_until) "
                        "VALUES (%s, %s, %s, %s, %s, 'pending', 0, %s, %s, 0) "
                        "ON CONFLICT (delivery_id) DO NOTHING",
                        [
                            (o.delivery_id, o.change_id, o.run_id, o.url, self._sealed(o), now, now)
                            for o in owed
                        ],
                    )
        return True

    def due(self, *, limit: int = 20) -> list[Delivery]:
        """Pending deliveries whose time has come and that no sender holds, oldest first."""
        self.prepare()
        now = self._clock()
        with self._db.read() as tx:
            rows = tx.execute(
                f"SELECT {_COLUMNS} FROM deliveries WHERE state = 'pending' AND next_at <= %s "
                "AND claimed_until <= %s ORDER BY next_at, created_at LIMIT %s",
                (now, now, limit),
            ).fetchall()
        return [self._delivery(row) for row in rows]

    def next_due(self) -> float | None:
        """When the next pending delivery is due (a Unix time), or None."""
        self.prepare()
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT min(greatest(next_at, claimed_until)) FROM deliveries "
                "WHERE state = 'pending'"
            ).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def owing(self, run_id: str | None = None, *, due_by: float | None = None) -> int:
        """How much (of one run) is still owed: pending deliveries (only those due by `due_by`,
        a Unix time, if given), and runs whose changes are not yet owed (each counts one). Zero
        once everything that moved was sent or given up."""
        self.prepare()
        pending, behind = "SELECT count(*) FROM deliveries WHERE state = 'pending'", _BEHIND
        pending_args: list[object] = []
        behind_args: list[object] = []
        if run_id is not None:
            pending, behind = f"{pending} AND run_id = %s", f"{behind} AND r.run_id = %s"
            pending_args.append(run_id)
            behind_args.append(run_id)
        if due_by is not None:
            pending = f"{pending} AND next_at <= %s"
            pending_args.append(due_by)
        # One snapshot: a delivery owed between the two counts is counted once, not never.
        with self._db.read() as tx:
            row = tx.execute(pending, pending_args).fetchone()
            runs = tx.execute(behind, behind_args).fetchall()
        return (int(row[0]) if row else 0) + len(runs)

    def claim(self, delivery: Delivery) -> bool:
        """Hold `delivery` for `CLAIM_SECONDS`; False if another sender sent or holds it."""
        now = self._clock()
        with self._db.write() as tx:
            # Conditional on the attempts read: a sender that read it before another sent it
            # (and counted the attempt) finds the count moved, and leaves it. SKIP LOCKED: a row
            # another sender is claiming now is its, and this one is not kept waiting for it.
            return bool(
                tx.execute(
                    "UPDATE deliveries SET claimed_until = %s WHERE delivery_id = ("
                    "SELECT delivery_id FROM deliveries WHERE delivery_id = %s "
                    "AND state = 'pending' AND attempts = %s AND claimed_until <= %s "
                    "FOR UPDATE SKIP LOCKED)",
                    (now + CLAIM_SECONDS, delivery.delivery_id, delivery.attempts, now),
                ).rowcount
            )

    def record(
        self, delivery: Delivery, *, delivered: bool, error: str | None, retry_at: float | None
    ) -> None:
        """Write how an attempt went: delivered; or failed, tried again at `retry_at` (None:
        given up)."""
        now = self._clock()
        state = "delivered" if delivered else "pending" if retry_at is not None else "failed"
        with self._db.write() as tx:
            tx.execute(
                "UPDATE deliveries SET state = %s, attempts = attempts + 1, next_at = %s, "
                "claimed_until = 0, answered_at = %s, last_error = %s WHERE delivery_id = %s",
                (
                    state,
                    retry_at if retry_at is not None else now,
                    now,
                    error,
                    delivery.delivery_id,
                ),
            )

    def listed(self, run_id: str | None = None, *, limit: int = 50) -> list[Delivery]:
        """The latest deliveries (of one run), newest first; none on a store that never sent."""
        where, args = ("WHERE run_id = %s", (run_id,)) if run_id else ("", ())
        with self._db.read() as tx:
            rows = tx.execute(
                f"SELECT {_COLUMNS} FROM deliveries {where} "
                "ORDER BY created_at DESC, delivery_id DESC LIMIT %s",
                (*args, limit),
            ).fetchall()
        return [self._delivery(row) for row in rows]

    def _sealed(self, owed: Owed) -> str:
        return sealed_text(owed.body, self._codec, part="delivery", run_id=owed.run_id)

    def _delivery(self, row: Sequence[object]) -> Delivery:
        delivery = Delivery(*row)  # type: ignore[arg-type]
        body = open_sealed_text(delivery.body, self._codec, part="delivery", run_id=delivery.run_id)
        return dataclasses.replace(delivery, body=body)

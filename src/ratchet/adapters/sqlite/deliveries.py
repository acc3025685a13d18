"""The local webhooks' delivery record: which status changes are owed to which URL, and how
each delivery went (`ratchet deliveries`).

Nothing is lost across a restart of the sender, because nothing is held in memory between
the two halves of its work, each its own transaction:

- `enqueue` reads each run whose head moved past its push cursor (`push_cursors`: the last
  version whose changes were owed, and the status there), and in one write transaction owes
  a delivery per change and URL and moves the cursor. The cursor moves only with the rows it
  owes, so a sender killed before the commit owes them again on its next start, and one
  killed after finds them owed.
- `due`, `claim` and `record` send what is owed: a delivery is claimed for `CLAIM_SECONDS`
  before it is sent, and its outcome is written after. A sender killed mid-send leaves the
  claim to lapse and the delivery to be sent again, with the same id (at least once).

The first sender on a store owes nothing for what was there before it (`push_start`): a
deployment that turns webhooks on is not sent the history of every run it has.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.sealing import PayloadCodec
from ratchet.state import RunStatus
from ratchet.stored import open_sealed_text, sealed_text

DELIVERIES_SCHEMA = """
-- ratchet.adapters.sqlite.deliveries keeps the webhooks' deliveries here.
CREATE TABLE IF NOT EXISTS push_start (
    one        INTEGER PRIMARY KEY CHECK (one = 1),
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS push_cursors (
    run_id  TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    status  TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS deliveries (
    delivery_id  TEXT PRIMARY KEY,
    change_id    TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    url          TEXT NOT NULL,
    body         TEXT NOT NULL,
    state        TEXT NOT NULL,
    attempts     INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    next_at      REAL NOT NULL,
    claimed_until REAL NOT NULL,
    answered_at  REAL,
    last_error   TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (state, next_at);
CREATE INDEX IF NOT EXISTS deliveries_by_run ON deliveries (run_id, created_at);
"""

CLAIM_SECONDS = 60.0
"""How long a sender holds a delivery it is sending: longer than a send's timeout."""


@dataclass(frozen=True)
class Delivery:
    delivery_id: str
    change_id: str
    run_id: str
    url: str
    body: str
    state: str
    """`pending` (owed, retried until `next_at`), `delivered` or `failed` (gave up)."""
    attempts: int
    created_at: float
    next_at: float
    answered_at: float | None
    last_error: str | None


@dataclass(frozen=True)
class Owed:
    """A delivery to owe: a change (its id and JSON body) to one URL."""

    delivery_id: str
    change_id: str
    run_id: str
    url: str
    body: str


@dataclass(frozen=True)
class Moved:
    """A run whose head moved past its push cursor."""

    run_id: str
    version: int
    cursor: int | None
    """The cursor's version (None: the run is new to the sender)."""
    status: RunStatus | None
    """The status at the cursor."""


_COLUMNS = (
    "delivery_id, change_id, run_id, url, body, state, attempts, created_at, next_at, "
    "answered_at, last_error"
)


class SqliteDeliveries:
    def __init__(
        self,
        db: SqliteDatabase,
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
        """Make the tables (the first sender on the store marks where it starts): a sender
        does it before it starts, so that a run created just after is owed from its start."""
        if self._ready:
            return
        with self._db.write() as tx:
            for statement in DELIVERIES_SCHEMA.split(";"):
                if statement.strip():
                    tx.execute(statement)
            # The first sender on the store starts from where every run stands now.
            first = tx.execute(
                "INSERT OR IGNORE INTO push_start (one, started_at) VALUES (1, ?)", (self._clock(),)
            ).rowcount
            if first:
                tx.execute(
                    "INSERT OR IGNORE INTO push_cursors (run_id, version, status) "
                    "SELECT run_id, version, status FROM runs"
                )
        self._ready = True

    def moved(self) -> list[Moved]:
        """The runs whose head is past their cursor."""
        self.prepare()
        rows = self._db.connection.execute(
            "SELECT r.run_id, r.version, c.version, c.status FROM runs AS r "
            "LEFT JOIN push_cursors AS c ON c.run_id = r.run_id "
            "WHERE c.version IS NULL OR r.version > c.version"
        ).fetchall()
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
            # The cursor moves only from where `moved` read it: two senders that read the
            # same changes owe them once, the second finding the cursor gone on.
            if moved.cursor is None:
                taken = tx.execute(
                    "INSERT OR IGNORE INTO push_cursors (run_id, version, status) VALUES (?, ?, ?)",
                    (moved.run_id, version, status.value),
                ).rowcount
            else:
                taken = tx.execute(
                    "UPDATE push_cursors SET version = ?, status = ? "
                    "WHERE run_id = ? AND version = ?",
                    (version, status.value, moved.run_id, moved.cursor),
                ).rowcount
            if not taken:
                return False
            tx.executemany(
                "INSERT OR IGNORE INTO deliveries (delivery_id, change_id, run_id, url, body, "
                "state, attempts, created_at, next_at, claimed_until) "
                "VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, ?, 0)",
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
        rows = self._db.connection.execute(
            f"SELECT {_COLUMNS} FROM deliveries WHERE state = 'pending' AND next_at <= ? "
            "AND claimed_until <= ? ORDER BY next_at, created_at LIMIT ?",
            (now, now, limit),
        ).fetchall()
        return [self._delivery(row) for row in rows]

    def next_due(self) -> float | None:
        """When the next pending delivery is due (a Unix time), or None."""
        self.prepare()
        (at,) = self._db.connection.execute(
            "SELECT min(max(next_at, claimed_until)) FROM deliveries WHERE state = 'pending'"
        ).fetchone()
        return float(at) if at is not None else None

    def owing(self, run_id: str | None = None, *, due_by: float | None = None) -> int:
        """How much (of one run) is still owed: pending deliveries (only those due by `due_by`,
        a Unix time, if given), and runs whose changes are not yet owed (each counts one). Zero
        once everything that moved was sent or given up."""
        self.prepare()
        (pending,) = self._db.connection.execute(
            "SELECT count(*) FROM deliveries WHERE state = 'pending' AND (? IS NULL OR run_id = ?) "
            "AND (? IS NULL OR next_at <= ?)",
            (run_id, run_id, due_by, due_by),
        ).fetchone()
        (behind,) = self._db.connection.execute(
            "SELECT count(*) FROM runs AS r LEFT JOIN push_cursors AS c ON c.run_id = r.run_id "
            "WHERE (c.version IS NULL OR r.version > c.version) AND (? IS NULL OR r.run_id = ?)",
            (run_id, run_id),
        ).fetchone()
        return int(pending) + int(behind)

    def claim(self, delivery: Delivery) -> bool:
        """Hold `delivery` for `CLAIM_SECONDS`; False if another sender sent or holds it."""
        now = self._clock()
        with self._db.write() as tx:
            # Conditional on the attempts read: a sender that read it before another sent it
            # (and counted the attempt) finds the count moved, and leaves it.
            return bool(
                tx.execute(
                    "UPDATE deliveries SET claimed_until = ? WHERE delivery_id = ? "
                    "AND state = 'pending' AND attempts = ? AND claimed_until <= ?",
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
                "UPDATE deliveries SET state = ?, attempts = attempts + 1, next_at = ?, "
                "claimed_until = 0, answered_at = ?, last_error = ? WHERE delivery_id = ?",
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
        connection = self._db.connection
        # Read, never made here: a store no sender ever ran on has no table (and a reader
        # writes nothing). The store's errors are Ratchet's, so the table is looked up first.
        made = connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'deliveries'"
        ).fetchone()
        if made is None:
            return []
        where, args = ("WHERE run_id = ?", (run_id,)) if run_id else ("", ())
        rows = connection.execute(
            f"SELECT {_COLUMNS} FROM deliveries {where} "
            "ORDER BY created_at DESC, delivery_id DESC LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [self._delivery(row) for row in rows]

    def _sealed(self, owed: Owed) -> str:
        return sealed_text(owed.body, self._codec, part="delivery", run_id=owed.run_id)

    def _delivery(self, row: Sequence[object]) -> Delivery:
        delivery = Delivery(*row)  # type: ignore[arg-type]
        body = open_sealed_text(delivery.body, self._codec, part="delivery", run_id=delivery.run_id)
        return dataclasses.replace(delivery, body=body)

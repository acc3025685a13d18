"""The checkpoint store on Postgres: each run's head (its changing part in `runs`, its static
part in `run_static`) and one immutable record per commit (`checkpoints`). A commit's version
check and its writes share one transaction: all of it lands, or none.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ratchet import stored
from ratchet.adapters.postgres.database import PostgresDatabase, notify_work
from ratchet.adapters.postgres.ledger import COMPLETION_SQL, completion
from ratchet.adapters.sqlite.database import RUN_STATUSES, check_size
from ratchet.errors import RunNotFound, RunUnreadable, StaleVersion
from ratchet.ports import Commit, CommitReceipt, OpenWait, RunCursor, RunSummary
from ratchet.sealing import PayloadCodec
from ratchet.state import CheckpointEvent, RunState, RunStatus, StoredCheckpoint

if TYPE_CHECKING:
    import psycopg


def _first_line(error: Exception) -> str:
    """What went wrong, in one line and without the stored text (pydantic quotes its input)."""
    if isinstance(error, ValidationError):
        first = error.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    return " ".join(str(error).split())[:200]


def _text_bytes(*values: str | None) -> int:
    return sum(len(v.encode("utf-8")) for v in values if v is not None)


class PostgresCheckpointStore:
    """`codec`, when given, seals what runs' records say of the world (`ratchet.stored`)."""

    def __init__(self, db: PostgresDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        self._codec = codec

    def create_run(self, state: RunState, checkpoint: StoredCheckpoint) -> bool:
        state_json = stored.head_json(state, self._codec)
        static_json = stored.static_json(state, self._codec)
        event_json = stored.event_json(checkpoint, self._codec)
        check_size(f"run {state.run_id} head", state_json)
        check_size(f"run {state.run_id} static state", static_json)
        check_size(f"run {state.run_id} checkpoint", event_json)
        with self._db.write() as tx:
            # Of two creators of one run id, the second's insert waits for the first's
            # transaction and then does nothing: the first run stands, whole.
            inserted = tx.execute(
                "INSERT INTO runs (run_id, version, status, step, attempts, state, updated_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING",
                (
                    state.run_id,
                    state.version,
                    state.status.value,
                    state.step,
                    state.attempts,
                    state_json,
                    state.updated_at,
                ),
            ).rowcount
            if inserted:
                tx.execute(
                    "INSERT INTO run_static (run_id, state) VALUES (%s, %s) "
                    "ON CONFLICT (run_id) DO UPDATE SET state = excluded.state",
                    (state.run_id, static_json),
                )
                other = _text_bytes(state_json, static_json)
                record, _ = _record_row(checkpoint, event_json, other)
                tx.execute(f"{_RECORD_INSERT} VALUES ({_RECORD_VALUES})", record)
                if state.status is RunStatus.WAITING:
                    _book_wait(tx, state)  # a fork of a waiting run waits too
                elif state.status is RunStatus.RUNNING:
                    notify_work(tx, state.run_id)
        return bool(inserted)

    def load_head(self, run_id: str) -> RunState | None:
        """The head, its static part and the records of its window, in one snapshot (see
        `ratchet.stored`)."""
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT r.version, r.attempts, r.step, r.state, s.state, r.status "
                "FROM runs AS r LEFT JOIN run_static AS s ON s.run_id = r.run_id "
                "WHERE r.run_id = %s",
                (run_id,),
            ).fetchone()
            if row is None:
                return None
            version, attempts, step, state_json, static_json, status = row
            if status not in RUN_STATUSES:
                # The column a worker claims by and a list shows, tampered: never shown as it
                # is, and never written over as if it were a status.
                raise RunUnreadable(
                    run_id, "its stored state is damaged (column 'status' holds no run status)"
                )
            try:
                state = stored.load_head(
                    state_json, static_json, version=version, attempts=attempts, codec=self._codec
                )
            except (ValueError, TypeError) as error:
                raise RunUnreadable(
                    run_id, f"its stored state is damaged ({_first_line(error)})"
                ) from None
            return stored.with_window(state, self._window(tx, run_id, step, state))

    def _window(
        self, tx: psycopg.Connection[Any], run_id: str, step: int, state: RunState
    ) -> list[CheckpointEvent]:
        """The records of the window's steps, oldest first: read newest first, a page at a
        time, until a record before the window (or the first record)."""
        if step == 0:
            return []  # no step yet: no window
        first = stored.window_start(state)
        page = stored.window_reads(state.options.memory_window)
        found: list[CheckpointEvent] = []
        below = state.version + 1
        while True:
            rows = tx.execute(
                "SELECT version, step, event FROM checkpoints WHERE run_id = %s "
                "AND version < %s ORDER BY version DESC LIMIT %s",
                (run_id, below, page),
            ).fetchall()
            for version, record_step, event in rows:
                if record_step < first:
                    return found[::-1]
                try:
                    found.append(
                        stored.parse_event(
                            event, run_id=run_id, step=record_step, codec=self._codec
                        )
                    )
                except ValueError as error:
                    raise RunUnreadable(
                        run_id, f"its checkpoint {version} is damaged ({_first_line(error)})"
                    ) from None
                below = version
            if len(rows) < page:
                return found[::-1]

    def begin_attempt(self, run_id: str, expected_version: int) -> int:
        # One conditional statement, a transaction of its own: a stale one changes nothing,
        # and the read that tells a missing run from a moved one is a statement after it (as
        # it was a new statement, with its own snapshot, in a transaction at READ COMMITTED).
        with self._db.autocommit() as tx:
            changed = tx.execute(
                "UPDATE runs SET attempts = attempts + 1, version = version + 1 "
                "WHERE run_id = %s AND version = %s",
                (run_id, expected_version),
            ).rowcount
            if not changed:
                _raise_stale(tx, run_id, expected_version)
        return expected_version + 1

    def release_attempt(self, run_id: str, expected_version: int) -> int:
        with self._db.autocommit() as tx:  # as begin_attempt
            changed = tx.execute(
                "UPDATE runs SET attempts = attempts - 1, version = version + 1 "
                "WHERE run_id = %s AND version = %s AND attempts > 0",
                (run_id, expected_version),
            ).rowcount
            if not changed:
                _raise_stale(tx, run_id, expected_version)
        return expected_version + 1

    def commit(self, commit: Commit) -> CommitReceipt:
        started = time.perf_counter()
        head = commit.head
        state_json = stored.head_json(head, self._codec)
        event_json = stored.event_json(commit.checkpoint, self._codec)
        check_size(f"run {head.run_id} head", state_json)
        check_size(f"run {head.run_id} step {commit.checkpoint.step} record", event_json)
        result = commit.completes.result if commit.completes else None
        if result is not None:
            check_size(f"ledger result of {commit.completes.key}", result)  # type: ignore[union-attr]
        record, record_bytes = _record_row(
            commit.checkpoint, event_json, _text_bytes(state_json, result)
        )
        written = _text_bytes(state_json, result) + record_bytes
        moving = {
            "version": head.version,
            "step": head.step,
            "attempts": head.attempts,
            "state": state_json,
            "updated_at": head.updated_at,
            "status": head.status.value,
            "run_id": head.run_id,
            "expected_version": commit.expected_version,
            **record,
            **(completion(commit.completes.key, result) if commit.completes else {}),
        }
        completes = commit.completes is not None
        if commit.consumes is None:
            # Most commits (a running run's step) leave the status as it was: then nothing
            # changes but the head, the record and the ledger's key, all in one statement,
            # which is a transaction of its own (one round trip, not five). One that would
            # change the status, or finds the version moved, writes nothing here and is
            # made again by the transaction below, which books what the status change asks.
            with self._db.autocommit() as tx:
                if tx.execute(_commit_sql(completes, same_status=True), moving).fetchone():
                    return CommitReceipt(written, (time.perf_counter() - started) * 1000)
        with self._db.write() as tx:
            row = tx.execute(_commit_sql(completes, same_status=False), moving).fetchone()
            if row is None:
                _raise_stale(tx, head.run_id, commit.expected_version)
            (stored_status,) = row  # type: ignore[misc]  # not None: _raise_stale raised
            if stored_status != head.status.value:
                # The book of open waits changes with the status: a run parks or goes on.
                if head.status is RunStatus.WAITING:
                    _book_wait(tx, head)
                elif stored_status == RunStatus.WAITING.value:
                    tx.execute("DELETE FROM open_waits WHERE run_id = %s", (head.run_id,))
                if head.status is RunStatus.RUNNING:
                    # A run that goes on again (a decision, a settled wait, a retry) is work
                    # for whichever worker is free; a step's own commit wakes no one, its
                    # worker goes on with the run.
                    notify_work(tx, head.run_id)
            if commit.consumes is not None:
                # The event this commit settles a wait with leaves the mailbox in the same
                # transaction, and only if it was still there: it is taken once, never twice
                # (raising rolls the head's update and the record back with it).
                taken = tx.execute(
                    "UPDATE mailbox SET consumed_step = %s WHERE run_id = %s AND event_id = %s "
                    "AND consumed_step IS NULL AND refused IS NULL",
                    (commit.consumes.step, head.run_id, commit.consumes.event_id),
                ).rowcount
                if not taken:
                    raise StaleVersion(head.run_id, commit.expected_version)
        return CommitReceipt(written, (time.perf_counter() - started) * 1000)

    def list_checkpoints(self, run_id: str, *, after: int = 0) -> list[StoredCheckpoint]:
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT version, step, status, worker_id, bytes, created_at, event "
                "FROM checkpoints WHERE run_id = %s AND version > %s ORDER BY version",
                (run_id, after),
            ).fetchall()
        return self._checkpoints(run_id, rows)

    def last_checkpoints(self, run_id: str, *, limit: int) -> list[StoredCheckpoint]:
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT version, step, status, worker_id, bytes, created_at, event "
                "FROM checkpoints WHERE run_id = %s ORDER BY version DESC LIMIT %s",
                (run_id, limit),
            ).fetchall()
        return self._checkpoints(run_id, rows[::-1])

    def _checkpoints(self, run_id: str, rows: list[Any]) -> list[StoredCheckpoint]:
        checkpoints = []
        for version, step, status, worker_id, size, created_at, event in rows:
            try:
                checkpoints.append(
                    StoredCheckpoint(
                        run_id=run_id,
                        version=version,
                        step=step,
                        status=RunStatus(status),
                        worker_id=worker_id,
                        size=size,
                        created_at=created_at,
                        event=stored.parse_event(
                            event, run_id=run_id, step=step, codec=self._codec
                        ),
                    )
                )
            except (ValueError, TypeError) as error:
                raise RunUnreadable(
                    run_id, f"its checkpoint {version} is damaged ({_first_line(error)})"
                ) from None
        return checkpoints

    def list_runs(self) -> list[RunSummary]:
        return self._summaries("FROM runs AS r ORDER BY r.updated_at, r.run_id", ())

    def list_page(
        self, *, status: str | None = None, limit: int, after: RunCursor | None = None
    ) -> list[RunSummary]:
        """A page of runs, the most recently changed first (ties by id), from the index on
        the time of their last change."""
        where: list[str] = []
        parameters: list[object] = []
        if status is not None:
            where.append("r.status = %s")
            parameters.append(status)
        if after is not None:
            where.append("(r.updated_at, r.run_id) < (%s, %s)")
            parameters += [after.updated_at, after.run_id]
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        return self._summaries(
            f"FROM runs AS r {clause}ORDER BY r.updated_at DESC, r.run_id DESC LIMIT %s",
            (*parameters, limit),
        )

    def _summaries(self, source: str, parameters: tuple[object, ...]) -> list[RunSummary]:
        """The summaries of the runs `source` (a FROM clause naming `runs AS r`) selects,
        each with the damage its row shows (one run's damaged row must not hide the others)."""
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT r.run_id, r.status, r.step, r.version, r.updated_at, r.state, "
                "(SELECT s.state FROM run_static AS s WHERE s.run_id = r.run_id) "
                f"{source}",
                parameters,
            ).fetchall()
        runs = []
        for run_id, status, step, version, updated_at, head, static_head in rows:
            damage = None if status in RUN_STATUSES else "column 'status' holds no run status"
            agent = None
            for column, text in (("state", head), ("run_static.state", static_head)):
                if text is None:
                    continue
                try:
                    parsed = json.loads(text)
                except ValueError:
                    damage = damage or f"column {column!r} holds no JSON"
                    continue
                if isinstance(parsed, dict) and isinstance(parsed.get("agent"), str):
                    agent = parsed["agent"]
            runs.append(
                RunSummary(run_id, status, step, version, updated_at, damage=damage, agent=agent)
            )
        return runs


_RECORD_COLUMNS = (
    "run_id",
    "version",
    "step",
    "status",
    "worker_id",
    "bytes",
    "created_at",
    "event",
)
_RECORD_INSERT = f"INSERT INTO checkpoints ({', '.join(_RECORD_COLUMNS)})"
_RECORD_VALUES = ", ".join(f"%(record_{column})s" for column in _RECORD_COLUMNS)


def _record_row(
    checkpoint: StoredCheckpoint, event_json: str, other_bytes: int
) -> tuple[dict[str, object], int]:
    """A checkpoint's row, as `_RECORD_VALUES`'s parameters, and the bytes of its own."""
    row_bytes = _text_bytes(
        checkpoint.run_id, checkpoint.worker_id, event_json, checkpoint.status.value
    )
    values = (
        checkpoint.run_id,
        checkpoint.version,
        checkpoint.step,
        checkpoint.status.value,
        checkpoint.worker_id,
        row_bytes + other_bytes,
        checkpoint.created_at,
        event_json,
    )
    return {f"record_{c}": v for c, v in zip(_RECORD_COLUMNS, values, strict=True)}, row_bytes


def _commit_sql(completes: bool, *, same_status: bool) -> str:
    """A commit's writes as one statement, each conditional on the head's: `moved` is the
    head's row if it was still at the expected version (and, with `same_status`, of the status
    the commit leaves it in), else nothing, and the ledger's key (completed: the record holds
    its decision from then on) and the record are written only from a row of `moved`. So a
    stale writer writes nothing at all, in one round trip.

    The UPDATE holds the head's row until the transaction ends: a second writer from the same
    version waits for it, then finds the version moved (no row changed) and is stale. Its
    RETURNING gives the status the row held, from the row as it was locked (a subquery on the
    same row, read before the update)."""
    status = " AND before.status = %(status)s" if same_status else ""
    completed = (
        f"completed AS ({COMPLETION_SQL} AND EXISTS (SELECT FROM moved)), " if completes else ""
    )
    return (
        "WITH moved AS (UPDATE runs AS r SET version = %(version)s, step = %(step)s, "
        "attempts = %(attempts)s, state = %(state)s, updated_at = %(updated_at)s, "
        "status = %(status)s FROM (SELECT run_id, status FROM runs "
        "WHERE run_id = %(run_id)s AND version = %(expected_version)s FOR UPDATE) AS before "
        f"WHERE r.run_id = before.run_id{status} RETURNING before.status), "
        f"{completed}"
        f"recorded AS ({_RECORD_INSERT} SELECT {_RECORD_VALUES} FROM moved) "
        "SELECT status FROM moved"
    )


def _raise_stale(tx: psycopg.Connection[Any], run_id: str, expected_version: int) -> None:
    if tx.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,)).fetchone() is None:
        raise RunNotFound(run_id)
    raise StaleVersion(run_id, expected_version)


def _book_wait(tx: psycopg.Connection[Any], head: RunState) -> None:
    """Enter the run's open wait in the book (`open_waits`): its kind, the event's name, and
    when it settles by itself (a timer's time, an event wait's timeout)."""
    waiting = head.waiting
    if waiting is None:
        return
    tx.execute(
        "INSERT INTO open_waits (run_id, step, kind, name, due_at) VALUES (%s, %s, %s, %s, %s) "
        "ON CONFLICT (run_id) DO UPDATE SET step = excluded.step, kind = excluded.kind, "
        "name = excluded.name, due_at = excluded.due_at",
        (
            head.run_id,
            waiting.step,
            waiting.kind,
            getattr(waiting.request, "name", None),
            waiting.due,
        ),
    )


_WAIT_COLUMNS = "w.run_id, w.step, w.kind, w.name, w.due_at"


class PostgresWaitBook:
    """The book of open waits, for a worker: which are due, which have their event."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    def due(self, now: datetime) -> list[OpenWait]:
        """Waits that settle by themselves by `now`: timers come due, event waits timed out."""
        return self._waits(
            f"SELECT {_WAIT_COLUMNS} FROM open_waits AS w "
            "WHERE w.due_at IS NOT NULL AND w.due_at <= %s ORDER BY w.due_at",
            (now,),
        )

    def answered(self) -> list[OpenWait]:
        """Event waits whose mailbox holds a pending event of their name."""
        # From the pending events (few: most are taken the moment they arrive) to the waits
        # they answer, so the sweep's cost follows the mailbox, not the number of waiting runs.
        return self._waits(
            f"SELECT DISTINCT {_WAIT_COLUMNS} FROM mailbox AS m "
            "JOIN open_waits AS w ON w.run_id = m.run_id AND w.name = m.name "
            "WHERE m.consumed_step IS NULL AND m.refused IS NULL AND w.kind = 'event'",
            (),
        )

    def children(self) -> list[OpenWait]:
        """Runs waiting for their child runs."""
        return self._waits(
            f"SELECT {_WAIT_COLUMNS} FROM open_waits AS w WHERE w.kind = 'children'", ()
        )

    def next_due(self) -> datetime | None:
        """When the first wait settles by itself, if one does."""
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT min(due_at) FROM open_waits WHERE due_at IS NOT NULL"
            ).fetchone()
        return row[0] if row else None

    def _waits(self, sql: str, parameters: tuple[object, ...]) -> list[OpenWait]:
        with self._db.read() as tx:
            rows = tx.execute(sql.encode(), parameters).fetchall()
        return [
            OpenWait(run_id=run_id, step=step, kind=kind, name=name, due_at=due_at)
            for run_id, step, kind, name, due_at in rows
        ]

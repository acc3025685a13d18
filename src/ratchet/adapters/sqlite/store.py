"""The checkpoint store on SQLite: each run's head (its changing part in `runs`, its static
part in `run_static`) and one immutable record per commit (`checkpoints`), in the file
`SqliteDatabase` opens. A commit's version check and its writes share one write transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ratchet import stored
from ratchet.adapters.sqlite.database import RUN_STATUSES, RowTexts, SqliteDatabase, check_size
from ratchet.adapters.sqlite.ledger import COMPLETION_SQL
from ratchet.errors import RunNotFound, RunUnreadable, StaleVersion, StoreDamaged
from ratchet.ports import Commit, CommitReceipt, LedgerStatus, OpenWait, RunCursor, RunSummary
from ratchet.sealing import PayloadCodec
from ratchet.state import CheckpointEvent, RunState, RunStatus, StoredCheckpoint


def _first_line(error: Exception) -> str:
    """What went wrong, in one line and without the stored text (pydantic quotes its input)."""
    if isinstance(error, ValidationError):
        first = error.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    return " ".join(str(error).split())[:200]


@contextmanager
def _damage_of(run_id: str, what: str) -> Iterator[None]:
    """A damaged row read for one run is that run's damage (`RunUnreadable`, naming it), not
    the whole store's: the other runs go on."""
    try:
        yield
    except StoreDamaged as error:
        raise RunUnreadable(run_id, f"{what} ({error.detail})") from None


def _text_bytes(*values: str | None) -> int:
    return sum(len(v.encode("utf-8")) for v in values if v is not None)


class SqliteCheckpointStore:
    """`codec`, when given, seals what runs' records say of the world (`ratchet.stored`)."""

    def __init__(self, db: SqliteDatabase, codec: PayloadCodec | None = None) -> None:
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
            inserted = tx.execute(
                "INSERT INTO runs (run_id, version, status, step, attempts, state, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                (
                    state.run_id,
                    state.version,
                    state.status.value,
                    state.step,
                    state.attempts,
                    state_json,
                    state.updated_at.isoformat(),
                ),
            ).rowcount
            if inserted:
                tx.execute(
                    "INSERT INTO run_static (run_id, state) VALUES (?, ?) "
                    "ON CONFLICT (run_id) DO UPDATE SET state = excluded.state",
                    (state.run_id, static_json),
                )
                other = _text_bytes(state_json, static_json)
                self._insert_checkpoint(tx, checkpoint, event_json, other)
                if state.status is RunStatus.WAITING:
                    _book_wait(tx, state)  # a fork of a waiting run waits too
        return bool(inserted)

    def load_head(self, run_id: str) -> RunState | None:
        """The head, its static part and the records of its window, in one read transaction
        (see `ratchet.stored`)."""
        connection = self._db.connection
        with self._db.read():
            with _damage_of(run_id, "its stored state is damaged"):
                row = connection.execute(
                    "SELECT r.version, r.attempts, r.step, r.state, s.state, r.status "
                    "FROM runs AS r LEFT JOIN run_static AS s ON s.run_id = r.run_id "
                    "WHERE r.run_id = ?",
                    (run_id,),
                ).fetchone()
            if row is None:
                return None
            version, attempts, step, state_json, static_json, status = row
            if status not in RUN_STATUSES:
                # The column a worker claims by and a list shows, tampered: never shown as it
                # is (it may hold anything), and never written over as if it were a status.
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
            with _damage_of(run_id, "its step records are damaged"):
                return stored.with_window(state, self._window(run_id, step, state))

    def _window(self, run_id: str, step: int, state: RunState) -> list[CheckpointEvent]:
        """The records of the window's steps, oldest first: read newest first, a page at a
        time, until a record before the window (or the first record)."""
        if step == 0:
            return []  # no step yet: no window
        first = stored.window_start(state)
        page = stored.window_reads(state.options.memory_window)
        found: list[CheckpointEvent] = []
        below = None
        while True:
            rows = self._db.connection.execute(
                "SELECT version, step, event FROM checkpoints WHERE run_id = ? AND version < ? "
                "ORDER BY version DESC LIMIT ?",
                (run_id, below if below is not None else state.version + 1, page),
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
        # Not synced: a process that dies after this leaves the count in the WAL, which is
        # what three strikes need; the step syncs it with its next commit (the decision's,
        # before its tool runs), so only a power cut before then can take it back, and that
        # death was not the step's. Syncing it would be a third fsync a step.
        with self._db.write(synced=False) as tx:
            changed = tx.execute(
                "UPDATE runs SET attempts = attempts + 1, version = version + 1 "
                "WHERE run_id = ? AND version = ?",
                (run_id, expected_version),
            ).rowcount
            if not changed:
                self._raise_stale(tx, run_id, expected_version)
        return expected_version + 1

    def release_attempt(self, run_id: str, expected_version: int) -> int:
        with self._db.write(synced=False) as tx:  # as begin_attempt's count
            changed = tx.execute(
                "UPDATE runs SET attempts = attempts - 1, version = version + 1 "
                "WHERE run_id = ? AND version = ? AND attempts > 0",
                (run_id, expected_version),
            ).rowcount
            if not changed:
                self._raise_stale(tx, run_id, expected_version)
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
        with self._db.write() as tx:
            # What the head's row holds now, read under the write lock: whether the status
            # column must change, and whether the run has its static row yet.
            stored_status, has_static = tx.execute(
                "SELECT r.status, s.run_id IS NOT NULL FROM runs AS r "
                "LEFT JOIN run_static AS s ON s.run_id = r.run_id WHERE r.run_id = ?",
                (head.run_id,),
            ).fetchone() or (None, True)
            # The version check and every write below share one transaction: either the
            # head was still at the version this worker read and all of it lands, or none.
            changed = tx.execute(
                "UPDATE runs SET version = ?, step = ?, attempts = ?, state = ?, updated_at = ? "
                "WHERE run_id = ? AND version = ?",
                (
                    head.version,
                    head.step,
                    head.attempts,
                    state_json,
                    head.updated_at.isoformat(),
                    head.run_id,
                    commit.expected_version,
                ),
            ).rowcount
            if not changed:
                self._raise_stale(tx, head.run_id, commit.expected_version)
            if not has_static:
                # A run made before schema 3 kept its whole head in runs.state, with no static
                # row: its first lean commit writes that row.
                tx.execute(
                    "INSERT INTO run_static (run_id, state) VALUES (?, ?)",
                    (head.run_id, stored.static_json(head, self._codec)),
                )
            if stored_status != head.status.value:
                # Apart, and only if it changed: setting the indexed status column rewrites
                # its index page even to the same value, one more page in the WAL a step.
                tx.execute(
                    "UPDATE runs SET status = ? WHERE run_id = ?",
                    (head.status.value, head.run_id),
                )
                # The book of open waits changes with the status: a run parks or goes on.
                if head.status is RunStatus.WAITING:
                    _book_wait(tx, head)
                elif stored_status == RunStatus.WAITING.value:
                    tx.execute("DELETE FROM open_waits WHERE run_id = ?", (head.run_id,))
            if commit.consumes is not None:
                # The event this commit settles a wait with leaves the mailbox in the same
                # write, and only if it was still there: it is taken once, never twice.
                taken = tx.execute(
                    "UPDATE mailbox SET consumed_step = ? WHERE run_id = ? AND event_id = ? "
                    "AND consumed_step IS NULL AND refused IS NULL",
                    (commit.consumes.step, head.run_id, commit.consumes.event_id),
                ).rowcount
                if not taken:
                    raise StaleVersion(head.run_id, commit.expected_version)
            written = _text_bytes(state_json, result)
            if commit.completes is not None:
                # The record below holds the step's decision: the ledger's copy goes.
                self._db.completing(tx)
                tx.execute(
                    COMPLETION_SQL, (LedgerStatus.COMPLETED.value, result, commit.completes.key)
                )
            written += self._insert_checkpoint(tx, commit.checkpoint, event_json, written)
        return CommitReceipt(written, (time.perf_counter() - started) * 1000)

    def list_checkpoints(self, run_id: str, *, after: int = 0) -> list[StoredCheckpoint]:
        with _damage_of(run_id, "its step records are damaged"):
            rows = self._db.connection.execute(
                "SELECT version, step, status, worker_id, bytes, created_at, event "
                "FROM checkpoints WHERE run_id = ? AND version > ? ORDER BY version",
                (run_id, after),
            ).fetchall()
        return self._checkpoints(run_id, rows)

    def last_checkpoints(self, run_id: str, *, limit: int) -> list[StoredCheckpoint]:
        with _damage_of(run_id, "its step records are damaged"):
            rows = self._db.connection.execute(
                "SELECT version, step, status, worker_id, bytes, created_at, event "
                "FROM checkpoints WHERE run_id = ? ORDER BY version DESC LIMIT ?",
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
                        created_at=datetime.fromisoformat(created_at),
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
        """Every run, each with the damage its row shows (text as bytes, decoded here: one
        run's damaged row must not hide the others). A damaged step record shows only when
        the run is read."""
        return self._summaries("FROM runs AS r ORDER BY r.updated_at", ())

    def list_page(
        self, *, status: str | None = None, limit: int, after: RunCursor | None = None
    ) -> list[RunSummary]:
        """One pass over the runs table (a row per run, never a step record), sorted. No
        index on `updated_at`: every step changes it, and keeping one would add a page (1 KiB)
        to each step's WAL writes (`bench.step_cost`: 12,419 B a step without, 13,467 B with)
        to speed a read that a local store, of thousands of runs, does in milliseconds."""
        where, parameters = [], []
        if status is not None:
            where.append("status = ?")
            parameters.append(status)
        if after is not None:
            stamp = after.updated_at.isoformat()
            where.append("(updated_at < ? OR (updated_at = ? AND run_id < ?))")
            parameters += [stamp, stamp, after.run_id]
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        # The page's ids first, sorted on two short columns; only its rows' heads are read.
        return self._summaries(
            f"FROM (SELECT run_id FROM runs {clause}ORDER BY updated_at DESC, run_id DESC "
            "LIMIT ?) AS page JOIN runs AS r USING (run_id) "
            "ORDER BY r.updated_at DESC, r.run_id DESC",
            (*parameters, limit),
        )

    def _summaries(self, source: str, parameters: tuple[object, ...]) -> list[RunSummary]:
        """The summaries of the runs `source` (a FROM clause naming `runs AS r`) selects."""
        connection = self._db.connection
        has_static = connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'run_static'"
        ).fetchone()
        static = (
            "(SELECT CAST(state AS BLOB) FROM run_static AS s WHERE s.run_id = r.run_id)"
            if has_static
            else "NULL"
        )
        rows = connection.execute(
            "SELECT CAST(r.run_id AS BLOB), CAST(r.status AS BLOB), r.step, r.version, "
            f"CAST(r.updated_at AS BLOB), CAST(r.state AS BLOB), {static} "
            f"{source}",
            parameters,
        ).fetchall()
        runs = []
        for run_id, status, step, version, updated_at, head, static_head in rows:
            texts = RowTexts()
            summary = RunSummary(
                texts.text("run_id", run_id),
                texts.status(status),
                step,
                version,
                texts.time("updated_at", updated_at),
            )
            parsed = texts.json("state", head)
            agent = parsed.get("agent") if isinstance(parsed, dict) else None
            key = None
            if static_head is not None:
                parsed_static = texts.json("run_static.state", static_head)
                if isinstance(parsed_static, dict):
                    agent = parsed_static.get("agent", agent)
                    key = parsed_static.get("concurrency_key")
            runs.append(
                replace(
                    summary,
                    damage=texts.damage,
                    agent=agent if isinstance(agent, str) else None,
                    concurrency_key=key if isinstance(key, str) else None,
                )
            )
        return runs

    @staticmethod
    def _insert_checkpoint(
        tx: sqlite3.Connection, checkpoint: StoredCheckpoint, event_json: str, other_bytes: int
    ) -> int:
        row_bytes = _text_bytes(
            checkpoint.run_id, checkpoint.worker_id, event_json, checkpoint.status.value
        )
        tx.execute(
            "INSERT INTO checkpoints (run_id, version, step, status, worker_id, bytes, "
            "created_at, event) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                checkpoint.run_id,
                checkpoint.version,
                checkpoint.step,
                checkpoint.status.value,
                checkpoint.worker_id,
                row_bytes + other_bytes,
                checkpoint.created_at.isoformat(),
                event_json,
            ),
        )
        return row_bytes

    @staticmethod
    def _raise_stale(tx: sqlite3.Connection, run_id: str, expected_version: int) -> None:
        exists = tx.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if exists is None:
            raise RunNotFound(run_id)
        raise StaleVersion(run_id, expected_version)


def _book_wait(tx: sqlite3.Connection, head: RunState) -> None:
    """Enter the run's open wait in the book (`open_waits`): its kind, the event's name, and
    when it settles by itself (a timer's time, an event wait's timeout)."""
    waiting = head.waiting
    if waiting is None:
        return
    name = getattr(waiting.request, "name", None)
    due = waiting.due
    tx.execute(
        "INSERT INTO open_waits (run_id, step, kind, name, due_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (run_id) DO UPDATE SET step = excluded.step, kind = excluded.kind, "
        "name = excluded.name, due_at = excluded.due_at",
        (head.run_id, waiting.step, waiting.kind, name, _instant(due) if due else None),
    )


def _instant(at: datetime) -> str:
    """A time as the book keeps it: UTC ISO 8601 with microseconds, so text order is time
    order."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SqliteWaitBook:
    """The local book of open waits, for a worker: which are due, which have their event."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    def due(self, now: datetime) -> list[OpenWait]:
        """Waits that settle by themselves by `now`: timers come due, event waits timed out."""
        if not self._db.has_table("open_waits"):
            return []
        rows = self._db.connection.execute(
            "SELECT run_id, step, kind, name, due_at FROM open_waits "
            "WHERE due_at IS NOT NULL AND due_at <= ? ORDER BY due_at",
            (_instant(now),),
        ).fetchall()
        return [_open_wait(row) for row in rows]

    def answered(self) -> list[OpenWait]:
        """Event waits whose mailbox holds a pending event of their name (sent while the
        run was not yet waiting, or by a sender that stopped before delivering it)."""
        if not self._db.has_table("open_waits"):
            return []
        # From the pending events (few: most are taken the moment they arrive) to the waits
        # they answer, so the sweep's cost follows the mailbox, not the number of waiting runs.
        rows = self._db.connection.execute(
            "SELECT DISTINCT w.run_id, w.step, w.kind, w.name, w.due_at FROM mailbox AS m "
            "CROSS JOIN open_waits AS w ON w.run_id = m.run_id AND w.name = m.name "
            "WHERE m.consumed_step IS NULL AND m.refused IS NULL AND w.kind = 'event'"
        ).fetchall()
        return [_open_wait(row) for row in rows]

    def children(self) -> list[OpenWait]:
        """Runs waiting for their child runs (whose ends tell them; the sweep checks these
        for an end that could not)."""
        if not self._db.has_table("open_waits"):
            return []
        rows = self._db.connection.execute(
            "SELECT run_id, step, kind, name, due_at FROM open_waits WHERE kind = 'children'"
        ).fetchall()
        return [_open_wait(row) for row in rows]

    def next_due(self) -> datetime | None:
        """When the first wait settles by itself, if one does."""
        if not self._db.has_table("open_waits"):
            return None
        row = self._db.connection.execute(
            "SELECT MIN(due_at) FROM open_waits WHERE due_at IS NOT NULL"
        ).fetchone()
        return datetime.fromisoformat(row[0]) if row and row[0] else None


def _open_wait(row: tuple[str, int, str, str | None, str | None]) -> OpenWait:
    run_id, step, kind, name, due_at = row
    return OpenWait(
        run_id=run_id,
        step=step,
        kind=kind,
        name=name,
        due_at=datetime.fromisoformat(due_at) if due_at else None,
    )

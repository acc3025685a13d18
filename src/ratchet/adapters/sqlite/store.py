"""The embedded store: checkpoints, heads and the idempotency ledger in one SQLite file.

WAL mode with `synchronous=FULL`: a commit is durable when it returns, and readers in other
processes never block the writer. Every write runs in `BEGIN IMMEDIATE`, which takes SQLite's
single write lock up front, so a version check and the writes that depend on it cannot
interleave with another process's.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from ratchet import stored
from ratchet.errors import (
    CheckpointTooLarge,
    IdempotencyConflict,
    RatchetError,
    RunNotFound,
    RunUnreadable,
    StaleVersion,
    StoreBusy,
    StoreDamaged,
    StoreUnavailable,
)
from ratchet.housekeeping import StoredHead, StoredRecord, Trimmed, blob_digests
from ratchet.ports import (
    MAX_ITEM_BYTES,
    Commit,
    CommitReceipt,
    LedgerEntry,
    LedgerStatus,
    RunSummary,
)
from ratchet.state import CheckpointEvent, RunState, RunStatus, StoredCheckpoint, utcnow

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id     TEXT PRIMARY KEY,
    version    INTEGER NOT NULL,
    status     TEXT NOT NULL,
    step       INTEGER NOT NULL,
    attempts   INTEGER NOT NULL,
    state      TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status);
-- The part of each run's head that no step changes (goal, options), written once: see
-- ratchet.stored. A run made before it existed keeps its whole head in runs.state.
CREATE TABLE IF NOT EXISTS run_static (
    run_id     TEXT PRIMARY KEY,
    state      TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    step       INTEGER NOT NULL,
    status     TEXT NOT NULL,
    worker_id  TEXT NOT NULL,
    bytes      INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    event      TEXT NOT NULL,
    PRIMARY KEY (run_id, version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency (
    key        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    step       INTEGER NOT NULL,
    status     TEXT NOT NULL,
    args_hash  TEXT NOT NULL,
    decision   TEXT NOT NULL,
    result     TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    run_id     TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
"""

APPROVALS_SCHEMA = """
-- ratchet.adapters.sqlite.approvals keeps the approval requests here.
CREATE TABLE IF NOT EXISTS approvals (
    approval_id TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    step        INTEGER NOT NULL,
    status      TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    record      TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS approvals_by_run ON approvals (run_id, step);
"""

RUN_DATA_SCHEMA = """
-- ratchet.adapters.sqlite.data keeps each run's own key-value data here.
CREATE TABLE IF NOT EXISTS run_data (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
"""

LEDGER_RETENTION = timedelta(days=30)


RATCHET_APPLICATION_ID = 0x52744368
"""`PRAGMA application_id` of a Ratchet store ("RtCh"): written when Ratchet makes the store,
so a SQLite file of another application is recognised and left alone."""

_RATCHET_TABLES = frozenset(
    {
        "runs",
        "run_static",
        "checkpoints",
        "idempotency",
        "leases",
        "approvals",
        "workers",
        "run_data",
    }
)
_RUNS_COLUMNS = ("run_id", "version", "status", "step", "attempts", "state", "updated_at")
DEFAULT_BUSY_TIMEOUT_SECONDS = 30.0
PAGE_SIZE = 1024
"""Bytes per page of a new store (SQLite's default is 4,096): see `SqliteDatabase`."""

# SQLite's primary result codes that say "not now" rather than "never": the disk was full or
# failed for a moment. Retrying later is safe: the transaction rolled back, nothing partial
# was written.
_TRANSIENT = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR}


class _Cursor(sqlite3.Cursor):
    """A cursor whose errors while stepping through rows are Ratchet's too: SQLite reads a
    row (and Python decodes its text) only when it is fetched, after `execute` returned.

    A fetch that fails closes the cursor first. Its statement would otherwise stay stepped,
    holding a read snapshot open on the connection for as long as anything (the error's
    traceback, a log record) keeps the cursor alive. The connection's next write would then
    fail at once with SQLITE_BUSY_SNAPSHOT as soon as another connection had written."""

    connection: _Connection

    def fetchone(self) -> Any:
        try:
            return super().fetchone()
        except sqlite3.DatabaseError as error:
            raise self._failed(error) from None

    def fetchall(self) -> list[Any]:
        try:
            return super().fetchall()
        except sqlite3.DatabaseError as error:
            raise self._failed(error) from None

    def fetchmany(self, size: int | None = 1) -> list[Any]:
        try:
            return super().fetchmany(size)
        except sqlite3.DatabaseError as error:
            raise self._failed(error) from None

    def _failed(self, error: sqlite3.DatabaseError) -> Exception:
        self.close()
        return self.connection.translated(error)

    def __next__(self) -> Any:
        try:
            return super().__next__()
        except sqlite3.DatabaseError as error:
            raise self._failed(error) from None


class _Connection(sqlite3.Connection):
    """A connection whose errors are Ratchet's: `StoreBusy` for what may pass, `StoreDamaged`
    for a row or page that cannot be read, otherwise `StoreUnavailable`. Nothing above the
    adapters sees a `sqlite3` error."""

    store_path: Path = Path()
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        try:
            cursor = self.cursor(_Cursor)
            return cursor.execute(sql, parameters)
        except sqlite3.DatabaseError as error:
            raise self.translated(error) from None

    def translated(self, error: sqlite3.DatabaseError) -> Exception:
        if isinstance(error, sqlite3.IntegrityError | sqlite3.ProgrammingError):
            return error
        return store_error(error, self.store_path, self.busy_timeout)

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        try:
            return super().executescript(sql_script)
        except sqlite3.DatabaseError as error:
            if isinstance(error, sqlite3.IntegrityError | sqlite3.ProgrammingError):
                raise
            raise store_error(error, self.store_path, self.busy_timeout) from None


def store_error(error: sqlite3.DatabaseError, path: Path, waited: float) -> RatchetError:
    """Ratchet's name for a SQLite failure: `StoreBusy` if it may pass, else `StoreUnavailable`."""
    code = getattr(error, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreBusy(
            f"the store {path} is busy: another process has held its lock for longer than "
            f"this command waits ({waited:g} s, RATCHET_BUSY_TIMEOUT_SECONDS); try again when "
            "that process is done"
        )
    if primary in _TRANSIENT:
        return StoreBusy(f"the store {path} failed for now: {error}")
    undecodable = _UNDECODABLE.match(str(error))
    if undecodable is not None:
        # Python's message quotes the stored text, which may be anything: name the column only.
        detail = f"column {undecodable[1]!r} holds text that is not UTF-8"
        return StoreDamaged(f"the store {path} has a damaged row: {detail}", detail=detail)
    if primary == sqlite3.SQLITE_CORRUPT:
        return StoreDamaged(f"the store {path} is damaged: {error}", detail=str(error))
    return StoreUnavailable(f"the store {path} cannot be used: {error}")


_UNDECODABLE = re.compile(r"Could not decode to UTF-8 column '([^']{0,64})'")
"""The error `sqlite3` raises for a text value that is not UTF-8 (it has no SQLite code)."""


class SqliteDatabase:
    """One connection to a Ratchet SQLite file, shared by the store, ledger and leases.

    A file is used only if it is a Ratchet store: marked with Ratchet's `application_id`, or
    made by an earlier Ratchet (Ratchet's tables only, `runs` of Ratchet's shape), which is then
    marked when opened to write. With `create`, a missing or empty file becomes a new store.
    Anything else is refused before a byte of it changes. A lock held longer than
    `busy_timeout` seconds is `StoreBusy`. The connection serves the thread that opened it;
    with `any_thread`, any thread, one at a time (the caller serialises: see `ratchet serve`)."""

    def __init__(
        self,
        path: Path,
        *,
        create: bool = True,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
        any_thread: bool = False,
    ) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        if not create and not path.exists():
            raise StoreUnavailable(f"no Ratchet store at {path} (start a run first)")
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.read_only = not create and not _writable(path)
        try:
            connection = sqlite3.connect(
                _read_only_uri(path) if self.read_only else path,
                isolation_level=None,
                timeout=busy_timeout,
                factory=_Connection,
                uri=self.read_only,
                check_same_thread=not any_thread,
            )
        except sqlite3.DatabaseError as error:
            raise StoreUnavailable(f"cannot use {path} as a Ratchet store: {error}") from None
        assert isinstance(connection, _Connection)
        connection.store_path = path
        connection.busy_timeout = busy_timeout
        self.connection: sqlite3.Connection = connection
        try:
            connection.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            marked = self._check_ownership(create=create)
            if create and not marked:
                # A new store: small pages, so that a step's two commits append little to the
                # WAL, which SQLite writes a whole page at a time (rows here are 0.1-2 KB).
                # Set before anything is written; an existing store keeps its own.
                connection.execute(f"PRAGMA page_size={PAGE_SIZE}")
            if not self.read_only:
                # Only now, knowing the file is ours: switching to WAL rewrites the file header.
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=FULL")
            if create:
                connection.executescript(_SCHEMA + APPROVALS_SCHEMA + RUN_DATA_SCHEMA)
                if not marked:
                    connection.execute(f"PRAGMA application_id={RATCHET_APPLICATION_ID}")
        except BaseException:
            connection.close()
            raise

    def _check_ownership(self, *, create: bool) -> bool:
        """Whether the file carries Ratchet's marker; `StoreUnavailable` if it is not a
        Ratchet store (nor, with `create`, an empty file that may become one)."""
        (application_id,) = self.connection.execute("PRAGMA application_id").fetchone()
        if application_id == RATCHET_APPLICATION_ID:
            return True
        if application_id != 0:
            raise StoreUnavailable(
                f"{self.path} is not a Ratchet store: it belongs to another application "
                f"(SQLite application_id {application_id:#x}); nothing was changed"
            )
        tables = {
            str(name)
            for (name,) in self.connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )
        }
        if not tables and create:
            return False
        foreign = sorted(tables - _RATCHET_TABLES)
        if foreign:
            raise StoreUnavailable(
                f"{self.path} is not a Ratchet store: it has tables of another application "
                f"({', '.join(foreign[:3])}); nothing was changed"
            )
        if "runs" not in tables:
            raise StoreUnavailable(f"{self.path} is not a Ratchet store")
        columns = tuple(str(row[1]) for row in self.connection.execute("PRAGMA table_info(runs)"))
        if columns != _RUNS_COLUMNS:
            raise StoreUnavailable(
                f"{self.path} is not a Ratchet store: its runs table is not Ratchet's "
                "(other columns); nothing was changed"
            )
        return False

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction holding SQLite's write lock from its first statement."""
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            yield self.connection
        except BaseException:
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every statement in it sees the same snapshot of the store (a
        head and the records of its window, say). Inside a write, the write's own."""
        if self.connection.in_transaction:
            yield self.connection
            return
        self.connection.execute("BEGIN")
        try:
            yield self.connection
        finally:
            if self.connection.in_transaction:
                self.connection.execute("COMMIT")

    def close(self) -> None:
        self.connection.close()


def _writable(path: Path) -> bool:
    """Whether this process may write the store: its file, and its folder (where SQLite makes
    the WAL's `-shm` and `-wal` files, even to read)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _read_only_uri(path: Path) -> str:
    """How a read command opens a store it may not write (a read-only file or mount): read
    only, so that it cannot write by mistake; and if SQLite cannot make the `-shm` file that
    reading a WAL store needs, as immutable: nobody can write it then either, and a WAL left
    without its `-shm` is not read (its commits were not checkpointed into the file)."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    shm = path.with_name(path.name + "-shm")
    if not shm.exists() and not os.access(path.parent, os.W_OK):
        uri += "&immutable=1"
    return uri


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


class _Texts:
    """A row's text columns read as bytes, decoded one by one: `damage` names the first that
    is not what it should be (the rest of the row is still read, to report it)."""

    def __init__(self) -> None:
        self.damage: str | None = None

    def text(self, column: str, value: bytes | str) -> str:
        raw = value if isinstance(value, bytes) else str(value).encode()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.damage = self.damage or f"column {column!r} holds text that is not UTF-8"
            return raw.decode("utf-8", "replace")

    def json(self, column: str, value: bytes | str) -> None:
        text = self.text(column, value)
        try:
            json.loads(text)
        except ValueError:
            self.damage = self.damage or f"column {column!r} holds no JSON"

    def status(self, value: bytes | str) -> str:
        text = self.text("status", value)
        if text not in _STATUSES:
            self.damage = self.damage or "column 'status' holds no run status"
        return text

    def time(self, column: str, value: bytes | str) -> datetime:
        text = self.text(column, value)
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            self.damage = self.damage or f"column {column!r} holds no time"
            return datetime.min.replace(tzinfo=UTC)


_STATUSES = frozenset(status.value for status in RunStatus)


def _text_bytes(*values: str | None) -> int:
    return sum(len(v.encode("utf-8")) for v in values if v is not None)


def _check_size(what: str, text: str) -> None:
    size = len(text.encode("utf-8"))
    if size > MAX_ITEM_BYTES:
        raise CheckpointTooLarge(what, size, MAX_ITEM_BYTES)


class SqliteCheckpointStore:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    def create_run(self, state: RunState, checkpoint: StoredCheckpoint) -> bool:
        state_json = stored.head_json(state)
        static_json = stored.static_json(state)
        event_json = stored.event_json(checkpoint.event)
        _check_size(f"run {state.run_id} head", state_json)
        _check_size(f"run {state.run_id} static state", static_json)
        _check_size(f"run {state.run_id} checkpoint", event_json)
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
            if status not in _STATUSES:
                # The column a worker claims by and a list shows, tampered: never shown as it
                # is (it may hold anything), and never written over as if it were a status.
                raise RunUnreadable(
                    run_id, "its stored state is damaged (column 'status' holds no run status)"
                )
            try:
                state = stored.load_head(
                    state_json, static_json, version=version, attempts=attempts
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
                    found.append(stored.parse_event(event))
                except ValueError as error:
                    raise RunUnreadable(
                        run_id, f"its checkpoint {version} is damaged ({_first_line(error)})"
                    ) from None
                below = version
            if len(rows) < page:
                return found[::-1]

    def begin_attempt(self, run_id: str, expected_version: int) -> int:
        with self._db.write() as tx:
            changed = tx.execute(
                "UPDATE runs SET attempts = attempts + 1, version = version + 1 "
                "WHERE run_id = ? AND version = ?",
                (run_id, expected_version),
            ).rowcount
            if not changed:
                self._raise_stale(tx, run_id, expected_version)
        return expected_version + 1

    def release_attempt(self, run_id: str, expected_version: int) -> int:
        with self._db.write() as tx:
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
        state_json = stored.head_json(head)
        event_json = stored.event_json(commit.checkpoint.event)
        _check_size(f"run {head.run_id} head", state_json)
        _check_size(f"run {head.run_id} step {commit.checkpoint.step} record", event_json)
        result = commit.completes.result if commit.completes else None
        if result is not None:
            _check_size(f"ledger result of {commit.completes.key}", result)  # type: ignore[union-attr]
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
                    (head.run_id, stored.static_json(head)),
                )
            if stored_status != head.status.value:
                # Apart, and only if it changed: setting the indexed status column rewrites
                # its index page even to the same value, one more page in the WAL a step.
                tx.execute(
                    "UPDATE runs SET status = ? WHERE run_id = ?",
                    (head.status.value, head.run_id),
                )
            written = _text_bytes(state_json, result)
            if commit.completes is not None:
                tx.execute(
                    "UPDATE idempotency SET status = ?, result = ? WHERE key = ?",
                    (LedgerStatus.COMPLETED.value, result, commit.completes.key),
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
                        event=stored.parse_event(event),
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
            "FROM runs AS r ORDER BY r.updated_at"
        ).fetchall()
        runs = []
        for run_id, status, step, version, updated_at, head, static_head in rows:
            texts = _Texts()
            summary = RunSummary(
                texts.text("run_id", run_id),
                texts.status(status),
                step,
                version,
                texts.time("updated_at", updated_at),
            )
            texts.json("state", head)
            if static_head is not None:
                texts.json("run_static.state", static_head)
            runs.append(replace(summary, damage=texts.damage))
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


class SqliteLedger:
    def __init__(self, db: SqliteDatabase, *, retention: timedelta = LEDGER_RETENTION) -> None:
        self._db = db
        self._retention = retention

    def begin(self, entry: LedgerEntry) -> LedgerEntry:
        decision_json = json.dumps(entry.decision, sort_keys=True, separators=(",", ":"))
        _check_size(f"ledger decision of {entry.key}", decision_json)
        now = utcnow()
        expires_at = entry.expires_at or now + self._retention
        with self._db.write() as tx:
            # Insert-if-absent under the write lock: of two workers deciding the same step,
            # the first record stands and the second reads it back below.
            inserted = tx.execute(
                "INSERT INTO idempotency (key, run_id, step, status, args_hash, decision, "
                "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key) DO NOTHING",
                (
                    entry.key,
                    entry.run_id,
                    entry.step,
                    LedgerStatus.IN_PROGRESS.value,
                    entry.args_hash,
                    decision_json,
                    now.isoformat(),
                    expires_at.isoformat(),
                ),
            ).rowcount
            if inserted:
                return entry.model_copy(
                    update={"status": LedgerStatus.IN_PROGRESS, "expires_at": expires_at}
                )
            stored = self._read(tx, entry.key)
        assert stored is not None
        if stored.args_hash != entry.args_hash:
            raise IdempotencyConflict(entry.key)
        return stored

    def get(self, key: str) -> LedgerEntry | None:
        return self._read(self._db.connection, key)

    def complete(self, key: str, result: str) -> None:
        _check_size(f"ledger result of {key}", result)
        with self._db.write() as tx:
            changed = tx.execute(
                "UPDATE idempotency SET status = ?, result = ? WHERE key = ?",
                (LedgerStatus.COMPLETED.value, result, key),
            ).rowcount
        if not changed:
            raise KeyError(f"no idempotency record for {key!r}")

    @staticmethod
    def _read(connection: sqlite3.Connection, key: str) -> LedgerEntry | None:
        row = connection.execute(
            "SELECT key, run_id, step, status, args_hash, decision, result, expires_at "
            "FROM idempotency WHERE key = ?",
            (key,),
        ).fetchone()
        if row is None:
            return None
        key, run_id, step, status, args_hash, decision, result, expires_at = row
        return LedgerEntry(
            key=key,
            run_id=run_id,
            step=step,
            status=LedgerStatus(status),
            args_hash=args_hash,
            decision=json.loads(decision),
            result=result,
            expires_at=datetime.fromisoformat(expires_at) if expires_at else None,
        )


class SqliteHousekeeping:
    """The rows `ratchet.housekeeping` reads and writes in a SQLite store (`migrate`, `gc`)."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    def heads(self) -> list[StoredHead]:
        # A store made before schema 3 has no run_static table until a write command adds it.
        static_state = (
            "(SELECT state FROM run_static AS s WHERE s.run_id = r.run_id)"
            if "run_static" in self._tables()
            else "NULL"
        )
        # Text as bytes, decoded here: one run's damaged row must not stop the others.
        rows = self._db.connection.execute(
            "SELECT CAST(r.run_id AS BLOB), r.version, r.attempts, CAST(r.status AS BLOB), "
            f"CAST(r.updated_at AS BLOB), CAST(r.state AS BLOB), CAST({static_state} AS BLOB) "
            "FROM runs AS r ORDER BY r.run_id"
        ).fetchall()
        heads = []
        for run_id, version, attempts, status, at, head, static in rows:
            texts = _Texts()
            updated_at = texts.time("updated_at", at)
            heads.append(
                StoredHead(
                    texts.text("run_id", run_id),
                    version,
                    attempts,
                    texts.status(status),
                    updated_at,
                    texts.text("state", head),
                    None if static is None else texts.text("run_static.state", static),
                    texts.damage,
                )
            )
        return heads

    def records(self, run_id: str) -> list[StoredRecord]:
        rows = self._db.connection.execute(
            "SELECT version, step, CAST(event AS BLOB) FROM checkpoints WHERE run_id = ? "
            "ORDER BY version",
            (run_id,),
        ).fetchall()
        records = []
        for version, step, event in rows:
            texts = _Texts()
            records.append(StoredRecord(version, step, texts.text("event", event), texts.damage))
        return records

    def rewrite_head(self, head: StoredHead, text: str, static: str | None) -> bool:
        _check_size(f"run {head.run_id} head", text)
        with self._db.write() as tx:
            # Conditional on the version read, as a commit is, but without bumping it: the
            # rewritten head is the same state in another form, so a worker that read this
            # version may still commit over it; a head that moved is left to a later run.
            changed = tx.execute(
                "UPDATE runs SET state = ? WHERE run_id = ? AND version = ?",
                (text, head.run_id, head.version),
            ).rowcount
            if changed and static is not None:
                tx.execute(
                    "INSERT INTO run_static (run_id, state) VALUES (?, ?) "
                    "ON CONFLICT (run_id) DO NOTHING",
                    (head.run_id, static),
                )
        return bool(changed)

    def trim_run(self, head: StoredHead, keep_from_step: int, *, dry_run: bool) -> Trimmed | None:
        # One transaction: the version check and the deletes. A run retried meanwhile (its
        # version moved) keeps everything; one retried after reads the window gc kept.
        records_where = (
            "FROM checkpoints WHERE run_id = ? AND step < ? AND version > "
            "(SELECT min(version) FROM checkpoints WHERE run_id = ?)"
        )
        ledger_where = "FROM idempotency WHERE run_id = ? AND step < ?"
        run_id = head.run_id
        with self._db.read() if dry_run else self._db.write() as tx:
            still = tx.execute(
                "SELECT 1 FROM runs WHERE run_id = ? AND version = ?", (run_id, head.version)
            ).fetchone()
            if still is None:
                return None
            if dry_run:
                (records,) = tx.execute(
                    f"SELECT count(*) {records_where}", (run_id, keep_from_step, run_id)
                ).fetchone()
                (ledger,) = tx.execute(
                    f"SELECT count(*) {ledger_where}", (run_id, keep_from_step)
                ).fetchone()
            else:
                records = tx.execute(
                    f"DELETE {records_where}", (run_id, keep_from_step, run_id)
                ).rowcount
                ledger = tx.execute(f"DELETE {ledger_where}", (run_id, keep_from_step)).rowcount
        return Trimmed(records, ledger)

    def blob_references(self, trims: Mapping[str, int]) -> set[str]:
        connection = self._db.connection
        tables = self._tables()
        # As bytes: a digest is ASCII, so a damaged (not UTF-8) text still names its blobs.
        queries = [
            "SELECT CAST(state AS BLOB) FROM runs",
            "SELECT CAST(state AS BLOB) FROM run_static",
            "SELECT CAST(decision AS BLOB) FROM idempotency",
            "SELECT CAST(result AS BLOB) FROM idempotency WHERE result IS NOT NULL",
        ]
        if "approvals" in tables:
            queries.append("SELECT CAST(record AS BLOB) FROM approvals")
        found: set[str] = set()
        for query in queries:
            for (text,) in connection.execute(query):
                found |= blob_digests(bytes(text).decode("utf-8", "replace"))
        # Each run's first record, which gc keeps: only a dry run's `trims` need it.
        firsts = (
            dict(connection.execute("SELECT run_id, min(version) FROM checkpoints GROUP BY run_id"))
            if trims
            else {}
        )
        for run_id, version, step, event in connection.execute(
            "SELECT run_id, version, step, CAST(event AS BLOB) FROM checkpoints "
            "WHERE instr(event, 'sha256')"
        ):
            keep_from = trims.get(run_id)
            if keep_from is not None and step < keep_from and version > firsts[run_id]:
                continue  # a record gc deletes (counted for a dry run)
            found |= blob_digests(bytes(event).decode("utf-8", "replace"))
        return found

    def locked(self) -> AbstractContextManager[object]:
        return self._db.write()

    def _tables(self) -> set[str]:
        rows = self._db.connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {str(name) for (name,) in rows}

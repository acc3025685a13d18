"""One SQLite file of Ratchet's: opening it, its schema, its transactions, and Ratchet's names
for SQLite's failures.

WAL mode with `synchronous=FULL`: a commit is durable when it returns, and readers in other
processes never block the writer. Every write runs in `BEGIN IMMEDIATE`, which takes SQLite's
single write lock up front, so a version check and the writes that depend on it cannot
interleave with another process's. One write is not synced as it commits (`write(synced=
False)`): counting a step's attempt, which the step's next synced commit makes durable before
its tool runs.

Every SQLite adapter (the checkpoint store, the ledger, housekeeping, approvals, run data,
leases) works through `SqliteDatabase`, whose connection raises Ratchet's errors
(`store_error`): nothing above the adapters sees a `sqlite3` error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ratchet.adapters.private import PRIVATE_FILE, private_folder
from ratchet.errors import (
    CheckpointTooLarge,
    RatchetError,
    StoreBusy,
    StoreDamaged,
    StoreMissing,
    StoreUnavailable,
)
from ratchet.ports import MAX_ITEM_BYTES
from ratchet.state import RunStatus

_IDEMPOTENCY_TABLE = """
CREATE TABLE IF NOT EXISTS idempotency (
    key        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    step       INTEGER NOT NULL,
    status     TEXT NOT NULL,
    args_hash  TEXT NOT NULL,
    decision   TEXT,
    result     TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT
)
"""
"""The ledger (`ratchet.adapters.sqlite.ledger`). `decision` is NULL once the step's commit
completed the key: the step's record holds the decision from then on.

A rowid table (its key in an index of its own), unlike the others: a row is 0.3-0.5 KB, over
the 231 B a WITHOUT ROWID table keeps of a row in a 1 KB page, so each row there took a page
of overflow of its own (1,125 pages per 1,000 steps of `bench.compare`'s agent); a rowid table
keeps rows of up to 989 B in the page, and appends its rows in order, so the space a
completion frees (the decision) is where the next step's row goes (375 pages, index
included). A store an older Ratchet made gets this table with its first completion
(`SqliteDatabase.completing`); the SQL is the same for both shapes."""

_SCHEMA = (
    _IDEMPOTENCY_TABLE
    + """;
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
-- A rowid table, its key in an index of its own. A step's record (1.4-1.5 KB) overflows a
-- 1 KB page either way: a WITHOUT ROWID table keeps at most 231 B of a row in its leaf, so
-- the rest took two overflow pages, the second half empty; a rowid table keeps up to 989 B
-- there, so what one overflow page does not hold stays in the leaf, and two records of up
-- to ~1,520 B share one (1,951 B a step of bench.compare's agent, not 2,560 B). A store an
-- older Ratchet made keeps its WITHOUT ROWID table; the SQL is the same for both.
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
);
CREATE TABLE IF NOT EXISTS leases (
    run_id     TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
"""
)

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

WAITS_SCHEMA = """
-- ratchet.adapters.sqlite.mailbox keeps the events sent to runs here, once per event id, in
-- order of arrival (seq); a step's commit consumes one in the write that records it.
CREATE TABLE IF NOT EXISTS mailbox (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id        TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    name          TEXT NOT NULL,
    consumed_step INTEGER,
    refused       TEXT,
    record        TEXT NOT NULL,
    UNIQUE (run_id, event_id)
);
CREATE INDEX IF NOT EXISTS mailbox_pending ON mailbox (run_id, name, seq)
    WHERE consumed_step IS NULL AND refused IS NULL;
-- The book of open waits: one row per waiting run, written by the commit that parks it and
-- removed by the one that settles it, so a worker finds what is due without reading heads.
CREATE TABLE IF NOT EXISTS open_waits (
    run_id TEXT PRIMARY KEY,
    step   INTEGER NOT NULL,
    kind   TEXT NOT NULL,
    name   TEXT,
    due_at TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS open_waits_due ON open_waits (due_at) WHERE due_at IS NOT NULL;
"""

HOOKS_SCHEMA = """
-- ratchet.adapters.sqlite.hooks keeps the webhooks here: the id a delivery's URL carries, and
-- the run and event name it delivers to. No secret: each is derived from the id and the key.
CREATE TABLE IF NOT EXISTS hooks (
    hook_id TEXT PRIMARY KEY,
    run_id  TEXT NOT NULL,
    name    TEXT NOT NULL,
    record  TEXT NOT NULL
) WITHOUT ROWID;
"""

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
        "mailbox",
        "open_waits",
        "hooks",
        "sqlite_sequence",  # SQLite's own, for the mailbox's AUTOINCREMENT order of arrival
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
    """Connections to a Ratchet SQLite file, shared by the store, ledger and leases.

    A file is used only if it is a Ratchet store: marked with Ratchet's `application_id`, or
    made by an earlier Ratchet (Ratchet's tables only, `runs` of Ratchet's shape), which is then
    marked when opened to write. With `create`, a missing or empty file becomes a new store.
    Anything else is refused before a byte of it changes. A lock held longer than
    `busy_timeout` seconds is `StoreBusy`.

    Each thread gets a connection of its own, opened on its first use (`connection`), so one
    database, and the `Client` above it, may be used from many threads at once: a thread's
    transactions are its own, and SQLite's file lock orders their writes as it orders other
    processes'. With `any_thread`, every thread shares one connection, one at a time (the
    caller serialises: see `ratchet serve`)."""

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
            raise StoreMissing(f"no Ratchet store at {path} (start a run first)")
        made = create and _make_private(path)
        self.read_only = not create and not _writable(path)
        self._any_thread = any_thread
        self._lock = threading.Lock()
        self._threads = threading.local()
        self._opened: dict[threading.Thread, sqlite3.Connection] = {}
        self._ledger_ready = False
        connection = self._connect()
        try:
            marked = self._check_ownership(create=create)
            if not made:
                _warn_if_exposed(path)  # only now, knowing the file is a store of Ratchet's
            if create and not marked:
                # A new store: small pages, so that a step's two commits append little to the
                # WAL, which SQLite writes a whole page at a time (rows here are 0.1-2 KB).
                # Set before anything is written; an existing store keeps its own.
                connection.execute(f"PRAGMA page_size={PAGE_SIZE}")
            if not self.read_only:
                # Only now, knowing the file is ours: switching to WAL rewrites the file header.
                # The mode is the file's, so the connections opened later find it.
                connection.execute("PRAGMA journal_mode=WAL")
            if create:
                schema = _SCHEMA + APPROVALS_SCHEMA + RUN_DATA_SCHEMA + WAITS_SCHEMA + HOOKS_SCHEMA
                if marked:
                    # Tables a later Ratchet added, on a store an earlier one made.
                    connection.executescript(schema)
                else:
                    # A new store is made in one transaction, its marker with its tables:
                    # another process that opens it meanwhile (two workers started at once)
                    # finds it empty, and makes it too (each statement is IF NOT EXISTS), or
                    # whole; never a part of it, which is not yet a Ratchet store.
                    connection.executescript(
                        f"BEGIN IMMEDIATE;{schema};"
                        f"PRAGMA application_id={RATCHET_APPLICATION_ID};COMMIT;"
                    )
        except BaseException:
            self.close()
            raise

    @property
    def connection(self) -> sqlite3.Connection:
        """This thread's connection (with `any_thread`, the one shared by all)."""
        if self._any_thread:
            return self._shared
        connection: sqlite3.Connection | None = getattr(self._threads, "connection", None)
        if connection is None:
            connection = self._connect()
        return connection

    def _connect(self) -> sqlite3.Connection:
        try:
            connection = sqlite3.connect(
                _read_only_uri(self.path) if self.read_only else self.path,
                isolation_level=None,
                timeout=self.busy_timeout,
                factory=_Connection,
                uri=self.read_only,
                # Each connection serves one thread (or, with any_thread, one at a time); any
                # thread may close it (`close`).
                check_same_thread=False,
            )
        except sqlite3.DatabaseError as error:
            raise StoreUnavailable(f"cannot use {self.path} as a Ratchet store: {error}") from None
        assert isinstance(connection, _Connection)
        connection.store_path = self.path
        connection.busy_timeout = self.busy_timeout
        try:
            connection.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            if not self.read_only:
                # The connection's setting, not the file's: nothing is written.
                connection.execute("PRAGMA synchronous=FULL")
        except BaseException:
            connection.close()
            raise
        if self._any_thread:
            self._shared = connection
        else:
            self._threads.connection = connection
        with self._lock:
            # A thread that has ended takes its connection with it.
            for thread in [t for t in self._opened if not t.is_alive()]:
                self._opened.pop(thread).close()
            self._opened[threading.current_thread()] = connection
        return connection

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

    def completing(self, tx: sqlite3.Connection) -> None:
        """Ready the ledger for a completion in the write transaction `tx`: a completed key
        keeps no decision (NULL), which a ledger table an older Ratchet made does not allow
        (its `decision` is NOT NULL, and SQLite's ALTER TABLE cannot lift that). Such a table
        is copied into one of today's shape, its rows as they are (their decisions read as
        before), in `tx`: with the first completion, so a process that only reads (or a
        `ratchet migrate --dry-run`) changes no byte. Checked once per process."""
        if self._ledger_ready:
            return
        required = any(
            name == "decision" and notnull
            for _, name, _, notnull, _, _ in tx.execute("PRAGMA table_info(idempotency)")
        )
        if required:
            tx.execute("ALTER TABLE idempotency RENAME TO idempotency_before_null_decisions")
            tx.execute(_IDEMPOTENCY_TABLE)
            tx.execute(
                "INSERT INTO idempotency SELECT key, run_id, step, status, args_hash, decision, "
                "result, created_at, expires_at FROM idempotency_before_null_decisions"
            )
            tx.execute("DROP TABLE idempotency_before_null_decisions")
        self._ledger_ready = True

    @contextmanager
    def write(self, *, synced: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction holding SQLite's write lock from its first statement. Not
        `synced`, its commit is in the WAL when it returns, which no crash of this or any
        process loses (only the machine's losing power before the next synced commit, which
        syncs the WAL with everything in it, can)."""
        connection = self.connection
        if not synced:
            connection.execute("PRAGMA synchronous=NORMAL")
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
        finally:
            if not synced:
                # The connection's setting: every other write stays synced as it commits.
                connection.execute("PRAGMA synchronous=FULL")

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

    def has_table(self, name: str) -> bool:
        """Whether the store has the table (one made by an older Ratchet may not, until a
        writer opens it)."""
        return (
            self.connection.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
            ).fetchone()
            is not None
        )

    def close(self) -> None:
        """Close every thread's connection: call it once the threads using it are done."""
        with self._lock:
            opened, self._opened = list(self._opened.values()), {}
        for connection in opened:
            connection.close()


_log = logging.getLogger("ratchet.store")
_warned: set[Path] = set()


def _make_private(path: Path) -> bool:
    """Make a missing store file (and its folder, if missing) owner-only before SQLite opens it:
    SQLite gives its WAL and SHM the store's mode. True if this made it; an existing store
    keeps its mode (see `_warn_if_exposed`)."""
    private_folder(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except FileExistsError:
        return False
    except OSError:
        return False  # not a file this process may make (a read-only folder): SQLite says
    return True


def _warn_if_exposed(path: Path) -> None:
    """One line, once per process and store, if others than its owner may read the store:
    what its runs' tools saw and did is in it."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if not mode & 0o077 or path in _warned or not path.is_file():
        return
    _warned.add(path)
    _log.warning(
        f"warning: {path} may be read by other users (mode {mode & 0o777:o}): "
        f"chmod 600 {path} {path}-wal {path}-shm makes it private"
    )


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


# --- reading rows that may be damaged -------------------------------------------------------------


class RowTexts:
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

    def json(self, column: str, value: bytes | str) -> Any:
        """The column's JSON, parsed; None (and the damage noted) if it holds none."""
        text = self.text(column, value)
        try:
            return json.loads(text)
        except ValueError:
            self.damage = self.damage or f"column {column!r} holds no JSON"
            return None

    def status(self, value: bytes | str) -> str:
        text = self.text("status", value)
        if text not in RUN_STATUSES:
            self.damage = self.damage or "column 'status' holds no run status"
        return text

    def time(self, column: str, value: bytes | str) -> datetime:
        text = self.text(column, value)
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            self.damage = self.damage or f"column {column!r} holds no time"
            return datetime.min.replace(tzinfo=UTC)


RUN_STATUSES = frozenset(status.value for status in RunStatus)


def check_size(what: str, text: str) -> None:
    """`CheckpointTooLarge` for a text over `MAX_ITEM_BYTES`, before anything is written."""
    size = len(text.encode("utf-8"))
    if size > MAX_ITEM_BYTES:
        raise CheckpointTooLarge(what, size, MAX_ITEM_BYTES)

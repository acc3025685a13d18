"""The migration scenario's application data, behind a small interface.

The agent's side effects land here, so this is where "applied at most once per key" is kept:
each write checks the `applied` table for its idempotency key inside the same transaction that
applies it. Locally it is a SQLite file of its own (the app's database, not Ratchet's); the AWS
runtime supplies a DynamoDB-backed implementation of the same Protocol.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from ratchet.errors import IdempotencyConflict

BATCH_SIZE = 1000
SOURCE_TABLE = "legacy_orders"
TARGET_TABLE = "orders"


EFFECTS = ("copy_batch", "drop_source", "send_email")
"""The data's side effects, by the name of the method that applies them."""


@dataclass(frozen=True)
class Effect:
    """One side effect the data holds: applied under `key` by the method `name` with `args`.
    `name` and `args` are None for an effect applied before they were recorded."""

    key: str
    name: str | None
    args: dict[str, Any] | None


@dataclass(frozen=True)
class MigrationCounts:
    source_rows: int
    target_rows: int
    duplicate_rows: int
    missing_rows: int
    emails_sent: int
    legacy_dropped: bool
    keys_delivered: int
    keys_applied: int


class MigrationData(Protocol):
    def seed(self, batches: int) -> None:
        """Create the legacy table with `batches` x 1,000 rows, once."""
        ...

    def inspect(self, table: str) -> str: ...

    def copy_batch(self, batch: int, key: str) -> str: ...

    def drop_source(self, key: str) -> str: ...

    def send_email(self, to: str, subject: str, body: str, key: str) -> str: ...

    def counts(self) -> MigrationCounts: ...

    def effects(self) -> list[Effect]:
        """Every effect applied, with its key and arguments: what a fork rebuilds from."""
        ...


_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {SOURCE_TABLE} (
    id INTEGER PRIMARY KEY, customer TEXT NOT NULL, amount_cents INTEGER NOT NULL
);
-- No unique constraint on legacy_id on purpose: a step applied twice would show up as
-- duplicate rows, which `verify` counts, instead of being hidden by the schema.
CREATE TABLE IF NOT EXISTS {TARGET_TABLE} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    legacy_id INTEGER NOT NULL,
    customer TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    batch INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient TEXT NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL, key TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS applied (
    key TEXT PRIMARY KEY,
    args_hash TEXT NOT NULL,
    result TEXT NOT NULL,
    deliveries INTEGER NOT NULL
);
-- What each applied key did, so a fork can apply the same effects to data of its own. A table
-- of its own rather than columns of `applied`: data written before it has none, and says so.
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY, name TEXT NOT NULL, args TEXT NOT NULL
);
"""


def _read_only(path: Path) -> sqlite3.Connection:
    """`path` opened so that no statement can write (`query_only`: a write fails instead of
    landing). A file this process may not write is opened with SQLite's `mode=ro`, and as
    immutable where SQLite could not make the `-shm` file a WAL file needs even to be read
    (a read-only folder). A file that is not there reads as an empty schema, in memory."""
    if not path.is_file():
        empty = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        empty.executescript(_SCHEMA)
        return empty
    if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
        # Read-write, yet never written: the last connection to close removes the WAL's
        # `-shm` and `-wal` files, as a writer's would (a `mode=ro` one leaves them behind).
        connection = sqlite3.connect(
            path, isolation_level=None, timeout=30.0, check_same_thread=False
        )
        connection.execute("PRAGMA query_only=ON")
        return connection
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    if not path.with_name(path.name + "-shm").exists() and not os.access(path.parent, os.W_OK):
        uri += "&immutable=1"
    return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)


class SqliteMigrationData:
    """The run's app data in a SQLite file. With `read_only` (what `verify` opens) nothing is
    created or changed, not even the file: a run whose data is gone reads as empty."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        if read_only:
            self._db = _read_only(path)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # Opened by the agent's `resources` hook on the engine's agent thread, used by its tools
        # there, one at a time, and closed by whoever owns the runtime: never concurrently.
        self._db = sqlite3.connect(
            path, isolation_level=None, timeout=30.0, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        # One transaction, so one synced commit: each statement on its own was a commit of
        # its own, and a new file's tables took five syncs more (issue 36).
        self._db.executescript(f"BEGIN IMMEDIATE;{_SCHEMA};COMMIT;")

    def close(self) -> None:
        self._db.close()

    def seed(self, batches: int) -> None:
        with self._write() as tx:
            if tx.execute("SELECT 1 FROM meta WHERE name = 'source_rows'").fetchone():
                return
            rows = batches * BATCH_SIZE
            tx.executemany(
                f"INSERT INTO {SOURCE_TABLE} (id, customer, amount_cents) VALUES (?, ?, ?)",
                ((i, f"customer-{i % 997:03d}", (i * 7919) % 100_000) for i in range(1, rows + 1)),
            )
            tx.executemany(
                "INSERT INTO meta (name, value) VALUES (?, ?)",
                [("source_rows", str(rows)), ("batches", str(batches))],
            )

    def inspect(self, table: str) -> str:
        if table == SOURCE_TABLE and self._dropped():
            return f"{SOURCE_TABLE} no longer exists (dropped)."
        if table not in (SOURCE_TABLE, TARGET_TABLE):
            return f"No table named {table!r}; tables: {SOURCE_TABLE}, {TARGET_TABLE}."
        (rows,) = self._db.execute(f"SELECT count(*) FROM {table}").fetchone()
        batches = -(-rows // BATCH_SIZE)
        return f"{table} has {rows:,} rows ({batches} batches of {BATCH_SIZE:,})."

    def copy_batch(self, batch: int, key: str) -> str:
        with self._once(key, {"batch": batch}) as (tx, recorded):
            if recorded is not None:
                return recorded
            if self._dropped(tx):
                raise RuntimeError(f"{SOURCE_TABLE} was dropped; nothing left to copy")
            low, high = (batch - 1) * BATCH_SIZE + 1, batch * BATCH_SIZE
            copied = tx.execute(
                f"INSERT INTO {TARGET_TABLE} (legacy_id, customer, amount_cents, batch) "
                f"SELECT id, customer, amount_cents, ? FROM {SOURCE_TABLE} "
                "WHERE id BETWEEN ? AND ? ORDER BY id",
                (batch, low, high),
            ).rowcount
            result = f"Copied {copied:,} rows (ids {low:,}-{high:,}) in batch {batch}."
            self._record(tx, key, "copy_batch", {"batch": batch}, result)
            return result

    def drop_source(self, key: str) -> str:
        with self._once(key, {"table": SOURCE_TABLE}) as (tx, recorded):
            if recorded is not None:
                return recorded
            tx.execute(f"DROP TABLE IF EXISTS {SOURCE_TABLE}")
            tx.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('dropped', '1')")
            result = f"Dropped {SOURCE_TABLE}."
            self._record(tx, key, "drop_source", {"table": SOURCE_TABLE}, result)
            return result

    def send_email(self, to: str, subject: str, body: str, key: str) -> str:
        args = {"to": to, "subject": subject, "body": body}
        with self._once(key, args) as (tx, recorded):
            if recorded is not None:
                return recorded
            tx.execute(
                "INSERT INTO outbox (recipient, subject, body, key) VALUES (?, ?, ?, ?)",
                (to, subject, body, key),
            )
            result = f"Email to {to} queued: {subject!r}."
            self._record(tx, key, "send_email", args, result)
            return result

    def counts(self) -> MigrationCounts:
        meta = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
        source = int(meta.get("source_rows", 0))
        target, distinct = self._db.execute(
            f"SELECT count(*), count(DISTINCT legacy_id) FROM {TARGET_TABLE}"
        ).fetchone()
        (emails,) = self._db.execute("SELECT count(*) FROM outbox").fetchone()
        delivered, applied = self._db.execute(
            "SELECT coalesce(sum(deliveries), 0), count(*) FROM applied"
        ).fetchone()
        return MigrationCounts(
            source_rows=source,
            target_rows=target,
            duplicate_rows=target - distinct,
            missing_rows=source - distinct,
            emails_sent=emails,
            legacy_dropped=meta.get("dropped") == "1",
            keys_delivered=delivered,
            keys_applied=applied,
        )

    def effects(self) -> list[Effect]:
        rows = self._db.execute(
            "SELECT applied.key, effects.name, effects.args FROM applied "
            "LEFT JOIN effects ON effects.key = applied.key ORDER BY applied.key"
        ).fetchall()
        return [
            Effect(key=key, name=name, args=json.loads(args) if args is not None else None)
            for key, name, args in rows
        ]

    # --- at most once per key ---------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @contextmanager
    def _once(
        self, key: str, args: dict[str, Any]
    ) -> Iterator[tuple[sqlite3.Connection, str | None]]:
        """Check-before-write under the write lock: yields the recorded result if `key` was
        applied already (counting the redelivery), else None for the caller to apply it."""
        with self._write() as tx:
            row = tx.execute(
                "SELECT args_hash, result FROM applied WHERE key = ?", (key,)
            ).fetchone()
            if row is None:
                yield tx, None
                return
            if row[0] != _hash(args):
                raise IdempotencyConflict(key)
            tx.execute("UPDATE applied SET deliveries = deliveries + 1 WHERE key = ?", (key,))
            yield tx, row[1]

    @staticmethod
    def _record(
        tx: sqlite3.Connection, key: str, name: str, args: dict[str, Any], result: str
    ) -> None:
        tx.execute(
            "INSERT INTO applied (key, args_hash, result, deliveries) VALUES (?, ?, ?, 1)",
            (key, _hash(args), result),
        )
        tx.execute(
            "INSERT INTO effects (key, name, args) VALUES (?, ?, ?)",
            (key, name, json.dumps(args, sort_keys=True)),
        )

    def _dropped(self, tx: sqlite3.Connection | None = None) -> bool:
        row = (tx or self._db).execute("SELECT value FROM meta WHERE name = 'dropped'").fetchone()
        return row is not None and row[0] == "1"


def _hash(args: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()

"""A run's own data (`RunData`) in the local store's SQLite file: table `run_data`.

Tools call it from the engine's agent thread, hooks from the caller's, and a timed-out step's
abandoned thread may still be calling while the next attempt's thread starts: a sqlite3
connection belongs to the thread that made it, so each calling thread gets a connection of its
own, opened on first use (`SqliteDatabase` on the same file, with the store's busy timeout),
and ends with its thread. Other processes write the same file: every write takes SQLite's
write lock (`BEGIN IMMEDIATE`), and a lock held past the busy timeout is `StoreBusy`.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from ratchet.adapters.run_data import checked_key, checked_prefix, checked_value
from ratchet.adapters.sqlite.database import RUN_DATA_SCHEMA, SqliteDatabase, store_error
from ratchet.sealing import PayloadCodec
from ratchet.stored import opened_value, sealed_value

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _translating(method: _Method) -> _Method:
    """An error SQLite raises past the connection's own translation (while stepping through
    rows) under Ratchet's name."""

    @functools.wraps(method)
    def translating(self: SqliteRunData, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as error:
            if isinstance(error, sqlite3.IntegrityError | sqlite3.ProgrammingError):
                raise
            raise store_error(error, self._path, self._busy_timeout) from None

    return cast("_Method", translating)


class SqliteRunData:
    """`RunData` for one run (see `ratchet.ports.RunData` for the contract)."""

    def __init__(self, db: SqliteDatabase, run_id: str, codec: PayloadCodec | None = None) -> None:
        self._path = db.path
        self._busy_timeout = db.busy_timeout
        self._run_id = run_id
        self._codec = codec  # seals each value, bound to its run and key
        self._threads = threading.local()

    @_translating
    def get(self, key: str) -> str | None:
        checked_key(key)
        db = self._db()
        if not self._has_table(db):
            return None
        row = db.connection.execute(
            "SELECT value FROM run_data WHERE run_id = ? AND key = ?", (self._run_id, key)
        ).fetchone()
        return None if row is None else self._opened(key, str(row[0]))

    @_translating
    def put(self, key: str, value: str) -> None:
        checked_key(key)
        checked_value(value)
        with self._write() as tx:
            tx.execute(
                "INSERT INTO run_data (run_id, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
                (self._run_id, key, self._sealed(key, value)),
            )

    @_translating
    def put_once(self, key: str, value: str) -> bool:
        checked_key(key)
        checked_value(value)
        with self._write() as tx:
            # Insert-if-absent under the write lock: of two writers of one key (a step retried
            # while its first attempt still runs, in this process or another), one inserts and
            # the other changes nothing and is told so.
            inserted = tx.execute(
                "INSERT INTO run_data (run_id, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (run_id, key) DO NOTHING",
                (self._run_id, key, self._sealed(key, value)),
            ).rowcount
        return bool(inserted)

    @_translating
    def delete(self, key: str) -> None:
        checked_key(key)
        with self._write() as tx:
            tx.execute("DELETE FROM run_data WHERE run_id = ? AND key = ?", (self._run_id, key))

    @_translating
    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        checked_prefix(prefix)
        db = self._db()
        if not self._has_table(db):
            return []
        # The primary key's order is SQLite's BINARY collation, the UTF-8 bytes: the order
        # of Python's str and of DynamoDB's sort keys. The keys with the prefix are the run
        # of keys from the prefix on, up to the first that lacks it.
        rows = db.connection.execute(
            "SELECT key, value FROM run_data WHERE run_id = ? AND key >= ? ORDER BY key",
            (self._run_id, prefix),
        )
        found = []
        for key, value in rows:
            if not str(key).startswith(prefix):
                break
            found.append((str(key), self._opened(str(key), str(value))))
        return found

    def _sealed(self, key: str, value: str) -> str:
        return sealed_value(value, self._codec, part=f"data:{key}", run_id=self._run_id)

    def _opened(self, key: str, value: str) -> str:
        return opened_value(value, self._codec, part=f"data:{key}", run_id=self._run_id)

    def _db(self) -> SqliteDatabase:
        db: SqliteDatabase | None = getattr(self._threads, "db", None)
        if db is None:
            db = self._threads.db = SqliteDatabase(
                self._path, create=False, busy_timeout=self._busy_timeout
            )
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; a store opened without creating its schema (a read command
        on a store made before run data existed) gets the table in the first write."""
        db = self._db()
        with db.write() as tx:
            if not getattr(self._threads, "has_table", False):
                tx.execute(RUN_DATA_SCHEMA)
            yield tx
        self._threads.has_table = True

    def _has_table(self, db: SqliteDatabase) -> bool:
        """Whether the table exists; reads of a store without it find nothing, and change
        nothing."""
        if not getattr(self._threads, "has_table", False):
            self._threads.has_table = bool(
                db.connection.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'run_data'"
                ).fetchone()
            )
        return bool(self._threads.has_table)

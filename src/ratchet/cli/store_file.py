"""A local store's file read with `sqlite3`'s C module, before any model loads: the connection
the quick read commands (`ratchet.cli.quick`) read through, and the marks `ratchet watch` polls
(`RunMarks`).

It sits below both the entry point (`ratchet.cli.quick`) and the full CLI (`ratchet.cli.app`,
whose `watch` polls the marks): the entry point hands on to the full CLI, which never imports
the entry point back (an import contract in pyproject.toml holds it).
"""

from __future__ import annotations

import os

from ratchet.store_urls import sqlite_file

# As in `ratchet.cli.quick`: nothing here loads a module slower to load than a read takes.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from sqlite3 import Connection

APPLICATION_ID = 0x52744368
"""`ratchet.adapters.sqlite.database.RATCHET_APPLICATION_ID`: the mark of a Ratchet store."""


class RunMarks:
    """A run's version and status, read from a SQLite store in one row read: what
    `ratchet watch` polls between reads of the run, so that a poll of a run that has not
    moved costs a query, not a head read with its window's records and their validation.
    Every write of a run raises its version, so the same mark means nothing was written."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    @classmethod
    def open(cls, store: str) -> RunMarks | None:
        """The marks of `store`, or None if it is not a SQLite store this path reads."""
        connection = connect(store)
        return None if connection is None else cls(connection)

    def of(self, run_id: str) -> tuple[int, str] | None:
        """The run's version and status as stored now; None if there is no such run."""
        row = self.connection.execute(
            "SELECT version, status FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def close(self) -> None:
        self.connection.close()


def connect(store: str) -> Connection | None:
    """A connection to the Ratchet store `store` names, if it is a SQLite file (never one
    that creates it), in autocommit: each statement reads what is committed."""
    path = sqlite_file(store)
    if path is None or not os.path.isfile(path):
        return None
    import _sqlite3

    try:
        # mode=rw: never create the file (the full CLI says there is no store).
        connection = _sqlite3.connect(
            f"file:{uri_path(os.path.abspath(path))}?mode=rw", uri=True, isolation_level=None
        )
    except _sqlite3.Error:
        return None
    try:
        (application_id,) = connection.execute("PRAGMA application_id").fetchone()
        if application_id == APPLICATION_ID:
            return connection
    except _sqlite3.Error:
        pass
    connection.close()
    return None


def uri_path(path: str) -> str:
    """`path` in a `file:` URI: the characters SQLite would read as URI syntax escaped
    (`urllib.parse.quote` would do, and take longer to load than the read takes)."""
    return path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")

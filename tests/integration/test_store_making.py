"""A new store is made whole or not at all, as another process sees it: two workers started at
once on a store that does not exist yet both open it (CI saw the second refuse it, "is not a
Ratchet store", having read it while the first had made one table of many).

The test holds the first maker in the middle of its tables (a SQL function it calls there
waits), opens the store a second time meanwhile, then lets the first go on."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from ratchet.adapters.sqlite import database
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.errors import StoreUnavailable

PATIENCE = 30.0


class _Midway:
    """The first connection to call `ratchet_midway()` waits there until `go` is set."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        self._taken = threading.Lock()

    def __call__(self) -> int:
        if self._taken.acquire(blocking=False):
            self.reached.set()
            assert self.go.wait(PATIENCE)
        return 0


@pytest.fixture
def midway(monkeypatch) -> _Midway:
    held = _Midway()
    schema = database._SCHEMA
    first_table = schema.index("CREATE TABLE IF NOT EXISTS runs")
    # Between the store's first table (the idempotency ledger) and its runs table.
    monkeypatch.setattr(
        database,
        "_SCHEMA",
        f"{schema[:first_table]};SELECT ratchet_midway();{schema[first_table:]}",
    )
    connect = SqliteDatabase._connect

    def connect_with_midway(self: SqliteDatabase) -> sqlite3.Connection:
        connection = connect(self)
        connection.create_function("ratchet_midway", 0, held)
        return connection

    monkeypatch.setattr(SqliteDatabase, "_connect", connect_with_midway)
    return held


def test_a_store_opened_while_another_process_makes_it_is_found_whole(tmp_path, midway):
    path = tmp_path / "ratchet.db"
    opened: dict[str, SqliteDatabase | BaseException] = {}

    def open_as(name: str) -> None:
        try:
            opened[name] = SqliteDatabase(path)
        except BaseException as error:  # the test reports it below
            opened[name] = error

    first = threading.Thread(target=open_as, args=("first",))
    first.start()
    assert midway.reached.wait(PATIENCE), "the first maker reached the middle of its tables"
    second = threading.Thread(target=open_as, args=("second",))
    second.start()
    # The second waits for the first's transaction (or, before the fix, has already failed).
    second.join(0.5)
    midway.go.set()
    first.join(PATIENCE)
    second.join(PATIENCE)

    failed = {n: repr(o) for n, o in opened.items() if isinstance(o, BaseException)}
    assert not failed, failed
    for db in opened.values():
        assert isinstance(db, SqliteDatabase)
        db.close()
    reopened = SqliteDatabase(path, create=False)
    try:
        (application_id,) = reopened.connection.execute("PRAGMA application_id").fetchone()
        assert application_id == database.RATCHET_APPLICATION_ID
    finally:
        reopened.close()


def test_a_store_cut_short_while_being_made_leaves_no_part_of_it(tmp_path, midway):
    path = tmp_path / "ratchet.db"
    failure: list[BaseException] = []

    def make() -> None:
        try:
            SqliteDatabase(path)
        except BaseException as error:
            failure.append(error)

    maker = threading.Thread(target=make)
    maker.start()
    assert midway.reached.wait(PATIENCE)
    # What another process reads while the maker is midway: nothing made yet.
    with sqlite3.connect(path) as peek:
        tables = peek.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    midway.go.set()
    maker.join(PATIENCE)
    assert not failure, failure
    assert tables == [], f"a part of the store was visible while it was made: {tables}"


def test_a_store_of_only_ratchet_table_names_without_runs_is_still_refused(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as other:
        other.execute("CREATE TABLE leases (x)")
    with pytest.raises(StoreUnavailable, match="not a Ratchet store"):
        SqliteDatabase(path)
    with sqlite3.connect(path) as other:
        assert other.execute("SELECT name FROM sqlite_master").fetchall() == [("leases",)]

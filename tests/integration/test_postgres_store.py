"""The Postgres store's own guarantees, beside the conformance suites it shares with the others:
which databases it takes (its own, an empty one) and which it refuses without writing a byte,
how a new store is made once by many workers at once, and how commits from many connections
race on a real cluster (tests/postgres_support.py)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from ratchet.adapters.postgres import database as postgres_database
from ratchet.adapters.postgres.database import (
    _SCHEMA,
    _UPGRADES,
    MARKER_TABLE,
    SCHEMA_VERSION,
    PostgresDatabase,
    PostgresUrl,
)
from ratchet.adapters.postgres.ledger import PostgresLedger
from ratchet.adapters.postgres.store import PostgresCheckpointStore
from ratchet.errors import StaleVersion, StoreBusy, StoreMissing, StoreUnavailable
from ratchet.ports import LedgerEntry
from tests.conformance.test_store_contract import new_run, step_commit
from tests.postgres_support import Cluster

RACERS = 8


@pytest.fixture
def database(postgres: Cluster) -> Iterator[str]:
    """An empty database of the test's own: its URL."""
    name = postgres.fresh_database()
    yield postgres.url(name)
    postgres.drop_database(name)


def _rows(url: str) -> list[tuple[str, list[tuple[str]]]]:
    """Every table of the database with its rows, as text, to compare before and after."""
    with psycopg.connect(url) as connection:
        tables = [
            str(name)
            for (name,) in connection.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'public' ORDER BY table_name"
            )
        ]
        return [
            (table, connection.execute(f"SELECT t::text FROM {table} AS t ORDER BY 1").fetchall())
            for table in tables
        ]


def test_a_database_of_another_application_is_refused_in_one_line_and_left_as_it_was(database):
    with psycopg.connect(database) as connection:
        connection.execute("CREATE TABLE invoices (id integer PRIMARY KEY, total numeric)")
        connection.execute("INSERT INTO invoices VALUES (1, 99.5)")
    before = _rows(database)

    with pytest.raises(StoreUnavailable) as refused:
        PostgresDatabase(PostgresUrl.parse(database))

    message = str(refused.value)
    assert "not a Ratchet store: it has tables of another application (invoices)" in message
    assert "nothing was changed" in message
    assert "\n" not in message
    assert _rows(database) == before


def test_an_empty_database_becomes_a_store_only_when_asked_to(database):
    url = PostgresUrl.parse(database)

    with pytest.raises(StoreMissing, match=r"no Ratchet store in .*start a run first"):
        PostgresDatabase(url, create=False)
    assert _rows(database) == []

    PostgresDatabase(url).close()
    PostgresDatabase(url, create=False).close()  # a store now: opened as it is
    tables = dict(_rows(database))
    assert tables[MARKER_TABLE][0][0].startswith(f"({SCHEMA_VERSION},")
    assert {"runs", "checkpoints", "idempotency", "mailbox"} <= tables.keys()


def test_workers_that_start_at_once_on_an_empty_database_make_one_store(database):
    # Eight workers started together on an empty database: each finds it empty, and each
    # would make it; one does (in one transaction), the others wait and find it made.
    url = PostgresUrl.parse(database)
    start = threading.Barrier(RACERS)

    def open_store(_: int) -> None:
        start.wait(timeout=30)
        PostgresDatabase(url).close()

    with ThreadPoolExecutor(RACERS) as pool:
        list(pool.map(open_store, range(RACERS)))

    assert len(dict(_rows(database))[MARKER_TABLE]) == 1


def test_a_store_a_newer_ratchet_made_is_refused_and_left_as_it_was(database):
    PostgresDatabase(PostgresUrl.parse(database)).close()
    with psycopg.connect(database) as connection:
        connection.execute(f"UPDATE {MARKER_TABLE} SET schema_version = 99")
    before = _rows(database)

    with pytest.raises(StoreUnavailable, match=r"schema 99, which this Ratchet .* upgrade Ratchet"):
        PostgresDatabase(PostgresUrl.parse(database))

    assert _rows(database) == before


VERSION_1_SHA256 = "4d77e52c3aefccaf29ac06589b490f6efa9043bee4b81d14ae6daed2a22bd667"
"""The schema text of version 1, as the first Postgres stores were made: pinned, since stores
made by it exist. A change to the schema is an upgrade step (`_UPGRADES`), never an edit of it."""


def _version_1_store(url: str) -> None:
    """The database made a store as a Ratchet of schema version 1 made it."""
    with psycopg.connect(url) as connection:
        connection.execute(_SCHEMA.encode())


def _indexes(url: str) -> set[str]:
    with psycopg.connect(url) as connection:
        rows = connection.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")
        return {str(name) for (name,) in rows}


def test_the_version_1_schema_is_as_the_first_stores_were_made():
    assert hashlib.sha256(_SCHEMA.encode()).hexdigest() == VERSION_1_SHA256
    assert SCHEMA_VERSION == 1 + len(_UPGRADES) == max(_UPGRADES) + 1


def test_a_store_of_schema_1_is_upgraded_by_the_first_write_and_then_works(database):
    # Given a store made by schema 1, holding a run, with no blob index yet
    _version_1_store(database)
    url = PostgresUrl.parse(database)
    reader = PostgresDatabase(url, create=False)  # a reading command: read as it is
    assert (reader.found_version, reader.upgraded_from) == (1, None)
    state, created = new_run()
    assert PostgresCheckpointStore(reader).create_run(state, created)
    reader.close()
    assert dict(_rows(database))[MARKER_TABLE][0][0].startswith("(1,")
    assert "blobs_by_touch" not in _indexes(database)

    # When a writing command opens it
    writer = PostgresDatabase(url)

    # Then every step is done, the marker says so, and the run made before loads and commits
    assert (writer.found_version, writer.upgraded_from) == (1, 1)
    assert dict(_rows(database))[MARKER_TABLE][0][0].startswith(f"({SCHEMA_VERSION},")
    assert {"blobs_by_touch", "deliveries_due", "signing_keys_pkey"} <= _indexes(database)
    store = PostgresCheckpointStore(writer)
    assert store.load_head("r1") == state
    PostgresLedger(writer).begin(
        LedgerEntry(key="r1/step-1", run_id="r1", step=1, args_hash="h", decision={})
    )
    store.commit(step_commit(state, 1))
    assert [c.version for c in store.list_checkpoints("r1")] == [1, 2]
    writer.close()
    again = PostgresDatabase(url)
    assert (again.found_version, again.upgraded_from) == (SCHEMA_VERSION, None)
    again.close()


def test_workers_that_start_at_once_on_a_schema_1_store_upgrade_it_once(database):
    # Eight writers of the new Ratchet opening an old store together: one upgrades it (its
    # steps are not repeatable: a second CREATE INDEX would fail), the others wait for it.
    _version_1_store(database)
    url = PostgresUrl.parse(database)
    start = threading.Barrier(RACERS)

    def open_store(_: int) -> int | None:
        start.wait(timeout=30)
        db = PostgresDatabase(url)
        db.close()
        return db.upgraded_from

    with ThreadPoolExecutor(RACERS) as pool:
        upgraded = list(pool.map(open_store, range(RACERS)))

    assert sorted(upgraded, key=str) == [1] + [None] * (RACERS - 1)
    assert dict(_rows(database))[MARKER_TABLE][0][0].startswith(f"({SCHEMA_VERSION},")


def test_reading_an_older_store_a_table_it_lacks_asks_for_migrate_in_one_line(database):
    # Given a store of schema 1, opened by a command that only reads (it is read as it is)
    _version_1_store(database)
    reader = PostgresDatabase(PostgresUrl.parse(database), create=False)
    before = _rows(database)
    try:
        # When it reads a table a later version added (webhook deliveries, in version 3)
        with pytest.raises(StoreUnavailable) as refused, reader.read() as tx:
            tx.execute("SELECT count(*) FROM deliveries")
    finally:
        reader.close()

    # Then it says so in one line, naming the command that upgrades it, and changes nothing
    assert str(refused.value) == (
        f"the Postgres store {PostgresUrl.parse(database).where} is of schema 1, older than "
        f"this Ratchet's ({SCHEMA_VERSION}): run `ratchet migrate` to upgrade it"
    )
    assert _rows(database) == before


def test_a_role_whose_rights_were_taken_after_it_opened_the_store_is_one_line(postgres, database):
    # Given a role that opened the store, then lost its right to read a table
    store = PostgresDatabase(PostgresUrl.parse(database))
    store.close()
    with psycopg.connect(database, autocommit=True) as connection:
        connection.execute("DROP ROLE IF EXISTS worker")
        connection.execute("CREATE ROLE worker LOGIN")
        connection.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO worker")
    try:
        as_worker = PostgresDatabase(PostgresUrl.parse(database.replace("postgres@", "worker@")))
        with psycopg.connect(database, autocommit=True) as connection:
            connection.execute("REVOKE SELECT ON runs FROM worker")
        # When it reads the runs, then the refusal is one line, not psycopg's error
        with pytest.raises(StoreUnavailable) as refused, as_worker.read() as tx:
            tx.execute("SELECT count(*) FROM runs")
        as_worker.close()
        assert "cannot be used: permission denied for table runs" in str(refused.value)
        assert "\n" not in str(refused.value)
    finally:
        with psycopg.connect(database, autocommit=True) as connection:
            connection.execute("DROP OWNED BY worker")
        postgres.admin("DROP ROLE worker")


def test_an_older_ratchet_refuses_a_store_upgraded_past_it(database, monkeypatch):
    _version_1_store(database)
    PostgresDatabase(PostgresUrl.parse(database)).close()  # upgraded
    before = _rows(database)
    monkeypatch.setattr(postgres_database, "SCHEMA_VERSION", 1)  # a Ratchet of schema 1

    newer = rf"schema {SCHEMA_VERSION}, which this Ratchet \(schema 1\)"
    with pytest.raises(StoreUnavailable, match=newer):
        PostgresDatabase(PostgresUrl.parse(database))

    assert _rows(database) == before


def test_a_missing_database_is_one_line_naming_it_and_no_password(postgres: Cluster):
    url = postgres.url("nowhere").replace("postgres@", "postgres:hunter2@")

    with pytest.raises(StoreUnavailable) as refused:
        PostgresDatabase(PostgresUrl.parse(url))

    message = str(refused.value)
    assert 'database "nowhere" does not exist' in message
    assert "hunter2" not in message
    assert "\n" not in message


def test_of_commits_racing_from_one_version_on_their_own_connections_one_lands(database):
    # Eight workers, each with a pool of its own, commit step 1 of one run from the version
    # they all read: the conditional update lets exactly one through; every other is stale
    # and wrote nothing (one record for the step, the winner's).
    url = PostgresUrl.parse(database)
    first = PostgresDatabase(url)
    state, created = new_run()
    PostgresCheckpointStore(first).create_run(state, created)
    PostgresLedger(first).begin(
        LedgerEntry(key="r1/step-1", run_id="r1", step=1, args_hash="h", decision={})
    )
    start = threading.Barrier(RACERS)

    def commit(n: int) -> str:
        db = PostgresDatabase(url)
        try:
            store = PostgresCheckpointStore(db)
            start.wait(timeout=30)
            try:
                store.commit(step_commit(state, 1, text=f"worker {n}"))
            except StaleVersion:
                return "stale"
            return f"worker {n}"
        finally:
            db.close()

    with ThreadPoolExecutor(RACERS) as pool:
        outcomes = list(pool.map(commit, range(RACERS)))

    winners = [o for o in outcomes if o != "stale"]
    assert len(winners) == 1, outcomes
    records = PostgresCheckpointStore(first).list_checkpoints("r1")
    assert [c.version for c in records] == [1, 2]
    head = PostgresCheckpointStore(first).load_head("r1")
    assert head is not None
    assert head.last_result == winners[0]
    first.close()


def test_a_tools_output_holding_nul_completes_its_key_and_reads_back_whole(database):
    # A text column of Postgres cannot hold NUL; a tool's output may, and SQLite keeps it.
    db = PostgresDatabase(PostgresUrl.parse(database))
    store, ledger = PostgresCheckpointStore(db), PostgresLedger(db)
    state, created = new_run()
    store.create_run(state, created)
    for key in ("r1/step-1", "r1/step-2"):
        ledger.begin(LedgerEntry(key=key, run_id="r1", step=1, args_hash="h", decision={}))
    output = "row 1\x00row 2 \N{GRINNING FACE}"

    ledger.complete("r1/step-2", output)
    store.commit(step_commit(state, 1, text=output))

    for key in ("r1/step-1", "r1/step-2"):
        completed = ledger.get(key)
        assert completed is not None
        assert completed.result == output
    head = store.load_head("r1")
    assert head is not None
    assert head.last_result == output
    db.close()


def test_after_the_database_restarts_a_pool_reconnects_and_a_lost_transaction_is_busy(
    postgres: Cluster, database
):
    # A worker's pool holds connections the restart cuts: a transaction on one of them is
    # StoreBusy in one line (nothing written, safe to retry), and the pool makes new ones.
    db = PostgresDatabase(PostgresUrl.parse(database + "&pool_size=2"))
    store = PostgresCheckpointStore(db)
    state, created = new_run()
    store.create_run(state, created)

    postgres.restart()

    head, refusals = store.load_head, []
    for _ in range(5):
        try:
            loaded = head("r1")
            break
        except StoreBusy as busy:
            refusals.append(str(busy))
    else:
        pytest.fail(f"never reconnected: {refusals}")
    print(f"transactions refused as busy after the restart: {len(refusals)}")
    assert loaded == state
    assert len(refusals) <= 2, "at most one per connection the pool held"
    assert all("did not answer" in r and "\n" not in r for r in refusals), refusals
    store.commit(step_commit(state, 1))
    assert [c.version for c in store.list_checkpoints("r1")] == [1, 2]
    db.close()


def test_a_role_without_rights_is_refused_in_one_line_and_nothing_is_made(postgres, database):
    # Since Postgres 15 a role may not create tables in a database's public schema it does
    # not own: such a role cannot make the store, and says so.
    with psycopg.connect(database, autocommit=True) as connection:
        connection.execute("DROP ROLE IF EXISTS reader")
        connection.execute("CREATE ROLE reader LOGIN")
    try:
        as_reader = database.replace("postgres@", "reader@")

        with pytest.raises(StoreUnavailable) as refused:
            PostgresDatabase(PostgresUrl.parse(as_reader))

        message = str(refused.value)
        assert "cannot be used: permission denied for schema public" in message
        assert "\n" not in message
        assert _rows(database) == []
    finally:
        postgres.admin("DROP ROLE reader")

"""`ratchet migrate` and `ratchet gc` on SQLite and Postgres stores, through the real command:
each test runs on both (`store`), but for the few about what only a SQLite store can be.

`migrate` runs over `tests/fixtures/stores/schema_versions.db`, a store holding heads as every
state schema stored them (made by `tests/fixtures/stores/make_schema_versions.py`; on Postgres,
its rows copied into a new store). `gc` runs over a store made here: finished runs past the
retention, live runs made to look just as old, and blobs referenced from kept records, from
deleted records only, and from nothing (files beside a SQLite store, rows of a Postgres one).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from ratchet.adapters.file_blobs import FileBlobStore
from ratchet.client import Client
from ratchet.runtime import connect
from ratchet.state import SCHEMA_VERSION, BlobRef, RunState, RunStatus, StepCompleted, utcnow
from ratchet.stored import parse_event, window_start
from tests.fixtures.stores.make_schema_versions import FIXTURE, RUNS
from tests.postgres_support import Cluster
from tests.processes import Cli, PostgresCli


def _sha256(path: Path) -> str:
    # Read by another process: closing a descriptor of the file here would drop every POSIX
    # lock this process's SQLite connections hold on it (a run's data keeps one open in the
    # thread that used it), and the next worker to close could then delete the WAL and its
    # index under them (sqlite.org/howtocorrupt.html, 2.2).
    read = (
        "import hashlib, pathlib, sys; "
        "print(hashlib.sha256(pathlib.Path(sys.argv[1]).read_bytes()).hexdigest())"
    )
    done = subprocess.run([sys.executable, "-c", read, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@dataclass
class Store:
    """A store under test, SQLite or Postgres, with what the tests read and write of it
    directly: its rows (SQL with `?` for its parameters), a fingerprint of all it holds, and
    its blobs (files beside a SQLite store, rows of a Postgres one)."""

    cli: Cli

    @property
    def on_postgres(self) -> bool:
        return isinstance(self.cli, PostgresCli)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.cli.root / "ratchet.db", isolation_level=None)

    def rows(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        if self.on_postgres:
            import psycopg

            with psycopg.connect(self.cli.store) as pg:
                return [tuple(row) for row in pg.execute(_pg(sql), args).fetchall()]
        db = self._connect()
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    def write(self, sql: str, *args: object) -> None:
        if self.on_postgres:
            import psycopg

            if sql.startswith("PRAGMA"):
                return  # SQLite's own (a WAL checkpoint): nothing to do on Postgres
            with psycopg.connect(self.cli.store, autocommit=True) as pg:
                pg.execute(_pg(sql), args)
            return
        db = self._connect()
        try:
            db.execute(sql, args)
        finally:
            db.close()

    def fingerprint(self) -> str:
        """What changes if any byte the store holds does: the file, or every table's rows."""
        if not self.on_postgres:
            return _sha256(self.cli.root / "ratchet.db")
        tables = [
            str(name)
            for (name,) in self.rows(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() ORDER BY table_name"
            )
        ]
        digest = hashlib.sha256()
        for table in tables:
            text = self.rows(f"SELECT string_agg(t::text, '|' ORDER BY t::text) FROM {table} t")
            digest.update(f"{table}:{text}".encode())
        return digest.hexdigest()

    def blob_names(self) -> set[str]:
        if self.on_postgres:
            return {str(address) for (address,) in self.rows("SELECT address FROM blobs")}
        root = self.cli.root / "ratchet.blobs"
        return {path.name for path in root.glob("*/*")} if root.exists() else set()

    def age_blobs(self, hours: float) -> None:
        """Every blob stored so far, as if last put `hours` ago."""
        if self.on_postgres:
            self.write(f"UPDATE blobs SET touched_at = now() - interval '{hours} hours'")
            return
        then = time.time() - hours * 3600
        for path in (self.cli.root / "ratchet.blobs").glob("*/*"):
            os.utime(path, (then, then))

    def put_blob(self, data: bytes) -> BlobRef:
        if not self.on_postgres:
            return FileBlobStore(self.cli.root / "ratchet.blobs").put(data)
        client = connect(self.cli.store, environ={})
        try:
            return client.runtime.blobs.put(data)
        finally:
            client.close()


def _pg(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


@pytest.fixture(params=["sqlite", "postgres"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Store]:
    if request.param == "sqlite":
        yield Store(Cli(tmp_path))
        return
    # The files a Postgres store's processes keep on their host are in the working
    # directory's .ratchet: the test's, for this process and every one it starts.
    monkeypatch.chdir(tmp_path)
    postgres: Cluster = request.getfixturevalue("postgres")
    name = postgres.fresh_database()
    yield Store(PostgresCli(tmp_path, url=postgres.url(name)))
    postgres.drop_database(name)


def _copy_fixture(into: Store) -> None:
    """The fixture's rows in the store: the file itself for SQLite; for Postgres, a store
    made empty and given every row of the fixture's tables (its text as Postgres's types)."""
    if not into.on_postgres:
        shutil.copyfile(FIXTURE, into.cli.root / "ratchet.db")
        return
    from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl

    PostgresDatabase(PostgresUrl.parse(into.cli.store)).close()
    source = sqlite3.connect(FIXTURE)
    try:
        for table, as_bytes in (
            ("runs", ()),
            ("run_static", ()),
            ("checkpoints", ()),
            ("idempotency", ("result",)),
            ("run_data", ("key", "value")),
        ):
            cursor = source.execute(f"SELECT * FROM {table}")
            names = [column[0] for column in cursor.description]
            for row in cursor.fetchall():
                values = [
                    v.encode() if n in as_bytes and isinstance(v, str) else v
                    for n, v in zip(names, row, strict=True)
                ]
                marks = ", ".join("?" for _ in names)
                into.write(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks})", *values)
    finally:
        source.close()


@pytest.fixture
def fixture_store(store: Store) -> Store:
    _copy_fixture(store)
    return store


@pytest.fixture
def sqlite_fixture_store(tmp_path: Path) -> Store:
    """The fixture as a SQLite store only: for what only a SQLite store can have been (one
    made before the `run_static` table; every Postgres store has it)."""
    made = Store(Cli(tmp_path))
    _copy_fixture(made)
    return made


# --- migrate -----------------------------------------------------------------------------------


def test_the_fixture_holds_every_past_schema_in_the_form_it_was_stored():
    db = sqlite3.connect(FIXTURE)
    try:
        heads = dict(db.execute("SELECT run_id, state FROM runs"))
        static = {run_id for (run_id,) in db.execute("SELECT run_id FROM run_static")}
    finally:
        db.close()
    assert set(heads) == set(RUNS)
    for run_id, run in RUNS.items():
        head = json.loads(heads[run_id])
        assert head["schema_version"] == run.schema
        # Schema 2 and earlier stored the whole state; schema 3 on, a lean head beside its
        # static part.
        assert ("goal" in head) == (run.schema <= 2)
        assert (run_id in static) == (run.schema >= 3)
    assert {run.schema for run in RUNS.values()} == set(range(1, SCHEMA_VERSION + 1))


def test_migrate_dry_run_reports_each_schema_version_and_changes_no_byte(fixture_store):
    before = fixture_store.fingerprint()

    report = fixture_store.cli.json("migrate", "--dry-run")
    text = fixture_store.cli.ok("migrate", "--dry-run")

    assert fixture_store.fingerprint() == before
    assert report["dry_run"] is True
    assert report["ok"] is True
    assert report["versions"] == {
        "1": {"runs": 2, "upgrade": 2},
        "2": {"runs": 2, "upgrade": 2},
        "3": {"runs": 2, "upgrade": 2},
        "4": {"runs": 2, "current": 2},
    }
    assert {run["run_id"]: run["from_version"] for run in report["runs"]} == {
        run_id: run.schema for run_id, run in RUNS.items()
    }
    assert "would upgrade 6 of 8 runs to schema 4 (dry run: nothing changed)" in text
    for version in ("1", "2", "3", "4"):
        assert f"schema {version}: 2 runs" in text


def test_migrate_reports_what_it_cannot_read_and_leaves_it_alone(fixture_store):
    # Given a head from a newer Ratchet and a head whose JSON is damaged
    fixture_store.write("UPDATE runs SET state = 'not json' WHERE run_id = 'v1-done'")
    newer = json.dumps({"schema_version": SCHEMA_VERSION + 1})
    fixture_store.write("UPDATE runs SET state = ? WHERE run_id = 'v3-done'", newer)
    before = fixture_store.fingerprint()

    dry = fixture_store.cli.run("migrate", "--dry-run", "--json")
    assert fixture_store.fingerprint() == before
    done = fixture_store.cli.run("migrate", "--json")

    for result in (dry, done):
        assert result.returncode == 1, result.stderr
        report = json.loads(result.stdout)
        runs = {run["run_id"]: run for run in report["runs"]}
        assert runs["v1-done"]["outcome"] == "unreadable"
        assert runs["v1-done"]["from_version"] is None
        assert runs["v3-done"]["outcome"] == "unreadable"
        assert "upgrade Ratchet" in runs["v3-done"]["reason"]
        assert report["versions"]["unknown"] == {"runs": 1, "unreadable": 1}
        assert report["versions"][str(SCHEMA_VERSION + 1)] == {"runs": 1, "unreadable": 1}
    assert fixture_store.rows("SELECT state FROM runs WHERE run_id = 'v1-done'") == [("not json",)]
    upgraded = [
        run["run_id"] for run in json.loads(done.stdout)["runs"] if run["outcome"] == "upgraded"
    ]
    assert sorted(upgraded) == ["v1-running", "v2-done", "v2-waiting", "v3-running"]


def test_migrate_upgrades_every_head_and_every_run_then_resumes(fixture_store):
    heads_before = {run_id: fixture_store.cli.head(run_id) for run_id in RUNS}

    report = fixture_store.cli.json("migrate")

    outcomes = {run["run_id"]: run["outcome"] for run in report["runs"]}
    assert outcomes == {
        run_id: "current" if run.schema == SCHEMA_VERSION else "upgraded"
        for run_id, run in RUNS.items()
    }
    # Every head is now stored as today's Ratchet stores it, and loads as it did before.
    static = {run_id for (run_id,) in fixture_store.rows("SELECT run_id FROM run_static")}
    assert static == set(RUNS)
    for run_id, head in fixture_store.rows("SELECT run_id, state FROM runs"):
        stored = json.loads(str(head))
        assert stored["schema_version"] == SCHEMA_VERSION
        assert "goal" not in stored
        assert "messages" not in stored
        assert fixture_store.cli.head(str(run_id)) == heads_before[str(run_id)]
    assert fixture_store.cli.json("migrate", "--dry-run")["versions"] == {
        str(SCHEMA_VERSION): {"runs": len(RUNS), "current": len(RUNS)}
    }

    # A worker takes the running runs' next steps and, once approved, finishes the waiting one.
    fixture_store.cli.ok("approve", "v2-waiting")
    fixture_store.cli.work_until_idle()
    for run_id in ("v1-running", "v3-running", "v4-running"):
        after = fixture_store.cli.head(run_id)
        assert after.step > heads_before[run_id].step
        assert after.status is RunStatus.WAITING  # at the migration's question, as usual
    finished = fixture_store.cli.head("v2-waiting")
    assert finished.status is RunStatus.DONE
    # The fixture holds the store alone, not the runs' app data: the migration's check of its
    # rows (`verify`) has nothing of the steps before the fixture was made to count.
    assert finished.summary is not None
    assert finished.summary.startswith("Copied 1,000 rows")


def test_migrate_keeps_a_whole_head_whose_window_is_not_in_its_records(fixture_store):
    # Given a schema-2 head stored whole, whose step records are gone: only its head holds
    # the window, which the lean form would read back from the records
    fixture_store.write("DELETE FROM checkpoints WHERE run_id = 'v2-waiting' AND step > 0")
    before = fixture_store.rows("SELECT state FROM runs WHERE run_id = 'v2-waiting'")

    result = fixture_store.cli.run("migrate", "--json")

    assert result.returncode == 1
    (run,) = [r for r in json.loads(result.stdout)["runs"] if r["run_id"] == "v2-waiting"]
    assert run["outcome"] == "kept"
    assert "window" in run["reason"]
    assert fixture_store.rows("SELECT state FROM runs WHERE run_id = 'v2-waiting'") == before
    assert fixture_store.cli.head("v2-waiting").messages


def test_migrate_reads_a_store_made_before_run_static_and_adds_it(sqlite_fixture_store):
    # Given a store as schema 2 left it: whole heads, and no run_static table
    sqlite_fixture_store.write("DELETE FROM runs WHERE run_id LIKE 'v3-%' OR run_id LIKE 'v4-%'")
    sqlite_fixture_store.write("DROP TABLE run_static")
    sqlite_fixture_store.write("PRAGMA wal_checkpoint(TRUNCATE)")
    before = sqlite_fixture_store.fingerprint()

    dry = sqlite_fixture_store.cli.json("migrate", "--dry-run")
    assert sqlite_fixture_store.fingerprint() == before
    report = sqlite_fixture_store.cli.json("migrate")

    assert dry["versions"] == {"1": {"runs": 2, "upgrade": 2}, "2": {"runs": 2, "upgrade": 2}}
    assert report["versions"] == {
        "1": {"runs": 2, "upgraded": 2},
        "2": {"runs": 2, "upgraded": 2},
    }
    static = {run_id for (run_id,) in sqlite_fixture_store.rows("SELECT run_id FROM run_static")}
    assert static == {"v1-done", "v1-running", "v2-done", "v2-waiting"}


def test_migrate_on_a_dynamodb_url_without_a_region_is_one_line(sqlite_fixture_store):
    # On a stack's tables migrate indexes old heads (tests/integration/test_dynamodb_cli.py);
    # a URL it cannot use is refused before anything is read.
    result = sqlite_fixture_store.cli.run(
        "--store", "dynamodb://runs?ledger=ledger&app=app", "migrate"
    )
    # (the second --store wins)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "needs a region" in result.stderr


# --- gc ----------------------------------------------------------------------------------------

LONG_AGO = (utcnow() - timedelta(days=100)).isoformat()


def _finish_migration(client: Client, run_id: str) -> None:
    client.work(run_id)
    client.approve(run_id, by="ops@example.com")
    client.work(run_id)


@pytest.fixture
def aged_store(store: Store) -> dict[str, object]:
    """Finished runs past the retention, live runs as old, one recent run, and blobs."""
    cli = store.cli
    client = connect(cli.store, environ={})
    try:
        client.start(run_id="old-done", scenario="migration", input={"batches": 8})
        _finish_migration(client, "old-done")
        # Its goal is over the inline budget: the note's arguments go to a blob, which the
        # run's only step (inside its window) references.
        client.run("old-note", scenario="notebook", goal="Keep this. " * 300)
        client.run("recent-note", scenario="notebook", goal="Recent.")
        client.start(run_id="live-running", scenario="migration", input={"batches": 8})
        engine = client.runtime.engine(worker_id="test", logger=client.logger)
        for _ in range(8):
            engine.advance("live-running")
        client.start(run_id="live-waiting", scenario="migration", input={"batches": 1})
        client.work("live-waiting")
    finally:
        client.close()
    orphan = store.put_blob(b"referenced by nothing")
    old_only = store.put_blob(b"referenced by an old record only")
    # Given a record before old-done's window that references a blob nothing else does
    (version, event) = store.rows(
        "SELECT version, event FROM checkpoints WHERE run_id = 'old-done' AND step = 2 "
        'AND event LIKE \'{"kind":"step"%\'',
    )[0]
    record = json.loads(str(event))
    record["output"]["blob"] = {"sha256": old_only.sha256, "size": old_only.size}
    store.write(
        "UPDATE checkpoints SET event = ? WHERE run_id = 'old-done' AND version = ?",
        json.dumps(record),
        version,
    )
    store.write("UPDATE runs SET updated_at = ? WHERE run_id <> 'recent-note'", LONG_AGO)
    store.age_blobs(hours=2)
    fresh = store.put_blob(b"written a moment ago")
    return {"store": store, "orphan": orphan, "old_only": old_only, "fresh": fresh}


def test_gc_trims_old_finished_runs_and_keeps_every_live_run_resumable(aged_store):
    store = aged_store["store"]
    assert isinstance(store, Store)
    cli = store.cli
    records = "SELECT version, step, event FROM checkpoints WHERE run_id = ? ORDER BY version"
    ledger = "SELECT key, step, status, result FROM idempotency WHERE run_id = ? ORDER BY key"
    runs = ("old-done", "old-note", "recent-note", "live-running", "live-waiting")
    heads: dict[str, RunState] = {run_id: cli.head(run_id) for run_id in runs}
    rows_before = {run_id: store.rows(records, run_id) for run_id in runs}
    ledger_before = {run_id: store.rows(ledger, run_id) for run_id in runs}
    blobs_before = store.blob_names()
    note_blob = heads["old-note"].messages[0].blob
    assert note_blob is not None
    assert note_blob.sha256 in blobs_before
    start = window_start(heads["old-done"])
    old_records = [r for r in rows_before["old-done"][1:] if int(str(r[1])) < start]
    old_keys = [r for r in ledger_before["old-done"] if int(str(r[1])) < start]
    assert old_records
    assert old_keys

    # A dry run counts what gc deletes and changes nothing
    store.write("PRAGMA wal_checkpoint(TRUNCATE)")  # so the file alone holds the store
    before = store.fingerprint()
    dry = cli.json("gc", "--older-than", "30", "--dry-run")
    assert store.fingerprint() == before
    assert store.blob_names() == blobs_before

    report = cli.json("gc", "--older-than", "30")

    for counted in (dry, report):
        assert counted["runs_trimmed"] == 1
        assert counted["records_deleted"] == len(old_records)
        assert counted["ledger_entries_deleted"] == len(old_keys)
        assert counted["blobs_deleted"] == 2
        assert counted["live_runs"] == 2
        assert counted["recent_runs"] == 1
    # The finished run keeps its first record and its window: it loads as before.
    kept = store.rows(records, "old-done")
    assert kept == [rows_before["old-done"][0]] + [
        r for r in rows_before["old-done"][1:] if int(str(r[1])) >= start
    ]
    assert cli.head("old-done") == heads["old-done"]
    assert [r for r in store.rows(ledger, "old-done") if int(str(r[1])) < start] == []
    # Live and recent runs are untouched, whatever their age.
    for run_id in ("old-note", "recent-note", "live-running", "live-waiting"):
        assert store.rows(records, run_id) == rows_before[run_id]
        assert store.rows(ledger, run_id) == ledger_before[run_id]
        assert cli.head(run_id) == heads[run_id]
    # Blobs: the referenced and the fresh kept, the unreferenced deleted.
    orphan, old_only, fresh = (aged_store[k] for k in ("orphan", "old_only", "fresh"))
    left = store.blob_names()
    assert left == blobs_before - {orphan.sha256, old_only.sha256}
    assert {note_blob.sha256, fresh.sha256} <= left

    # Every live run resumes: the running one takes its next steps, the waiting one finishes.
    cli.ok("approve", "live-waiting")
    cli.work_until_idle()
    assert cli.head("live-running").step > heads["live-running"].step
    assert cli.head("live-waiting").status is RunStatus.DONE
    assert cli.verify("live-waiting")["ok"] is True
    assert cli.json("gc", "--older-than", "30")["records_deleted"] == 0


def test_gc_keeps_a_failed_runs_window_so_it_can_be_retried(store):
    cli = store.cli
    client = connect(cli.store, environ={})
    try:
        client.start(run_id="failing", scenario="migration", input={"batches": 8})
        engine = client.runtime.engine(worker_id="test", logger=client.logger)
        for _ in range(8):
            engine.advance("failing")
        engine.fail("failing", "the legacy database went away")
    finally:
        client.close()
    store.write("UPDATE runs SET updated_at = ?", LONG_AGO)
    before = cli.head("failing")

    assert cli.json("gc", "--older-than", "30")["records_deleted"] > 0

    assert cli.head("failing") == before
    events = [
        parse_event(str(text), run_id="failing", step=int(str(step)))
        for (step, text) in store.rows(
            "SELECT step, event FROM checkpoints WHERE run_id = 'failing'"
        )
    ]
    steps = [e.step for e in events if isinstance(e, StepCompleted)]
    assert steps == list(range(window_start(before), before.step + 1))
    cli.ok("retry", "failing")
    cli.work_until_idle()
    assert cli.head("failing").step > before.step


def test_gc_refuses_a_dynamodb_store_and_needs_its_retention(tmp_path):
    cli = Cli(tmp_path)
    aws = cli.run("--store", "dynamodb://runs?ledger=ledger&app=app", "gc", "--older-than", "1")
    missing = cli.run("gc")
    for result in (aws, missing):
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1
        assert "Traceback" not in result.stderr
    assert "needs a local sqlite:// store" in aws.stderr
    assert "needs --older-than DAYS" in missing.stderr

"""A step's decision is kept once: in the ledger while the step is in flight (a retry reuses it),
in the step's record once it commits (the commit drops the ledger's copy). A store an older
Ratchet made, whose ledger requires a decision on every row, is migrated by the first
completion written to it (not by opening it: a reader changes no byte), and its old rows read
as they did."""

from __future__ import annotations

import hashlib
import logging
import shutil
import sqlite3
from pathlib import Path

from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.ledger import SqliteLedger
from ratchet.ports import LedgerStatus
from ratchet.runtime import open_runtime
from tests.fixtures.stores.make_schema_versions import FIXTURE

LOG = logging.getLogger("ratchet.tests.kept_once")


def _decision_required(path: Path) -> bool:
    connection = sqlite3.connect(path)
    try:
        columns = {row[1]: row[3] for row in connection.execute("PRAGMA table_info(idempotency)")}
    finally:
        connection.close()
    return bool(columns["decision"])


def test_an_old_store_is_migrated_and_its_ledger_rows_read_as_before(tmp_path: Path):
    # Given a store an older Ratchet made: every ledger row holds its decision, NOT NULL
    store = tmp_path / "ratchet.db"
    shutil.copy(FIXTURE, store)
    assert _decision_required(store)
    old = sqlite3.connect(store)
    (old_count,) = old.execute("SELECT count(*) FROM idempotency").fetchone()
    old.close()

    # When today's code opens it to write, and takes a step of one of its runs
    runtime = open_runtime(f"sqlite:///{store}", create=False)
    try:
        before = runtime.ledger.get("v1-running/step-1")
        run = runtime.store.load_head("v1-running")
        assert run is not None
        moved = runtime.engine(worker_id="w", logger=LOG).advance("v1-running")
        committed = runtime.ledger.get(f"v1-running/step-{run.step + 1}")
    finally:
        runtime.close()

    # Then the table takes a NULL decision, the old rows are all there and read with theirs,
    # and the new step's completion dropped its own
    assert not _decision_required(store)
    after = sqlite3.connect(store)
    (count,) = after.execute("SELECT count(*) FROM idempotency").fetchone()
    after.close()
    assert count == old_count + 1
    assert before is not None
    assert before.decision is not None
    assert before.status is LedgerStatus.COMPLETED
    assert moved.step == run.step + 1
    assert committed is not None
    assert (committed.status, committed.decision) == (LedgerStatus.COMPLETED, None)


def test_an_old_store_opened_and_read_is_left_as_it_is(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    shutil.copy(FIXTURE, store)
    before = hashlib.sha256(store.read_bytes()).hexdigest()

    db = SqliteDatabase(store, create=False)
    try:
        entry = SqliteLedger(db).get("v2-waiting/step-3")
    finally:
        db.close()

    assert entry is not None
    assert entry.decision is not None
    assert _decision_required(store)
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before

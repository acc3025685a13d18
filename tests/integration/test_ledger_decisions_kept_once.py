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

import pytest

from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.ledger import SqliteLedger
from ratchet.engine import Binding, Engine, Outcome
from ratchet.errors import StaleVersion
from ratchet.ports import LedgerStatus
from ratchet.runtime import open_runtime
from tests.fixtures.stores.make_schema_versions import FIXTURE
from tests.integration.test_in_progress_decisions import Notes, Writer
from tests.support import Harness, StubModel

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


def test_a_late_worker_stops_on_a_key_an_older_ratchet_completed_with_its_decision(
    tmp_path: Path,
):
    # Given engine B setting up its agent for step 1 while engine A takes step 1 and commits
    # it, and the key then reads as an older Ratchet left it: completed, its decision kept
    first = Harness(tmp_path, StubModel(total=1))
    first.start()
    notes = Notes()
    engine_a = first.engine_for(notes.agent(), Writer("A"))
    b_model = Writer("B")
    binding = Binding(notes.agent(), b_model)

    def bind_while_a_commits(state: object) -> Binding:
        assert engine_a.advance("run").outcome is Outcome.CONTINUE
        first.db.connection.execute(
            "UPDATE idempotency SET decision = ? WHERE key = 'run/step-1'",
            ('{"arguments":{"text":"A"},"name":"write_note"}',),
        )
        return binding

    engine_b = Engine(
        store=first.store,
        ledger=first.ledger,
        blobs=first.blobs,
        bind=bind_while_a_commits,
        worker_id="b",
        logger=LOG,
    )

    # When B goes on and finds the key completed
    with pytest.raises(StaleVersion):
        engine_b.advance("run")

    # Then it did not act on the decision it found: the note was written once, by A
    assert notes.calls == [("run/step-1", "A")]
    assert b_model.calls == 0

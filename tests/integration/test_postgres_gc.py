"""`ratchet gc` on a Postgres store racing a worker: a worker stores a step's blob, then commits
the head that references it, while gc weighs the same blob (old and unreferenced when gc read
the references). Whichever order the two meet in, the commit never lands without its blob.
The rest of gc on Postgres runs in tests/integration/test_housekeeping.py, beside SQLite."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import psycopg
import pytest

from ratchet.adapters.postgres.blobs import PostgresBlobStore
from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.postgres.housekeeping import PostgresHousekeeping
from ratchet.adapters.postgres.store import PostgresCheckpointStore
from ratchet.errors import BlobMissing
from ratchet.housekeeping import BLOB_GRACE, GcReport, collect_garbage
from ratchet.ports import StoredBlob
from ratchet.state import BlobRef, RunState, StepCompleted, ToolCall, ToolOutput, utcnow
from tests.conformance.test_store_contract import commit_of, new_run
from tests.postgres_support import scratch_store

OUTPUT = b"a tool's output, too long to keep inline " * 200
WAIT_SECONDS = 60.0


@pytest.fixture
def db(postgres: object) -> Iterator[PostgresDatabase]:
    with scratch_store() as open_store:
        yield open_store()


def _age_every_blob(db: PostgresDatabase) -> None:
    """Every blob stored so far as if last put twice gc's grace period ago."""
    with db.write() as tx:
        tx.execute("UPDATE blobs SET touched_at = now() - %s", (2 * BLOB_GRACE,))


def _commit_step_with_blob(db: PostgresDatabase, head: RunState, ref: BlobRef) -> None:
    """A worker's commit of step 1, whose output is the blob `ref`."""
    event = StepCompleted(
        step=1,
        key=f"{head.run_id}/step-1",
        call=ToolCall(name="fetch", arguments={}),
        output=ToolOutput(step=1, tool="fetch", text="(in a blob)", blob=ref),
        attempt=1,
        duration_ms=1.0,
    )
    PostgresCheckpointStore(db).commit(commit_of(head, event, step=1))


def _gc(housekeeping: PostgresHousekeeping) -> GcReport:
    return collect_garbage(housekeeping, older_than=timedelta(days=30), now=utcnow(), dry_run=False)


class _WorkerAfterListing(PostgresHousekeeping):
    """The store's own housekeeping, with a worker's put and commit landing at the worst
    moment: after gc listed the old blobs (and read the references), before it deletes."""

    def __init__(self, db: PostgresDatabase, worker: Callable[[], None]) -> None:
        super().__init__(db)
        self._worker = worker

    def blobs(self, touched_before: datetime) -> list[StoredBlob]:
        listed = super().blobs(touched_before)
        self._worker()
        return listed


def test_a_blob_put_again_and_committed_after_gc_listed_it_is_kept(db: PostgresDatabase):
    # Given an old blob no record references (a step that stored it, long ago, crashed before
    # its commit) and an old orphan, and a run at step 0
    blobs = PostgresBlobStore(db)
    ref = blobs.put(OUTPUT)
    orphan = blobs.put(b"referenced by nothing")
    _age_every_blob(db)
    head, created = new_run()
    assert PostgresCheckpointStore(db).create_run(head, created)

    def worker() -> None:
        # A step whose tool returns the same output: its blob is put again, then committed.
        assert blobs.put(OUTPUT) == ref
        _commit_step_with_blob(db, head, ref)

    # When gc runs, and the worker's put and commit land between its listing and its deletes
    report = _gc(_WorkerAfterListing(db, worker))

    # Then the orphan is deleted, the blob the commit references is kept, and the run reads it
    assert (report.blobs_deleted, report.blobs_kept) == (1, 1)
    assert blobs.get(ref) == OUTPUT
    with pytest.raises(BlobMissing):
        blobs.get(orphan)
    loaded = PostgresCheckpointStore(db).load_head("r1")
    assert loaded is not None
    assert loaded.step == 1


def _waiting_on_a_lock(db: PostgresDatabase) -> int:
    with psycopg.connect(db.url.conninfo, autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_put_under_way_when_gc_deletes_its_blob_keeps_it(db: PostgresDatabase):
    # Given an old, unreferenced blob, and a worker's put of the same content under way: its
    # transaction has written the row (touched it anew) and not yet committed
    blobs = PostgresBlobStore(db)
    ref = blobs.put(OUTPUT)
    _age_every_blob(db)
    head, created = new_run()
    assert PostgresCheckpointStore(db).create_run(head, created)
    putting = psycopg.connect(db.url.conninfo)
    # The statement PostgresBlobStore.put runs, held open in its transaction.
    putting.execute(
        "INSERT INTO blobs (address, data, touched_at) VALUES (%s, %s, now()) "
        "ON CONFLICT (address) DO UPDATE SET touched_at = excluded.touched_at",
        (ref.sha256, OUTPUT),
    )

    # When gc runs meanwhile: its delete of the blob waits for the put's transaction
    reports: list[GcReport] = []
    gc = threading.Thread(target=lambda: reports.append(_gc(PostgresHousekeeping(db))))
    gc.start()
    deadline = time.monotonic() + WAIT_SECONDS
    while _waiting_on_a_lock(db) == 0:
        assert gc.is_alive(), "gc ended without waiting for the put"
        assert time.monotonic() < deadline, "gc's delete never waited for the put"
        time.sleep(0.01)
    putting.commit()
    putting.close()
    _commit_step_with_blob(db, head, ref)
    gc.join(timeout=WAIT_SECONDS)

    # Then gc found the blob in use anew and kept it: the committed step reads it
    assert not gc.is_alive()
    assert reports[0].blobs_deleted == 0
    assert blobs.get(ref) == OUTPUT

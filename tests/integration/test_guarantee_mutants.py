"""Guarantees whose code could be broken with the suite staying green: each test here goes red
when its guarantee's code is broken that way (each was checked by breaking it once by hand).

- blob contents are checked against their SHA-256 on read, on disk and in S3;
- the SQLite ledger's completion lands in the same transaction as the step's commit;
- the SQLite migration data refuses a key it applied with other arguments;
- an approval expires after it was created, by the timeout asked for;
- execution names stay within Step Functions' 80 characters for the longest run ids, and
  differ for every run and generation.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws

from ratchet.adapters.file_blobs import FileBlobStore
from ratchet.adapters.s3_blobs import PREFIX, S3BlobStore
from ratchet.adapters.sqlite.approvals import SqliteApprovalBook
from ratchet.adapters.stepfunctions import execution_name
from ratchet.approvals.desk import ApprovalDesk
from ratchet.approvals.links import LinkSigner
from ratchet.errors import BlobCorrupt, IdempotencyConflict, InvalidInput, RatchetError
from ratchet.ports import LedgerStatus
from ratchet.runtime.local_approvals import LocalResumer
from ratchet.scenarios.migration_data import SqliteMigrationData
from ratchet.state import RUN_ID_PATTERN, RunStatus
from ratchet.waits import ApprovalStatus, Verdict
from tests.dynamodb_support import REGION
from tests.support import Harness, StubModel

# --- blobs: what is read back is what was stored --------------------------------------------

CONTENT = b"a large tool output " * 200
TAMPERED = b"A" + CONTENT[1:]


def test_a_blob_tampered_on_disk_is_refused_on_read(tmp_path: Path):
    blobs = FileBlobStore(tmp_path)
    ref = blobs.put(CONTENT)
    assert blobs.get(ref) == CONTENT
    stored = tmp_path / ref.sha256[:2] / ref.sha256

    stored.write_bytes(TAMPERED)

    with pytest.raises((RatchetError, ValueError), match=ref.sha256):
        blobs.get(ref)


@pytest.fixture
def s3_bucket() -> Iterator[tuple[object, str]]:
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket="ratchet-blobs")
        yield client, "ratchet-blobs"


def test_a_blob_tampered_in_s3_is_refused_on_read(s3_bucket):
    client, bucket = s3_bucket
    blobs = S3BlobStore(client, bucket)
    ref = blobs.put(CONTENT)
    assert blobs.get(ref) == CONTENT

    client.put_object(Bucket=bucket, Key=f"{PREFIX}{ref.sha256}", Body=TAMPERED)

    with pytest.raises((RatchetError, ValueError), match=ref.sha256):
        blobs.get(ref)


def test_a_blob_removed_from_s3_is_as_damaged_as_an_altered_one(s3_bucket):
    client, bucket = s3_bucket
    blobs = S3BlobStore(client, bucket)
    ref = blobs.put(CONTENT)
    client.delete_object(Bucket=bucket, Key=f"{PREFIX}{ref.sha256}")

    with pytest.raises(BlobCorrupt, match=f"blob {ref.sha256} is missing from s3://"):
        blobs.get(ref)


# --- the SQLite ledger completes with the commit, or not at all -------------------------------


def _fail_when(harness: Harness, trigger: str) -> None:
    """Make the store's own database fail one statement of the step's commit, as a full
    disk or an I/O error would, from inside the commit's transaction."""
    harness.db.connection.execute(trigger)


def _step_records(harness: Harness) -> list[int]:
    return [c.step for c in harness.store.list_checkpoints("run") if c.event.kind == "step"]


def _resumes_to_done_with_each_row_once(harness: Harness) -> None:
    harness.db.connection.execute("DROP TRIGGER broken")
    final = harness.restart().run_until_stopped()
    assert final.status is RunStatus.DONE
    assert harness.table.keys() == ["run/step-1", "run/step-2"]
    completed = harness.ledger.get("run/step-1")
    assert completed is not None
    assert completed.status is LedgerStatus.COMPLETED


def test_a_commit_that_fails_after_the_head_write_leaves_the_ledger_in_progress(tmp_path):
    # Given a step whose commit fails at its last write, the step record
    harness = Harness(tmp_path, StubModel(total=2))
    harness.start()
    _fail_when(
        harness,
        "CREATE TRIGGER broken BEFORE INSERT ON checkpoints WHEN NEW.step = 1 "
        "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END",
    )

    # When the step runs
    with pytest.raises((sqlite3.Error, RatchetError)):
        harness.engine.advance("run")

    # Then neither the head nor the ledger's completion landed: the step's key is still in
    # progress, so a retry re-runs the tool under it instead of trusting a result never kept
    assert harness.engine.load("run").step == 0
    assert _step_records(harness) == []
    entry = harness.ledger.get("run/step-1")
    assert entry is not None
    assert entry.status is LedgerStatus.IN_PROGRESS
    _resumes_to_done_with_each_row_once(harness)


def test_a_ledger_completion_that_fails_takes_the_head_and_the_record_with_it(tmp_path):
    # Given a step whose commit fails when it completes the ledger entry
    harness = Harness(tmp_path, StubModel(total=2))
    harness.start()
    _fail_when(
        harness,
        "CREATE TRIGGER broken BEFORE UPDATE ON idempotency WHEN NEW.status = 'completed' "
        "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END",
    )

    # When the step runs
    with pytest.raises((sqlite3.Error, RatchetError)):
        harness.engine.advance("run")

    # Then the head did not move and no step record was written either
    assert harness.engine.load("run").step == 0
    assert _step_records(harness) == []
    entry = harness.ledger.get("run/step-1")
    assert entry is not None
    assert entry.status is LedgerStatus.IN_PROGRESS
    _resumes_to_done_with_each_row_once(harness)


# --- the SQLite migration data: one key, one set of arguments ---------------------------------


def _dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return list(db.iterdump())


def test_the_sqlite_migration_data_refuses_a_key_with_other_arguments(tmp_path: Path):
    path = tmp_path / "app.db"
    data = SqliteMigrationData(path)
    data.seed(2)
    data.copy_batch(1, "d1/step-2")
    before = _dump(path)

    with pytest.raises(IdempotencyConflict, match="d1/step-2"):
        data.copy_batch(2, "d1/step-2")
    with pytest.raises(IdempotencyConflict):
        data.send_email("a@example.com", "s", "b", "d1/step-2")
    with pytest.raises(IdempotencyConflict):
        data.drop_source("d1/step-2")

    assert _dump(path) == before
    assert data.copy_batch(1, "d1/step-2") == "Copied 1,000 rows (ids 1-1,000) in batch 1."
    counts = data.counts()
    assert (counts.target_rows, counts.keys_applied, counts.keys_delivered) == (1000, 1, 2)
    data.close()


# --- approvals expire after they were created ------------------------------------------------

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def parked(tmp_path: Path) -> Iterator[tuple[ApprovalDesk, Harness]]:
    """A run waiting for a person, and the desk that opens its approval at `NOW`."""
    harness = Harness(tmp_path, StubModel(total=2, ask_at=1))
    harness.start()
    assert harness.run_until_stopped().status is RunStatus.WAITING
    yield (
        ApprovalDesk(
            book=SqliteApprovalBook(harness.db),
            resumer=LocalResumer(harness.engine),
            store=harness.store,
            signer=LinkSigner(b"k" * 32),
            public_url="http://127.0.0.1:8765",
            clock=lambda: NOW,
        ),
        harness,
    )
    harness.db.close()


def test_an_approval_expires_its_timeout_after_it_was_created(parked):
    desk, harness = parked

    opened = desk.open("run", timeout_seconds=600)

    stored = desk.book.get("run", opened.approval.approval_id)
    assert stored is not None
    assert stored.created_at == NOW
    assert stored.expires_at == NOW + timedelta(seconds=600)
    assert not stored.is_expired(NOW)
    assert stored.is_expired(NOW + timedelta(seconds=600))
    assert opened.notice.expires_at == stored.expires_at
    (column,) = harness.db.connection.execute("SELECT expires_at FROM approvals").fetchone()
    assert datetime.fromisoformat(column) == stored.expires_at
    # And the request can be decided until then.
    later = replace(desk, clock=lambda: NOW + timedelta(seconds=599))
    verdict = Verdict(approved=True, by="dana@example.com")
    view = later.decide_by_id("run", stored.approval_id, verdict, channel="api")
    assert view.approval.status is ApprovalStatus.APPROVED


@pytest.mark.parametrize("timeout_seconds", [0, -60])
def test_an_approval_timeout_of_zero_or_less_is_refused(parked, timeout_seconds):
    desk, _ = parked

    with pytest.raises((InvalidInput, ValueError)):
        desk.open("run", timeout_seconds=timeout_seconds)

    assert desk.book.of_run("run") == []


# --- execution names: <= 80 characters, one per run and generation ----------------------------

NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
LONGEST = "r" + "x" * 127


def test_the_longest_run_id_gives_a_valid_name_for_every_generation():
    assert RUN_ID_PATTERN.match(LONGEST)
    twin = LONGEST[:-1] + "y"  # the same first 127 characters

    names = {execution_name(run_id, g) for run_id in (LONGEST, twin) for g in range(50)}

    assert len(names) == 100
    assert all(NAME.match(name) for name in names), max(names, key=len)


def test_run_ids_that_read_alike_get_different_names():
    # Characters Step Functions refuses are replaced, so these read the same in the name.
    alike = ["a.b", "a:b", "a_b", "a-b"]

    assert len({execution_name(r) for r in alike}) == len(alike)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    st.from_regex(RUN_ID_PATTERN, fullmatch=True),
    st.from_regex(RUN_ID_PATTERN, fullmatch=True),
    st.integers(min_value=0, max_value=10_000),
)
def test_any_run_id_gives_a_valid_name_unique_per_run_and_generation(first, second, generation):
    name = execution_name(first, generation)

    assert NAME.match(name), name
    assert execution_name(first, generation) == name
    assert execution_name(first, generation + 1) != name
    if second != first:
        assert execution_name(second, generation) != name

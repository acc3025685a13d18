"""The Postgres side of `ratchet migrate` and `ratchet gc` (`ratchet.housekeeping` decides what
to keep and what to rewrite): a store's rows as stored, and the few conditional writes
housekeeping makes. Its blobs are rows of `blobs` (`ratchet.adapters.postgres.blobs`), not
files: gc deletes them as rows, each only if no write has put it since gc read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime

from ratchet import stored
from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.sqlite.database import RUN_STATUSES, check_size
from ratchet.ports import StoredBlob, StoredHead, StoredRecord, Trimmed
from ratchet.sealing import PayloadCodec

_GC_LOCK = 0x52744368_00000002
"""The advisory lock a deleting `ratchet gc` holds for its blobs' part, so that two at once
take turns rather than weigh the same rows."""


class PostgresHousekeeping:
    """The rows `ratchet.housekeeping` reads and writes in a Postgres store (`migrate`, `gc`)."""

    def __init__(self, db: PostgresDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        # As on SQLite: heads and records read as a worker reads them, a head written back
        # as a commit writes it.
        self._codec = codec

    def _opened(self, text: str, part: str, run_id: str) -> str:
        return stored.open_sealed_text(text, self._codec, part=part, run_id=run_id)

    def heads(self) -> list[StoredHead]:
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT r.run_id, r.version, r.attempts, r.status, r.updated_at, r.state, s.state "
                "FROM runs AS r LEFT JOIN run_static AS s ON s.run_id = r.run_id "
                "ORDER BY r.run_id"
            ).fetchall()
        heads = []
        for run_id, version, attempts, status, updated_at, head, static in rows:
            # Postgres keeps text valid UTF-8: only the status column can be damaged.
            damage = None if status in RUN_STATUSES else "column 'status' holds no run status"
            heads.append(
                StoredHead(
                    run_id,
                    version,
                    attempts,
                    status,
                    updated_at,
                    self._opened(head, "head", run_id),
                    None if static is None else self._opened(static, "static", run_id),
                    damage,
                )
            )
        return heads

    def records(self, run_id: str) -> list[StoredRecord]:
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT version, step, event FROM checkpoints WHERE run_id = %s ORDER BY version",
                (run_id,),
            ).fetchall()
        return [
            StoredRecord(version, step, self._opened(event, "event", run_id))
            for version, step, event in rows
        ]

    def rewrite_head(self, head: StoredHead, text: str, static: str | None) -> bool:
        text = stored.sealed_text(text, self._codec, part="head", run_id=head.run_id)
        if static is not None:
            static = stored.sealed_static_text(static, self._codec, run_id=head.run_id)
        check_size(f"run {head.run_id} head", text)
        with self._db.write() as tx:
            # Conditional on the version read, without bumping it (the same state in another
            # form): a commit from this version that meets the row first wins, and this
            # update, which waited for it, then finds the version moved and changes nothing.
            changed = tx.execute(
                "UPDATE runs SET state = %s WHERE run_id = %s AND version = %s",
                (text, head.run_id, head.version),
            ).rowcount
            if changed and static is not None:
                tx.execute(
                    "INSERT INTO run_static (run_id, state) VALUES (%s, %s) "
                    "ON CONFLICT (run_id) DO NOTHING",
                    (head.run_id, static),
                )
        return bool(changed)

    def trim_run(self, head: StoredHead, keep_from_step: int, *, dry_run: bool) -> Trimmed | None:
        records_where = (
            "FROM checkpoints WHERE run_id = %s AND step < %s AND version > "
            "(SELECT min(version) FROM checkpoints WHERE run_id = %s)"
        )
        ledger_where = "FROM idempotency WHERE run_id = %s AND step < %s"
        run_id = head.run_id
        with self._db.read() if dry_run else self._db.write() as tx:
            # The head's row locked until the deletes commit: a retry's commit from this
            # version waits for them and then reads the window gc kept; one that landed
            # first moved the version, and the run keeps everything.
            lock = "" if dry_run else " FOR UPDATE"
            still = tx.execute(
                f"SELECT 1 FROM runs WHERE run_id = %s AND version = %s{lock}",
                (run_id, head.version),
            ).fetchone()
            if still is None:
                return None
            if dry_run:
                records = _count(
                    tx.execute(
                        f"SELECT count(*) {records_where}", (run_id, keep_from_step, run_id)
                    ).fetchone()
                )
                ledger = _count(
                    tx.execute(
                        f"SELECT count(*) {ledger_where}", (run_id, keep_from_step)
                    ).fetchone()
                )
            else:
                records = tx.execute(
                    f"DELETE {records_where}", (run_id, keep_from_step, run_id)
                ).rowcount
                ledger = tx.execute(f"DELETE {ledger_where}", (run_id, keep_from_step)).rowcount
        return Trimmed(records, ledger)

    def blob_references(self, trims: Mapping[str, int]) -> set[str]:
        # One snapshot for every table: a reference that moves from one row to another (an
        # event's, from the mailbox to the record of the commit that consumes it) is seen.
        queries = [
            "SELECT state FROM runs",
            "SELECT state FROM run_static",
            "SELECT decision FROM idempotency WHERE decision IS NOT NULL",
            "SELECT result FROM idempotency WHERE result IS NOT NULL",
            "SELECT record FROM approvals",
            # An event sent before its wait is referenced by its mailbox row alone until a
            # commit consumes it (and its checkpoint names the blob).
            "SELECT record FROM mailbox",
        ]
        found: set[str] = set()
        with self._db.read() as tx:
            for query in queries:
                for (text,) in tx.execute(query):
                    # A tool's output is bytes here (see the schema): a digest is ASCII.
                    if isinstance(text, bytes | memoryview):
                        text = bytes(text).decode("utf-8", "replace")
                    found |= stored.blob_digests(text)
            firsts = (
                dict(tx.execute("SELECT run_id, min(version) FROM checkpoints GROUP BY run_id"))
                if trims
                else {}
            )
            for run_id, version, step, event in tx.execute(
                "SELECT run_id, version, step, event FROM checkpoints "
                "WHERE strpos(event, 'sha256') > 0"
            ):
                keep_from = trims.get(run_id)
                if keep_from is not None and step < keep_from and version > firsts[run_id]:
                    continue  # a record gc deletes (counted for a dry run)
                found |= stored.blob_digests(event)
        return found

    def blobs(self, touched_before: datetime) -> list[StoredBlob]:
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT address, octet_length(data), touched_at FROM blobs "
                "WHERE touched_at < %s ORDER BY address",
                (touched_before,),
            ).fetchall()
        return [StoredBlob(address, size, touched_at) for address, size, touched_at in rows]

    def count_blobs(self) -> int:
        with self._db.read() as tx:
            return _count(tx.execute("SELECT count(*) FROM blobs").fetchone())

    def delete_blob(self, blob: StoredBlob) -> bool:
        with self._db.write() as tx:
            # Conditional on the last use read. A worker that puts this content again (then
            # commits a head referencing it) updates touched_at: if its put committed first,
            # this delete finds the row changed and keeps it; if its put is under way, this
            # delete waits for it and then does the same; if this delete commits first, the
            # put finds no row and inserts the blob anew. Never a commit without its blob.
            deleted = tx.execute(
                "DELETE FROM blobs WHERE address = %s AND touched_at = %s",
                (blob.address, blob.touched_at),
            ).rowcount
        return bool(deleted)

    @contextmanager
    def locked(self) -> Iterator[None]:
        # Commits take no store-wide lock on Postgres, and need none here: a commit references
        # a blob its step put just before (young, so never weighed), a copy of a reference gc
        # reads (a fork's, a retry's), or one it put again (which `delete_blob` sees). This
        # lock only makes two gcs take turns.
        with self._db.write() as tx:
            tx.execute("SELECT pg_advisory_xact_lock(%s)", (_GC_LOCK,))
            yield


def _count(row: tuple[int] | None) -> int:
    return int(row[0]) if row else 0

"""The SQLite side of `ratchet migrate` and `ratchet gc` (`ratchet.housekeeping` decides what to
keep and what to rewrite): a store's rows as stored, text read as bytes so that one damaged
run does not stop the others, and the few conditional writes housekeeping makes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path

from ratchet import stored
from ratchet.adapters.sqlite.database import RowTexts, SqliteDatabase, check_size
from ratchet.ports import StoredBlob, StoredHead, StoredRecord, Trimmed
from ratchet.sealing import PayloadCodec


class SqliteHousekeeping:
    """The rows `ratchet.housekeeping` reads and writes in a SQLite store (`migrate`, `gc`),
    and the files of its blobs (a `FileBlobStore`'s folder, `blob_root`)."""

    def __init__(
        self, db: SqliteDatabase, codec: PayloadCodec | None = None, *, blob_root: Path
    ) -> None:
        self._db = db
        self._blob_root = blob_root
        # `ratchet migrate` reads heads and records as a worker does, and writes a head back
        # as a commit would: opened on the way up, sealed again on the way down.
        self._codec = codec

    def _opened(self, text: str, part: str, run_id: str) -> str:
        return stored.open_sealed_text(text, self._codec, part=part, run_id=run_id)

    def heads(self) -> list[StoredHead]:
        # A store made before schema 3 has no run_static table until a write command adds it.
        static_state = (
            "(SELECT state FROM run_static AS s WHERE s.run_id = r.run_id)"
            if "run_static" in self._tables()
            else "NULL"
        )
        # Text as bytes, decoded here: one run's damaged row must not stop the others.
        rows = self._db.connection.execute(
            "SELECT CAST(r.run_id AS BLOB), r.version, r.attempts, CAST(r.status AS BLOB), "
            f"CAST(r.updated_at AS BLOB), CAST(r.state AS BLOB), CAST({static_state} AS BLOB) "
            "FROM runs AS r ORDER BY r.run_id"
        ).fetchall()
        heads = []
        for run_id, version, attempts, status, at, head, static in rows:
            texts = RowTexts()
            updated_at = texts.time("updated_at", at)
            run = texts.text("run_id", run_id)
            head_text = self._opened(texts.text("state", head), "head", run)
            static_text = (
                None
                if static is None
                else self._opened(texts.text("run_static.state", static), "static", run)
            )
            heads.append(
                StoredHead(
                    run,
                    version,
                    attempts,
                    texts.status(status),
                    updated_at,
                    head_text,
                    static_text,
                    texts.damage,
                )
            )
        return heads

    def records(self, run_id: str) -> list[StoredRecord]:
        rows = self._db.connection.execute(
            "SELECT version, step, CAST(event AS BLOB) FROM checkpoints WHERE run_id = ? "
            "ORDER BY version",
            (run_id,),
        ).fetchall()
        records = []
        for version, step, event in rows:
            texts = RowTexts()
            text = self._opened(texts.text("event", event), "event", run_id)
            records.append(StoredRecord(version, step, text, texts.damage))
        return records

    def rewrite_head(self, head: StoredHead, text: str, static: str | None) -> bool:
        text = stored.sealed_text(text, self._codec, part="head", run_id=head.run_id)
        if static is not None:
            static = stored.sealed_static_text(static, self._codec, run_id=head.run_id)
        check_size(f"run {head.run_id} head", text)
        with self._db.write() as tx:
            # Conditional on the version read, as a commit is, but without bumping it: the
            # rewritten head is the same state in another form, so a worker that read this
            # version may still commit over it; a head that moved is left to a later run.
            changed = tx.execute(
                "UPDATE runs SET state = ? WHERE run_id = ? AND version = ?",
                (text, head.run_id, head.version),
            ).rowcount
            if changed and static is not None:
                tx.execute(
                    "INSERT INTO run_static (run_id, state) VALUES (?, ?) "
                    "ON CONFLICT (run_id) DO NOTHING",
                    (head.run_id, static),
                )
        return bool(changed)

    def trim_run(self, head: StoredHead, keep_from_step: int, *, dry_run: bool) -> Trimmed | None:
        # One transaction: the version check and the deletes. A run retried meanwhile (its
        # version moved) keeps everything; one retried after reads the window gc kept.
        records_where = (
            "FROM checkpoints WHERE run_id = ? AND step < ? AND version > "
            "(SELECT min(version) FROM checkpoints WHERE run_id = ?)"
        )
        ledger_where = "FROM idempotency WHERE run_id = ? AND step < ?"
        run_id = head.run_id
        with self._db.read() if dry_run else self._db.write() as tx:
            still = tx.execute(
                "SELECT 1 FROM runs WHERE run_id = ? AND version = ?", (run_id, head.version)
            ).fetchone()
            if still is None:
                return None
            if dry_run:
                (records,) = tx.execute(
                    f"SELECT count(*) {records_where}", (run_id, keep_from_step, run_id)
                ).fetchone()
                (ledger,) = tx.execute(
                    f"SELECT count(*) {ledger_where}", (run_id, keep_from_step)
                ).fetchone()
            else:
                records = tx.execute(
                    f"DELETE {records_where}", (run_id, keep_from_step, run_id)
                ).rowcount
                ledger = tx.execute(f"DELETE {ledger_where}", (run_id, keep_from_step)).rowcount
        return Trimmed(records, ledger)

    def blob_references(self, trims: Mapping[str, int]) -> set[str]:
        connection = self._db.connection
        tables = self._tables()
        # As bytes: a digest is ASCII, so a damaged (not UTF-8) text still names its blobs.
        queries = [
            "SELECT CAST(state AS BLOB) FROM runs",
            "SELECT CAST(state AS BLOB) FROM run_static",
            "SELECT CAST(decision AS BLOB) FROM idempotency WHERE decision IS NOT NULL",
            "SELECT CAST(result AS BLOB) FROM idempotency WHERE result IS NOT NULL",
        ]
        if "approvals" in tables:
            queries.append("SELECT CAST(record AS BLOB) FROM approvals")
        if "mailbox" in tables:
            # An event sent before its wait is referenced by its mailbox row alone until a
            # commit consumes it (and its checkpoint names the blob).
            queries.append("SELECT CAST(record AS BLOB) FROM mailbox")
        found: set[str] = set()
        for query in queries:
            for (text,) in connection.execute(query):
                found |= stored.blob_digests(bytes(text).decode("utf-8", "replace"))
        # Each run's first record, which gc keeps: only a dry run's `trims` need it.
        firsts = (
            dict(connection.execute("SELECT run_id, min(version) FROM checkpoints GROUP BY run_id"))
            if trims
            else {}
        )
        for run_id, version, step, event in connection.execute(
            "SELECT run_id, version, step, CAST(event AS BLOB) FROM checkpoints "
            "WHERE instr(event, 'sha256')"
        ):
            keep_from = trims.get(run_id)
            if keep_from is not None and step < keep_from and version > firsts[run_id]:
                continue  # a record gc deletes (counted for a dry run)
            found |= stored.blob_digests(bytes(event).decode("utf-8", "replace"))
        return found

    def locked(self) -> AbstractContextManager[object]:
        return self._db.write()

    def _tables(self) -> set[str]:
        rows = self._db.connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {str(name) for (name,) in rows}

    def blobs(self, touched_before: datetime) -> list[StoredBlob]:
        found = []
        for path in _blob_files(self._blob_root):
            info = path.stat()
            touched_at = datetime.fromtimestamp(info.st_mtime, UTC)
            if touched_at < touched_before:
                found.append(StoredBlob(path.name, info.st_size, touched_at))
        return found

    def count_blobs(self) -> int:
        return sum(1 for _ in _blob_files(self._blob_root))

    def delete_blob(self, blob: StoredBlob) -> bool:
        path = self._blob_root / blob.address[:2] / blob.address
        try:
            # A put of the same content touches the file: it is in use anew.
            if datetime.fromtimestamp(path.stat().st_mtime, UTC) != blob.touched_at:
                return False
        except FileNotFoundError:
            return False
        path.unlink(missing_ok=True)
        return True


def _blob_files(root: Path) -> Iterator[Path]:
    """The blob files of a `FileBlobStore` folder (`<root>/<2 hex>/<sha256>`), not the
    temporary files of a write under way."""
    if not root.is_dir():
        return
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or len(folder.name) != 2:
            continue
        for path in sorted(folder.iterdir()):
            if len(path.name) == 64 and path.name.startswith(folder.name) and path.is_file():
                yield path

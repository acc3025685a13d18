"""`ratchet migrate --reencrypt` on a local store: every sealed text and blob rewritten under
the codec's newest key, and every one written in clear before the codec was turned on sealed,
so that an old key can be removed from the keyring with nothing left that needs it.

Each table is read in pages of `PAGE_ROWS` rows, in the order of its primary key; a page's new
texts are sealed outside the write lock and written in one transaction, each row conditional on
the text it was read with (a worker that rewrote the row meanwhile wrote it under the newest key
anyway, and keeps what it wrote). A text already under the newest key is left as it is. So a
run killed part-way has committed whole pages and changed nothing else, and a second run
rewrites only what the first did not reach: no text is rewritten from a stale read.

A blob is rewritten aside and renamed over its file, under the same name: a blob sealed under
an old key keeps its keyed name, and one written in clear keeps its SHA-256 (its bytes sealed,
bound to that name; renaming it would mean rewriting every record that names it).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratchet import stored
from ratchet.adapters.file_blobs import blob_context
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.errors import PayloadTampered
from ratchet.sealing import PayloadCodec, header_of, is_sealed

PAGE_ROWS = 200
"""Rows sealed and written per transaction: a worker waits for the write lock at most one
page's writes (the sealing is done before the lock is taken)."""

Sealer = Callable[[str, PayloadCodec | None, str, str], str]
Opener = Callable[[str, PayloadCodec | None, str, str], str]


def _seal_text(plain: str, codec: PayloadCodec | None, part: str, run_id: str) -> str:
    return stored.sealed_text(plain, codec, part=part, run_id=run_id)


def _seal_static(plain: str, codec: PayloadCodec | None, part: str, run_id: str) -> str:
    return stored.sealed_static_text(plain, codec, run_id=run_id)


def _seal_record(plain: str, codec: PayloadCodec | None, part: str, run_id: str) -> str:
    return stored.sealed_record_text(plain, codec, part=part, run_id=run_id)


def _seal_value(plain: str, codec: PayloadCodec | None, part: str, run_id: str) -> str:
    return stored.sealed_value(plain, codec, part=part, run_id=run_id)


def _seal_args_hash(plain: str, codec: PayloadCodec | None, part: str, run_id: str) -> str:
    return stored.sealed_args_hash(plain, codec, run_id=run_id)


def _open_text(text: str, codec: PayloadCodec | None, part: str, run_id: str) -> str:
    return stored.open_sealed_text(text, codec, part=part, run_id=run_id)


def _open_value(text: str, codec: PayloadCodec | None, part: str, run_id: str) -> str:
    return stored.opened_value(text, codec, part=part, run_id=run_id)


@dataclass(frozen=True)
class SealedColumn:
    """A column of sealed texts: where it is, what each text is bound to (`part` of its run,
    `ratchet.stored`), and how the store seals and opens it."""

    table: str
    keys: tuple[str, ...]
    """The table's primary key, the order it is read in."""
    column: str
    part: Callable[[tuple[Any, ...]], str]
    """The part a row's text is bound to, from the row's primary key."""
    seal: Sealer = _seal_text
    open: Opener = _open_text
    run_column: str = "run_id"
    where: str = ""
    """Which rows hold a sealed text (or one to seal), beyond the column's being set."""
    clear_values: bool = False
    """A value of the run's own (`RunData`): any text not a whole envelope is in clear."""


SEALED_COLUMNS = (
    # A head is sealed only beside its static part: one stored whole (schema 2 and earlier)
    # is read as it is, and `ratchet migrate` rewrites it in today's form, sealed.
    SealedColumn(
        "runs",
        ("run_id",),
        "state",
        lambda _: "head",
        where="run_id IN (SELECT run_id FROM run_static)",
    ),
    SealedColumn("run_static", ("run_id",), "state", lambda _: "static", seal=_seal_static),
    SealedColumn("checkpoints", ("run_id", "version"), "event", lambda _: "event"),
    SealedColumn("idempotency", ("key",), "decision", lambda _: "decision"),
    SealedColumn("idempotency", ("key",), "args_hash", lambda _: "args", seal=_seal_args_hash),
    SealedColumn("approvals", ("approval_id",), "record", lambda _: "approval", seal=_seal_record),
    SealedColumn("mailbox", ("seq",), "record", lambda _: "mail", seal=_seal_record),
    SealedColumn("schedules", ("name",), "record", lambda _: "schedule", run_column="name"),
    SealedColumn("deliveries", ("delivery_id",), "body", lambda _: "delivery"),
    SealedColumn(
        "run_data",
        ("run_id", "key"),
        "value",
        lambda keys: f"data:{keys[1]}",
        seal=_seal_value,
        open=_open_value,
        clear_values=True,
    ),
)


@dataclass
class Reencryption:
    """What `reencrypt` did (or, for a dry run, would do)."""

    key_id: str
    dry_run: bool
    resealed: dict[str, int] = field(default_factory=dict)
    """Per table, texts sealed under an older key and rewritten under `key_id`."""
    sealed: dict[str, int] = field(default_factory=dict)
    """Per table, texts written in clear before the codec, now sealed under `key_id`."""
    current: int = 0
    """Texts already under `key_id`: left as they are."""
    moved: int = 0
    """Texts rewritten by a worker between the read and the write: left to it."""
    unreadable: list[str] = field(default_factory=list)
    """Texts whose envelope fails its authentication: left as they are, named here."""
    blobs_resealed: int = 0
    blobs_sealed: int = 0
    blobs_current: int = 0
    outbox_resealed: int = 0
    """Outbox messages sealed under an older key, rewritten (one written in clear is left:
    it names its run only in its file's name; it was sent, and may be deleted)."""

    @property
    def records(self) -> int:
        return sum(self.resealed.values()) + sum(self.sealed.values())

    @property
    def blobs(self) -> int:
        return self.blobs_resealed + self.blobs_sealed

    def to_json(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "dry_run": self.dry_run,
            "records": self.records,
            "blobs": self.blobs,
            "resealed": self.resealed,
            "sealed": self.sealed,
            "current": self.current,
            "moved": self.moved,
            "unreadable": self.unreadable,
            "blobs_resealed": self.blobs_resealed,
            "blobs_sealed": self.blobs_sealed,
            "blobs_current": self.blobs_current,
            "outbox_resealed": self.outbox_resealed,
        }


def reencrypt(
    db: SqliteDatabase,
    blobs: Path,
    codec: PayloadCodec,
    *,
    outbox: Path | None = None,
    dry_run: bool = False,
) -> Reencryption:
    """Rewrite every sealed text of the store at `db`, every blob under `blobs` and every
    sealed message in `outbox` under `codec`'s newest key, sealing the texts and blobs written
    in clear (see the module's docstring). A text
    under a key the codec does not hold stops it with `PayloadKeyMissing` naming that key: what
    was rewritten before stays rewritten, and a second run after the key is back finishes."""
    report = Reencryption(codec.key_id, dry_run)
    for column in SEALED_COLUMNS:
        if db.has_table(column.table):
            _reencrypt_column(db, column, codec, report)
    _reencrypt_blobs(blobs, codec, report)
    if outbox is not None:
        reencrypt_outbox(outbox, codec, report)
    return report


def _reencrypt_column(
    db: SqliteDatabase, column: SealedColumn, codec: PayloadCodec, report: Reencryption
) -> None:
    keys = ", ".join(column.keys)
    where = f"{column.column} IS NOT NULL" + (f" AND {column.where}" if column.where else "")
    after: tuple[Any, ...] | None = None
    while True:
        # Row values compare in the primary key's order: the page after the last one read.
        page_where = where if after is None else f"{where} AND ({keys}) > ({_marks(after)})"
        rows = db.connection.execute(
            f"SELECT {keys}, {column.run_column}, {column.column} FROM {column.table} "
            f"WHERE {page_where} ORDER BY {keys} LIMIT {PAGE_ROWS}",
            after or (),
        ).fetchall()
        if not rows:
            return
        after = tuple(rows[-1][: len(column.keys)])
        writes = list(_rewritten(column, rows, codec, report))
        if report.dry_run or not writes:
            continue
        match = " AND ".join(f"{name} = ?" for name in column.keys)
        with db.write() as tx:
            for key, old, new, counts in writes:
                # Conditional on the text read: a row a worker rewrote meanwhile (under the
                # newest key, as every write now is) keeps what the worker wrote.
                changed = tx.execute(
                    f"UPDATE {column.table} SET {column.column} = ? "
                    f"WHERE {match} AND {column.column} = ?",
                    (new, *key, old),
                ).rowcount
                if changed:
                    counts[column.table] = counts.get(column.table, 0) + 1
                else:
                    report.moved += 1


def _rewritten(
    column: SealedColumn, rows: list[Any], codec: PayloadCodec, report: Reencryption
) -> Iterator[tuple[tuple[Any, ...], str, str, dict[str, int]]]:
    """Each row of a page that is not under the newest key: its key, its text as read, its
    text under the newest key, and the count it adds to."""
    width = len(column.keys)
    for row in rows:
        key, run_id, text = tuple(row[:width]), str(row[width]), str(row[width + 1])
        rewrite = resealed_text(column, key, run_id, text, codec, report)
        if rewrite is not None:
            yield key, text, *rewrite


def resealed_text(
    column: SealedColumn,
    key: tuple[Any, ...],
    run_id: str,
    text: str,
    codec: PayloadCodec,
    report: Reencryption,
) -> tuple[str, dict[str, int]] | None:
    """`text` (of `column`, the row or item `key` of run `run_id`) under the newest key, and
    the count its write adds to; None if it is left as it is (already under the newest key,
    or failing its authentication: counted here) or the run is a dry one (counted here).
    Every store's reencryption decides each text here."""
    key_id = stored.sealed_key_id(text)
    if key_id == codec.key_id:
        report.current += 1
        return None
    where = f"{column.table} {'/'.join(map(str, key))}"
    if key_id is None and stored.is_sealed_text(text) and not column.clear_values:
        report.unreadable.append(where)
        return None
    part = column.part(key)
    try:
        plain = column.open(text, codec, part, run_id)
    except PayloadTampered:
        report.unreadable.append(where)
        return None
    counts = report.sealed if key_id is None else report.resealed
    if report.dry_run:
        counts[column.table] = counts.get(column.table, 0) + 1
        return None
    return column.seal(plain, codec, part, run_id), counts


def _reencrypt_blobs(root: Path, codec: PayloadCodec, report: Reencryption) -> None:
    if not root.is_dir():
        return
    for path in sorted(root.glob("*/*")):
        if path.name.startswith(".") or not path.is_file():
            continue  # a blob being written (`.tmp-...`): its writer seals it
        data = resealed_blob(path.name, path.read_bytes(), codec, report)
        if data is not None:
            _replace(path, data)


def resealed_blob(
    name: str, data: bytes, codec: PayloadCodec, report: Reencryption
) -> bytes | None:
    """The blob `name`'s bytes `data` under the newest key, bound to the same name (one written
    in clear is named by its SHA-256); None if it is left as it is or the run is a dry one.
    Counted here, as `resealed_text` counts a text."""
    context = blob_context(name)
    if hashlib.sha256(data).hexdigest() == name:
        plain, counted = data, "blobs_sealed"
    elif is_sealed(data):
        try:
            if header_of(data)[0] == codec.key_id:
                report.blobs_current += 1
                return None
            plain, counted = codec.open(data, context=context), "blobs_resealed"
        except PayloadTampered:
            report.unreadable.append(f"blob {name}")
            return None
    else:
        report.unreadable.append(f"blob {name}")
        return None
    setattr(report, counted, getattr(report, counted) + 1)
    return None if report.dry_run else codec.seal(plain, context=context)


def reencrypt_outbox(folder: Path, codec: PayloadCodec, report: Reencryption) -> None:
    """Every message in the outbox `folder` sealed under an older key, rewritten under the
    newest (a Postgres store's outbox is such a folder on each host too)."""
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.json")):
        text = path.read_text(encoding="utf-8")
        key_id = stored.sealed_key_id(text)
        if key_id is None or key_id == codec.key_id:
            continue
        try:
            plain = stored.open_record_text(text, codec, part="outbox")
        except PayloadTampered:
            report.unreadable.append(f"outbox {path.name}")
            continue
        report.outbox_resealed += 1
        if not report.dry_run:
            run_id = str(json.loads(text)["run_id"])
            resealed = stored.sealed_record_text(
                plain, codec, part="outbox", run_id=run_id, names_blobs=False
            )
            _replace(path, resealed.encode())


def _replace(path: Path, data: bytes) -> None:
    """`path` rewritten with `data`: aside, synced, renamed over it, so a crash leaves the old
    blob or the new one whole (each readable with its key), never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _marks(values: tuple[Any, ...]) -> str:
    return ", ".join("?" for _ in values)

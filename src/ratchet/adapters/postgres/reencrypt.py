"""`ratchet migrate --reencrypt` on a Postgres store: every sealed text of every table, every
blob of the `blobs` table and every key of the `signing_keys` table, rewritten under the
codec's newest key, and every one written in clear before the codec was turned on sealed, as
`ratchet.adapters.sqlite.reencrypt` does for a local store (which decides each text and blob,
and holds the report). The outbox's messages are files on this host
(`ratchet.runtime.postgres.files_folder`), rewritten as a local store's are.

Each column is read in pages of `PAGE_ROWS` rows, in the order of its table's primary key, one
read transaction a page; a page's new texts are sealed outside any transaction and written in
one, each row's UPDATE conditional on the text it was read with. At READ COMMITTED an UPDATE
that meets a row another transaction is changing waits for it, then checks its condition on
the row as that one left it: a worker that rewrote the row meanwhile (under the newest key, as
every write now is) keeps what it wrote, and a row deleted meanwhile stays deleted. So nothing
is rewritten from a stale read, a run killed part-way has committed whole pages, and a second
run rewrites only what the first did not reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.postgres.keys import opened_key, sealed_key
from ratchet.adapters.sqlite.reencrypt import (
    SEALED_COLUMNS as LOCAL_SEALED_COLUMNS,
)
from ratchet.adapters.sqlite.reencrypt import (
    Reencryption,
    SealedColumn,
    reencrypt_outbox,
    resealed_blob,
    resealed_text,
)
from ratchet.errors import PayloadTampered
from ratchet.sealing import PayloadCodec, header_of, is_sealed

PAGE_ROWS = 200
"""Rows read, sealed and written per transaction."""

BLOB_PAGE_ROWS = 20
"""Blobs read and written per transaction: each may be megabytes, and a page is held whole."""


@dataclass(frozen=True)
class SealedTable:
    """A table of the Postgres store whose `columns` hold sealed texts, with its primary key
    (`keys`, the order it is read in). Each column is sealed as the local store's column of the
    same table and name (`ratchet.adapters.sqlite.reencrypt.SEALED_COLUMNS`) is: counted under
    the table's name, bound to the same part of its run, sealed and opened alike."""

    table: str
    keys: tuple[str, ...]
    columns: tuple[str, ...]
    utf8_bytes: bool = False
    """Its keys and sealed columns are `bytea`, each text as its UTF-8 bytes (a text column
    cannot hold the character NUL, which a run's data may)."""

    def local(self, column: str) -> SealedColumn:
        return next(c for c in LOCAL_SEALED_COLUMNS if (c.table, c.column) == (self.table, column))


SEALED_TABLES: tuple[SealedTable, ...] = (
    SealedTable("runs", ("run_id",), ("state",)),
    SealedTable("run_static", ("run_id",), ("state",)),
    SealedTable("checkpoints", ("run_id", "version"), ("event",)),
    SealedTable("idempotency", ("key",), ("decision", "args_hash")),
    SealedTable("approvals", ("approval_id",), ("record",)),
    SealedTable("mailbox", ("seq",), ("record",)),
    SealedTable("schedules", ("name",), ("record",)),
    SealedTable("run_data", ("run_id", "key"), ("value",), utf8_bytes=True),
    SealedTable("deliveries", ("delivery_id",), ("body",)),
)
"""Every table a codec seals texts in on a Postgres store (`ratchet.stored`, and the ledger's,
mailbox's, approval book's, schedule book's and run data's adapters); blobs are the `blobs`
table's. tests/integration/test_reencrypt.py checks that a store sealed under an old key holds
no text left under it after a run, on SQLite and Postgres alike. The signing keys are bytes,
not texts: `_reencrypt_signing_keys` rewrites them."""

SIGNING_KEYS = "signing_keys"
"""The table of the keys links and hooks are signed with (`ratchet.adapters.postgres.keys`),
sealed whole, each bound to its name; counted under this name."""


def reencrypt(
    db: PostgresDatabase,
    codec: PayloadCodec,
    *,
    outbox: Path | None = None,
    dry_run: bool = False,
) -> Reencryption:
    """Rewrite every sealed text, blob and signing key of the store at `db`, and every sealed
    message in `outbox`, under `codec`'s newest key, sealing those written in clear (see the
    module's docstring). A text under a key the codec does not hold stops it with
    `PayloadKeyMissing` naming that key: what was rewritten before stays rewritten, and a second
    run after the key is back finishes."""
    report = Reencryption(codec.key_id, dry_run)
    for table in SEALED_TABLES:
        for column in table.columns:
            _reencrypt_column(db, table, table.local(column), codec, report)
    _reencrypt_blobs(db, codec, report)
    _reencrypt_signing_keys(db, codec, report)
    if outbox is not None:
        reencrypt_outbox(outbox, codec, report)
    return report


def _reencrypt_column(
    db: PostgresDatabase,
    table: SealedTable,
    column: SealedColumn,
    codec: PayloadCodec,
    report: Reencryption,
) -> None:
    keys = ", ".join(table.keys)
    where = f"{column.column} IS NOT NULL" + (f" AND {column.where}" if column.where else "")
    match = " AND ".join(f"{name} = %s" for name in table.keys)
    after: tuple[Any, ...] | None = None
    while True:
        # Row values compare in the primary key's order: the page after the last one read.
        page_where = where if after is None else f"{where} AND ({keys}) > ({_marks(after)})"
        with db.read() as tx:
            rows = tx.execute(
                f"SELECT {keys}, {column.run_column}, {column.column} FROM {table.table} "
                f"WHERE {page_where} ORDER BY {keys} LIMIT {PAGE_ROWS}",
                after or (),
            ).fetchall()
        if not rows:
            return
        width = len(table.keys)
        after = tuple(rows[-1][:width])
        writes = []
        for row in rows:
            stored_key, run_id, text = tuple(row[:width]), str(row[width]), row[width + 1]
            rewrite = resealed_text(
                column, _texts(table, stored_key), run_id, _text(table, text), codec, report
            )
            if rewrite is not None:
                new, counts = rewrite
                writes.append((stored_key, text, _stored(table, new), counts))
        if report.dry_run or not writes:
            continue
        with db.write() as tx:
            for stored_key, old, new, counts in writes:
                # Conditional on the text read: a row a worker rewrote meanwhile (under the
                # newest key, as every write now is) keeps what the worker wrote; this UPDATE
                # waits for the worker's transaction and then finds the condition false.
                changed = tx.execute(
                    f"UPDATE {table.table} SET {column.column} = %s "
                    f"WHERE {match} AND {column.column} = %s",
                    (new, *stored_key, old),
                ).rowcount
                if changed:
                    counts[column.table] = counts.get(column.table, 0) + 1
                else:
                    report.moved += 1


def _reencrypt_blobs(db: PostgresDatabase, codec: PayloadCodec, report: Reencryption) -> None:
    after: str | None = None
    while True:
        with db.read() as tx:
            rows = tx.execute(
                "SELECT address, data FROM blobs"
                + ("" if after is None else " WHERE address > %s")
                + f" ORDER BY address LIMIT {BLOB_PAGE_ROWS}",
                () if after is None else (after,),
            ).fetchall()
        if not rows:
            return
        after = str(rows[-1][0])
        writes = []
        for address, data in rows:
            resealed = resealed_blob(str(address), bytes(data), codec, report)
            if resealed is not None:
                writes.append((str(address), bytes(data), resealed))
        if not writes:
            continue
        with db.write() as tx:
            for address, old, new in writes:
                # Under the same address (a blob sealed under an old key keeps its keyed name,
                # one written in clear its SHA-256: records name it), and only if its bytes are
                # still those read: a blob collected meanwhile is not made again.
                tx.execute(
                    "UPDATE blobs SET data = %s WHERE address = %s AND data = %s",
                    (new, address, old),
                )


def _reencrypt_signing_keys(
    db: PostgresDatabase, codec: PayloadCodec, report: Reencryption
) -> None:
    """Every signing key (a handful of rows: read in one page) under the newest key, sealing
    one written in clear, each counted as a text is. A key under a key the codec does not hold
    stops the run with `PayloadKeyMissing`, as a text does; a damaged one is left, named."""
    with db.read() as tx:
        rows = tx.execute(f"SELECT name, secret FROM {SIGNING_KEYS} ORDER BY name").fetchall()
    writes = []
    for row_name, secret in rows:
        name, old = str(row_name), bytes(secret)
        if is_sealed(old) and _key_id(old) == codec.key_id:
            report.current += 1
            continue
        try:
            key = opened_key(old, codec, name=name)
        except PayloadTampered:
            report.unreadable.append(f"{SIGNING_KEYS} {name}")
            continue
        counts = report.resealed if is_sealed(old) else report.sealed
        if report.dry_run:
            counts[SIGNING_KEYS] = counts.get(SIGNING_KEYS, 0) + 1
        else:
            writes.append((name, old, sealed_key(key, codec, name=name), counts))
    if not writes:
        return
    with db.write() as tx:
        for name, old, new, counts in writes:
            # Conditional on the bytes read, as a text's rewrite is: a key once written is
            # never made again, so only another `--reencrypt` rewrites it meanwhile, and of
            # the two the second keeps what the first wrote.
            changed = tx.execute(
                f"UPDATE {SIGNING_KEYS} SET secret = %s WHERE name = %s AND secret = %s",
                (new, name, old),
            ).rowcount
            if changed:
                counts[SIGNING_KEYS] = counts.get(SIGNING_KEYS, 0) + 1
            else:
                report.moved += 1


def _key_id(sealed: bytes) -> str | None:
    """The key a sealed signing key is under, or None for one whose header is damaged."""
    try:
        return header_of(sealed)[0]
    except PayloadTampered:
        return None


def _texts(table: SealedTable, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row's key as the local column's part reads it: texts, not their bytes."""
    if not table.utf8_bytes:
        return values
    return tuple(bytes(v).decode() if isinstance(v, bytes | memoryview) else v for v in values)


def _text(table: SealedTable, value: Any) -> str:
    return bytes(value).decode() if table.utf8_bytes else str(value)


def _stored(table: SealedTable, text: str) -> Any:
    return text.encode() if table.utf8_bytes else text


def _marks(values: tuple[Any, ...]) -> str:
    return ", ".join("%s" for _ in values)

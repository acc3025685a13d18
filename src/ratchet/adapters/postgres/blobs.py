"""Large tool outputs in a Postgres store (`BlobStore`): table `blobs`, under the addresses
the file blobs take (`ratchet.adapters.file_blobs`), checked on the way out as they are.

In the database, not in a folder beside it: workers on many hosts share the database and
nothing else, and a blob one host's step stored is read by the next step on another."""

from __future__ import annotations

from ratchet.adapters.file_blobs import blob_address, read_blob, stored_blob
from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.errors import BlobMissing
from ratchet.sealing import PayloadCodec
from ratchet.state import BlobRef


class PostgresBlobStore:
    def __init__(self, db: PostgresDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        self._codec = codec

    def put(self, data: bytes) -> BlobRef:
        address = blob_address(data, self._codec)
        with self._db.write() as tx:
            # The same content again is the same row: two writers of one blob store one, and
            # the second only marks it in use anew (gc's grace period starts over).
            tx.execute(
                "INSERT INTO blobs (address, data, touched_at) VALUES (%s, %s, now()) "
                "ON CONFLICT (address) DO UPDATE SET touched_at = excluded.touched_at",
                (address, stored_blob(data, address, self._codec)),
            )
        return BlobRef(sha256=address, size=len(data))

    def get(self, ref: BlobRef) -> bytes:
        with self._db.read() as tx:
            row = tx.execute("SELECT data FROM blobs WHERE address = %s", (ref.sha256,)).fetchone()
        where = f"{self._db.url.where} (blobs)"
        if row is None:
            raise BlobMissing(ref.sha256, where)
        return read_blob(bytes(row[0]), ref.sha256, self._codec, where)

"""Blobs in a Postgres store: stored once per address, read back by another process's pool,
and checked on the way out as the file blobs are."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ratchet.adapters.postgres.blobs import PostgresBlobStore
from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.errors import BlobCorrupt, BlobMissing
from ratchet.state import BlobRef
from tests.postgres_support import scratch_store


@pytest.fixture
def open_store(postgres: object) -> Iterator[Callable[[], PostgresDatabase]]:
    with scratch_store() as opener:
        yield opener


def test_a_blob_stored_by_one_pool_is_read_by_another_once_per_address(open_store):
    data = b"\x00large output\xff" * 1000
    ref = PostgresBlobStore(open_store()).put(data)
    again = PostgresBlobStore(open_store()).put(data)

    assert again == ref
    assert PostgresBlobStore(open_store()).get(ref) == data
    with open_store().read() as tx:
        assert tx.execute("SELECT count(*) FROM blobs").fetchone() == (1,)


def test_a_blob_changed_in_the_database_is_refused_on_read(open_store):
    db = open_store()
    ref = PostgresBlobStore(db).put(b"what the tool said")
    with db.write() as tx:
        tx.execute(
            "UPDATE blobs SET data = %s WHERE address = %s", (b"not what it said", ref.sha256)
        )

    with pytest.raises(BlobCorrupt):
        PostgresBlobStore(db).get(ref)


def test_a_blob_never_stored_is_missing(open_store):
    with pytest.raises(BlobMissing):
        PostgresBlobStore(open_store()).get(BlobRef(sha256="0" * 64, size=1))

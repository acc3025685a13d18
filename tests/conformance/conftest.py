from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ratchet.adapters.sqlite import SqliteCheckpointStore, SqliteDatabase, SqliteLedger
from ratchet.ports import CheckpointStore, IdempotencyLedger


@dataclass
class Backend:
    store: CheckpointStore
    ledger: IdempotencyLedger


def _sqlite(tmp_path: Any) -> Iterator[Backend]:
    db = SqliteDatabase(tmp_path / "ratchet.db")
    yield Backend(SqliteCheckpointStore(db), SqliteLedger(db))
    db.close()


BACKENDS = {"sqlite": _sqlite}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Backend]:
    yield from BACKENDS[request.param](tmp_path)

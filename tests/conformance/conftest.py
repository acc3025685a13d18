from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ratchet.adapters.dynamodb.ledger import DynamoDbLedger
from ratchet.adapters.dynamodb.store import DynamoDbCheckpointStore
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.ledger import SqliteLedger
from ratchet.adapters.sqlite.store import SqliteCheckpointStore
from ratchet.ports import CheckpointStore, IdempotencyLedger
from tests.dynamodb_support import create_tables


@dataclass
class Backend:
    store: CheckpointStore
    ledger: IdempotencyLedger


def _sqlite(tmp_path: Any) -> Iterator[Backend]:
    db = SqliteDatabase(tmp_path / "ratchet.db")
    yield Backend(SqliteCheckpointStore(db), SqliteLedger(db))
    db.close()


def _dynamodb(tmp_path: Any) -> Iterator[Backend]:
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_tables(client, checkpoints="checkpoints", idempotency="idempotency", app="app")
        yield Backend(
            DynamoDbCheckpointStore(client, table="checkpoints", ledger_table="idempotency"),
            DynamoDbLedger(client, table="idempotency"),
        )


BACKENDS = {"sqlite": _sqlite, "dynamodb": _dynamodb}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Backend]:
    yield from BACKENDS[request.param](tmp_path)

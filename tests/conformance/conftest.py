from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ratchet import stored
from ratchet.adapters.dynamodb.ledger import DynamoDbLedger
from ratchet.adapters.dynamodb.mailbox import DynamoMailbox
from ratchet.adapters.dynamodb.store import DynamoDbCheckpointStore, checkpoint_sk
from ratchet.adapters.payload_keys import KeyringCodec
from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl
from ratchet.adapters.postgres.ledger import PostgresLedger
from ratchet.adapters.postgres.mailbox import PostgresMailbox
from ratchet.adapters.postgres.store import PostgresCheckpointStore
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.ledger import SqliteLedger
from ratchet.adapters.sqlite.mailbox import SqliteMailbox
from ratchet.adapters.sqlite.store import SqliteCheckpointStore
from ratchet.ports import CheckpointStore, IdempotencyLedger, Mailbox
from ratchet.sealing import PayloadCodec
from tests.dynamodb_support import create_tables, one_dynamodb_call_at_a_time, scan
from tests.postgres_support import cluster


@dataclass
class Backend:
    store: CheckpointStore
    ledger: IdempotencyLedger
    mailbox: Mailbox
    connect: Callable[[], AbstractContextManager[Mailbox]]
    """The mailbox through a connection of its own, as another process (or a thread: a SQLite
    connection serves the thread that opened it) reaches it."""
    everything: Callable[[], list[Any]]
    """Every row or item the backend holds, to compare before and after a refused write."""
    record: Callable[[str, int], str]
    """A checkpoint record's event (run id, version) as stored: its JSON text."""
    rewrite_record: Callable[[str, int, str], None]
    """Store other JSON text as a record's event, as an older Ratchet would have written it."""


def _sqlite(tmp_path: Any, codec: PayloadCodec | None = None) -> Iterator[Backend]:
    path = tmp_path / "ratchet.db"
    db = SqliteDatabase(path)

    def rewrite(run_id: str, version: int, text: str) -> None:
        with db.write() as tx:
            tx.execute(
                "UPDATE checkpoints SET event = ? WHERE run_id = ? AND version = ?",
                (text, run_id, version),
            )

    @contextmanager
    def connect() -> Iterator[Mailbox]:
        other = SqliteDatabase(path)
        try:
            yield SqliteMailbox(other, codec)
        finally:
            other.close()

    yield Backend(
        SqliteCheckpointStore(db, codec),
        SqliteLedger(db, codec=codec),
        SqliteMailbox(db, codec),
        connect,
        lambda: list(db.connection.iterdump()),
        lambda run_id, version: db.connection.execute(
            "SELECT event FROM checkpoints WHERE run_id = ? AND version = ?", (run_id, version)
        ).fetchone()[0],
        rewrite,
    )
    db.close()


def _dynamodb(tmp_path: Any, codec: PayloadCodec | None = None) -> Iterator[Backend]:
    # Requests served one at a time, which is all the racing tests need of moto.
    with one_dynamodb_call_at_a_time(), mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_tables(client, checkpoints="checkpoints", idempotency="idempotency", app="app")

        @contextmanager
        def connect() -> Iterator[Mailbox]:
            # The mailbox keeps no state of its own and a boto3 client serves any thread, so
            # one client stands for many senders.
            yield DynamoMailbox(client, "checkpoints", codec=codec)

        def key(run_id: str, version: int) -> dict[str, Any]:
            return {"run_id": {"S": run_id}, "sk": {"S": checkpoint_sk(version)}}

        def record(run_id: str, version: int) -> str:
            item = client.get_item(TableName="checkpoints", Key=key(run_id, version))["Item"]
            return str(item["event"]["S"])

        def rewrite(run_id: str, version: int, text: str) -> None:
            client.update_item(
                TableName="checkpoints",
                Key=key(run_id, version),
                UpdateExpression="SET #event = :text",
                ExpressionAttributeNames={"#event": "event"},
                ExpressionAttributeValues={":text": {"S": text}},
            )

        yield Backend(
            DynamoDbCheckpointStore(
                client, table="checkpoints", ledger_table="idempotency", codec=codec
            ),
            DynamoDbLedger(client, table="idempotency", codec=codec),
            DynamoMailbox(client, "checkpoints", codec=codec),
            connect,
            lambda: [scan(client, table) for table in ("checkpoints", "idempotency", "app")],
            record,
            rewrite,
        )


def _postgres(tmp_path: Any, codec: PayloadCodec | None = None) -> Iterator[Backend]:
    # A store in a database of the test's own in this process's cluster, dropped after.
    postgres = cluster()
    name = postgres.fresh_database(store=True)
    url = PostgresUrl.parse(postgres.url(name))
    db = PostgresDatabase(url)

    def rows() -> list[Any]:
        with db.read() as tx:
            tables = [
                str(table)
                for (table,) in tx.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() ORDER BY table_name"
                )
            ]
            return [
                (table, tx.execute(f"SELECT t::text FROM {table} AS t ORDER BY 1").fetchall())
                for table in tables
            ]

    def record(run_id: str, version: int) -> str:
        with db.read() as tx:
            row = tx.execute(
                "SELECT event FROM checkpoints WHERE run_id = %s AND version = %s",
                (run_id, version),
            ).fetchone()
        assert row is not None
        return str(row[0])

    def rewrite(run_id: str, version: int, text: str) -> None:
        with db.write() as tx:
            tx.execute(
                "UPDATE checkpoints SET event = %s WHERE run_id = %s AND version = %s",
                (text, run_id, version),
            )

    @contextmanager
    def connect() -> Iterator[Mailbox]:
        # A pool of its own, as another process's.
        other = PostgresDatabase(url)
        try:
            yield PostgresMailbox(other, codec)
        finally:
            other.close()

    try:
        yield Backend(
            PostgresCheckpointStore(db, codec),
            PostgresLedger(db, codec=codec),
            PostgresMailbox(db, codec),
            connect,
            rows,
            record,
            rewrite,
        )
    finally:
        db.close()
        postgres.drop_database(name)


BACKENDS = {"sqlite": _sqlite, "dynamodb": _dynamodb, "postgres": _postgres}


def _sealed(backend: Callable[[Any, PayloadCodec | None], Iterator[Backend]]) -> Any:
    """The backend with a payload codec on (`RATCHET_PAYLOAD_KEY=local`); its `record` is the
    record's text as it was before it was sealed, which is what the contract speaks of."""

    def sealed(tmp_path: Any) -> Iterator[Backend]:
        codec = KeyringCodec(tmp_path / "payload-keys", create=True)
        for found in backend(tmp_path, codec):

            def record(run_id: str, version: int, found: Backend = found) -> str:
                text = found.record(run_id, version)
                opened = stored.opened_text(text, codec, context=f"ratchet:event:{run_id}".encode())
                return opened if isinstance(opened, str) else opened.decode()

            yield replace(found, record=record)

    return sealed


SEALED_BACKENDS = {
    "sqlite-sealed": _sealed(_sqlite),
    "dynamodb-sealed": _sealed(_dynamodb),
    "postgres-sealed": _sealed(_postgres),
}
"""The checkpoint store's and the mailbox's contracts hold whether their records are sealed or
not (`test_store_contract.py` and `test_mailbox_contract.py` run on these too)."""


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Backend]:
    yield from BACKENDS[request.param](tmp_path)

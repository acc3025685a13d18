"""DynamoDB on moto for the tests: the tables, fresh clients, and the engine harness of
`tests/support.py` (stub model, fake side-effecting tool) on the DynamoDB store and ledger."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from moto import mock_aws

from ratchet.adapters.dynamodb import DynamoDbCheckpointStore, DynamoDbLedger, create_tables
from ratchet.adapters.s3_blobs import NoBlobStore
from ratchet.aws.settings import AwsSettings
from ratchet.engine.core import Binding, Engine, Outcome
from ratchet.faults import NO_FAULTS, FaultPlan
from ratchet.state import RunOptions, RunState
from tests.support import LOG, FakeTable, StubModel, fake_agent

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

REGION = "us-east-1"
SETTINGS = AwsSettings(
    checkpoints_table="ratchet-checkpoints",
    idempotency_table="ratchet-idempotency",
    app_table="ratchet-app",
)


def new_client(**options: Any) -> DynamoDBClient:
    """A client of its own, as a fresh process or Lambda container would make."""
    return boto3.client("dynamodb", region_name=REGION, **options)


def make_tables(client: DynamoDBClient) -> None:
    create_tables(
        client,
        checkpoints=SETTINGS.checkpoints_table,
        idempotency=SETTINGS.idempotency_table,
        app=SETTINGS.app_table,
    )


@contextmanager
def moto_tables() -> Iterator[DynamoDBClient]:
    """moto's DynamoDB with Ratchet's three tables, for the span of the block."""
    with mock_aws():
        client = new_client()
        make_tables(client)
        yield client


def store_of(client: DynamoDBClient) -> DynamoDbCheckpointStore:
    return DynamoDbCheckpointStore(
        client, table=SETTINGS.checkpoints_table, ledger_table=SETTINGS.idempotency_table
    )


def ledger_of(client: DynamoDBClient) -> DynamoDbLedger:
    return DynamoDbLedger(client, table=SETTINGS.idempotency_table)


def scan(client: DynamoDBClient, table: str) -> list[dict[str, Any]]:
    """Every item of a table, in key order, to compare before and after."""
    items = [
        dict(item)
        for page in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
        for item in page.get("Items", [])
    ]
    return sorted(items, key=repr)


@dataclass
class DynamoHarness:
    """`tests.support.Harness` on DynamoDB (moto must be active). `restart()` is a fresh
    process's view: a new client, a new engine, nothing carried over but the stub's call log
    and the fake tool's table."""

    root: Path
    model: StubModel
    faults: FaultPlan = NO_FAULTS
    worker_id: str = "worker-1"

    def __post_init__(self) -> None:
        self.table = FakeTable(self.root / "app.db")
        self.client = new_client()
        self.engine = self._engine()

    def _engine(self) -> Engine:
        binding = Binding(fake_agent(self.table), self.model)
        return Engine(
            store=self.store,
            ledger=self.ledger,
            blobs=NoBlobStore(),
            bind=lambda state: binding,
            worker_id=self.worker_id,
            logger=LOG,
            faults=self.faults,
        )

    @property
    def store(self) -> DynamoDbCheckpointStore:
        return store_of(self.client)

    @property
    def ledger(self) -> DynamoDbLedger:
        return ledger_of(self.client)

    def start(self, run_id: str = "run", **options: int) -> RunState:
        state = RunState(
            run_id=run_id, agent="fake", goal="write the rows", options=RunOptions(**options)
        )
        assert self.engine.start(state)
        return self.engine.load(run_id)

    def restart(
        self, *, faults: FaultPlan = NO_FAULTS, worker_id: str = "worker-2"
    ) -> DynamoHarness:
        self.faults, self.worker_id = faults, worker_id
        self.client = new_client()
        self.engine = self._engine()
        return self

    def run_until_stopped(self, run_id: str = "run", limit: int = 500) -> RunState:
        for _ in range(limit):
            if self.engine.advance(run_id).outcome is not Outcome.CONTINUE:
                return self.engine.load(run_id)
        raise AssertionError(f"run {run_id} did not stop within {limit} advances")

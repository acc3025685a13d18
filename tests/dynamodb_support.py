"""DynamoDB on moto for the tests and benches: the tables, fresh clients, and the engine
harness of `tests/support.py` (stub model, fake side-effecting tool) on the DynamoDB store and
ledger."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from unittest import mock

import boto3
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.dynamodb.responses import DynamoHandler

from ratchet.adapters.dynamodb.items import TABLES, error_code
from ratchet.adapters.dynamodb.ledger import DynamoDbLedger
from ratchet.adapters.dynamodb.store import DynamoDbCheckpointStore
from ratchet.adapters.s3_blobs import NoBlobStore
from ratchet.ports import BlobStore
from ratchet.runtime.aws_settings import AwsSettings
from tests.support import Harness

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


def create_tables(client: DynamoDBClient, *, checkpoints: str, idempotency: str, app: str) -> None:
    """Create the three tables with the keys and TTL of `TABLES`, on demand (pay per request),
    unless they exist.

    For the tests and benches on moto and local development against DynamoDB Local; deployed
    tables come from the CDK stack.
    """
    names = {"checkpoints": checkpoints, "idempotency": idempotency, "app": app}
    for role, name in names.items():
        spec = TABLES[role]
        keys = [spec.partition_key, *([spec.sort_key] if spec.sort_key else [])]
        index_keys = [k for index in spec.indexes for k in (index.partition_key, index.sort_key)]
        indexes: list[Any] = [
            {
                "IndexName": index.name,
                "KeySchema": [
                    {"AttributeName": index.partition_key, "KeyType": "HASH"},
                    {"AttributeName": index.sort_key, "KeyType": "RANGE"},
                ],
                "Projection": {
                    "ProjectionType": "INCLUDE",
                    "NonKeyAttributes": list(index.projected),
                },
            }
            for index in spec.indexes
        ]
        extra: dict[str, Any] = {"GlobalSecondaryIndexes": indexes} if indexes else {}
        try:
            client.create_table(
                TableName=name,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[
                    {"AttributeName": k, "AttributeType": "S"} for k in [*keys, *index_keys]
                ],
                KeySchema=[
                    {"AttributeName": k, "KeyType": "HASH" if i == 0 else "RANGE"}
                    for i, k in enumerate(keys)
                ],
                **extra,
            )
        except ClientError as error:
            if error_code(error) != "ResourceInUseException":
                raise
        client.get_waiter("table_exists").wait(
            TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )
        if spec.ttl_attribute is None:
            continue
        ttl = client.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
        # Enabling TTL twice is an error on DynamoDB, so a second call leaves it as it is.
        if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
            client.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": spec.ttl_attribute},
            )


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


@contextmanager
def moto_server() -> Iterator[str]:
    """moto as an HTTP server on a free local port, for other processes (a `ratchet` command,
    a fresh step handler) to reach: its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        reset_moto(endpoint)
        yield endpoint
    finally:
        server.stop()


def reset_moto(endpoint: str) -> None:
    """Empty moto's state through the server at `endpoint`: it is the process's, and another
    test of this process may have left tables of the same names behind, holding runs of the
    same ids."""
    reset = urllib.request.Request(f"{endpoint}/moto-api/reset", data=b"", method="POST")
    with urllib.request.urlopen(reset, timeout=30) as answer:
        assert answer.status == 200


def server_store_url(endpoint: str, **overrides: str) -> str:
    """The `dynamodb://` store URL of the test tables on the moto server at `endpoint`; an
    override replaces a parameter (`table=` the checkpoints table), and an empty one drops it."""
    parameters = {
        "ledger": SETTINGS.idempotency_table,
        "app": SETTINGS.app_table,
        "region": REGION,
        "endpoint": endpoint,
    } | overrides
    table = parameters.pop("table", SETTINGS.checkpoints_table)
    query = "&".join(f"{name}={value}" for name, value in parameters.items() if value)
    return f"dynamodb://{table}?{query}"


def server_client(endpoint: str) -> DynamoDBClient:
    """A client of the moto server at `endpoint`, with test credentials of its own."""
    return boto3.client(
        "dynamodb",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


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


class DynamoHarness(Harness):
    """`tests.support.Harness` on DynamoDB (moto must be active). A restart makes a new
    client, as a fresh process or Lambda container would."""

    def _connect(self) -> None:
        self.client = new_client()

    def _disconnect(self) -> None:
        pass

    @property
    def store(self) -> DynamoDbCheckpointStore:
        return store_of(self.client)

    @property
    def ledger(self) -> DynamoDbLedger:
        return ledger_of(self.client)

    @property
    def blobs(self) -> BlobStore:
        return NoBlobStore()


def one_dynamodb_call_at_a_time() -> Any:
    """A patch that has moto serve one DynamoDB request at a time: moto's DynamoDB is not
    thread-safe (a transaction deep-copies a table another thread's update may be changing),
    while DynamoDB serves each request whole, so serving them one at a time loses nothing
    that racing threads (the state machine's, a test's own) need of it."""
    lock = threading.RLock()
    original = DynamoHandler.call_action

    def call_action(self: Any) -> Any:
        with lock:
            return original(self)

    return mock.patch.object(DynamoHandler, "call_action", call_action)


@contextmanager
def serialized_moto_tables() -> Iterator[DynamoDBClient]:
    """`moto_tables`, its requests served one at a time (`one_dynamodb_call_at_a_time`)."""
    with one_dynamodb_call_at_a_time(), moto_tables() as client:
        yield client

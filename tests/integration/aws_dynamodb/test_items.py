"""DynamoDB-specific facts of the item layout, beyond the backend-neutral conformance suite:
what expires by TTL and what must not, the tables' key schemas, and other items in a run's
partition that the store must step around."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from ratchet.adapters.dynamodb.items import DEFAULT_RETENTION_DAYS, TABLES, TTL_ATTRIBUTE
from ratchet.adapters.dynamodb.store import DynamoDbCheckpointStore
from ratchet.ports import LedgerEntry
from tests.conformance.test_store_contract import new_run, step_commit
from tests.dynamodb_support import SETTINGS, create_tables, ledger_of, moto_tables, scan, store_of

DAY = 24 * 3600


@pytest.fixture
def client() -> Iterator[object]:
    with moto_tables() as client:
        yield client


def items_by_sk(client) -> dict[str, dict[str, Any]]:
    return {item["sk"]["S"]: item for item in scan(client, SETTINGS.checkpoints_table)}


def test_checkpoint_records_expire_after_the_retention_window_and_the_head_never(client):
    state, checkpoint = new_run()
    store_of(client).create_run(state, checkpoint)
    commit = step_commit(state, 1)
    store_of(client).commit(commit)

    items = items_by_sk(client)

    assert set(items) == {"HEAD", "CP#000000000001", "CP#000000000002"}
    assert TTL_ATTRIBUTE not in items["HEAD"]
    created = commit.checkpoint.created_at
    expected = int((created + timedelta(days=DEFAULT_RETENTION_DAYS)).timestamp())
    assert items["CP#000000000002"][TTL_ATTRIBUTE] == {"N": str(expected)}
    first = int(items["CP#000000000001"][TTL_ATTRIBUTE]["N"])
    assert abs(first - (checkpoint.created_at.timestamp() + DEFAULT_RETENTION_DAYS * DAY)) < 2


def test_the_retention_window_is_configurable(client):
    store = DynamoDbCheckpointStore(
        client,
        table=SETTINGS.checkpoints_table,
        ledger_table=SETTINGS.idempotency_table,
        retention_days=7,
    )
    state, checkpoint = new_run()
    store.create_run(state, checkpoint)

    record = items_by_sk(client)["CP#000000000001"]

    assert int(record[TTL_ATTRIBUTE]["N"]) == int(checkpoint.created_at.timestamp()) + 7 * DAY


def test_ledger_records_carry_the_ttl_attribute_as_epoch_seconds(client):
    entry = ledger_of(client).begin(
        LedgerEntry(key="r1/step-1", run_id="r1", step=1, args_hash="h", decision={})
    )

    (item,) = scan(client, SETTINGS.idempotency_table)

    assert entry.expires_at is not None
    assert item[TTL_ATTRIBUTE] == {"N": str(int(entry.expires_at.timestamp()))}


def test_tables_have_the_contract_key_schemas_and_ttl_on_expires_at(client):
    names = {
        "checkpoints": SETTINGS.checkpoints_table,
        "idempotency": SETTINGS.idempotency_table,
        "app": SETTINGS.app_table,
    }
    # Creating them again (a second `make` against DynamoDB Local, say) is harmless.
    create_tables(
        client,
        checkpoints=names["checkpoints"],
        idempotency=names["idempotency"],
        app=names["app"],
    )

    for role, spec in TABLES.items():
        table = client.describe_table(TableName=names[role])["Table"]
        keys = {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]}
        expected = {spec.partition_key: "HASH"} | (
            {spec.sort_key: "RANGE"} if spec.sort_key else {}
        )
        assert keys == expected, role
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        ttl = client.describe_time_to_live(TableName=names[role])["TimeToLiveDescription"]
        if spec.ttl_attribute is None:
            assert ttl["TimeToLiveStatus"] == "DISABLED", role
        else:
            assert ttl["TimeToLiveStatus"] == "ENABLED", role
            assert ttl["AttributeName"] == TTL_ATTRIBUTE


def test_approval_items_in_a_run_partition_are_not_checkpoints_or_runs(client):
    state, checkpoint = new_run()
    store_of(client).create_run(state, checkpoint)
    client.put_item(
        TableName=SETTINGS.checkpoints_table,
        Item={"run_id": {"S": "r1"}, "sk": {"S": "APPROVAL#a1b2"}, "token": {"S": "t"}},
    )
    store_of(client).commit(step_commit(state, 1))

    assert [c.version for c in store_of(client).list_checkpoints("r1")] == [1, 2]
    assert [r.run_id for r in store_of(client).list_runs()] == ["r1"]

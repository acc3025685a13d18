"""The DynamoDB store's writes as DynamoDB sees them: one transaction per commit, a lost race
that changes nothing, and oversized records refused before any request is sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from bench.dynamodb_cost import RequestMeter
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.store import SqliteCheckpointStore
from ratchet.errors import CheckpointTooLarge, RunNotFound, StaleVersion
from ratchet.ports import MAX_ITEM_BYTES, LedgerEntry, LedgerStatus
from tests.conformance.test_store_contract import new_run, step_commit
from tests.dynamodb_support import SETTINGS, ledger_of, moto_tables, new_client, scan, store_of


@pytest.fixture
def client() -> Iterator[object]:
    with moto_tables() as client:
        yield client


def begin(client, run_id: str, step: int) -> None:
    ledger_of(client).begin(
        LedgerEntry(
            key=f"{run_id}/step-{step}",
            run_id=run_id,
            step=step,
            args_hash="h",
            decision={"name": "write_row", "arguments": {"n": step}},
        )
    )


def everything(client) -> dict[str, list[dict[str, object]]]:
    return {
        table: scan(client, table)
        for table in (SETTINGS.checkpoints_table, SETTINGS.idempotency_table)
    }


def test_two_workers_committing_on_one_version_one_wins_and_the_other_changes_nothing(client):
    # Given two workers, each with its own client, that both read the run at version 1
    state, checkpoint = new_run()
    store_of(client).create_run(state, checkpoint)
    begin(client, "r1", 1)
    first, second = new_client(), new_client()
    read_by_first = store_of(first).load_head("r1")
    read_by_second = store_of(second).load_head("r1")
    assert read_by_first == read_by_second == state
    meter = RequestMeter(second)

    # When the first commits its step, and then the second commits its own on the same version
    winner = step_commit(state, 1, text="winner")
    store_of(first).commit(winner)
    after_winner = everything(client)
    with pytest.raises(StaleVersion, match="no longer at version 1"):
        store_of(second).commit(step_commit(state, 1, text="loser"))

    # Then the loser's one TransactWriteItems was cancelled whole: not an item changed
    assert [r.operation for r in meter.take()] == ["TransactWriteItems"]
    assert everything(client) == after_winner
    assert store_of(client).load_head("r1") == winner.head
    assert [c.version for c in store_of(client).list_checkpoints("r1")] == [1, 2]
    recorded = ledger_of(client).get("r1/step-1")
    assert recorded is not None
    assert (recorded.status, recorded.result) == (LedgerStatus.COMPLETED, "winner")


def test_a_commit_is_one_transaction_of_head_record_and_ledger(client):
    state, checkpoint = new_run()
    store_of(client).create_run(state, checkpoint)
    begin(client, "r1", 1)
    meter = RequestMeter(client)

    store_of(client).commit(step_commit(state, 1))

    (request,) = meter.take()
    assert request.operation == "TransactWriteItems"
    assert request.tables == {SETTINGS.checkpoints_table, SETTINGS.idempotency_table}


def test_a_transaction_carries_the_conditions_that_make_it_safe(client):
    state, checkpoint = new_run()
    store_of(client).create_run(state, checkpoint)
    sent: list[dict[str, Any]] = []
    client.meta.events.register(
        "before-send.dynamodb", lambda request, **_: sent.append(json.loads(request.body))
    )

    store_of(client).commit(step_commit(state, 1))

    head, record, completion = (next(iter(i.values())) for i in sent[0]["TransactItems"])
    assert head["ConditionExpression"] == "#version = :expected"
    assert head["ExpressionAttributeValues"][":expected"] == {"N": "1"}
    assert record["Item"]["sk"] == {"S": "CP#000000000002"}
    assert record["ConditionExpression"] == "attribute_not_exists(#pk)"
    assert completion["Key"] == {"key": {"S": "r1/step-1"}}


def test_committing_to_a_run_that_does_not_exist_is_run_not_found(client):
    state, _ = new_run("ghost")

    with pytest.raises(RunNotFound, match="ghost"):
        store_of(client).commit(step_commit(state, 1))

    assert everything(client)[SETTINGS.checkpoints_table] == []


def test_oversized_items_are_refused_before_a_request_is_sent(client):
    state, checkpoint = new_run()
    store_of(client).create_run(state, checkpoint)
    before = everything(client)
    meter = RequestMeter(client)
    huge = "x" * (MAX_ITEM_BYTES + 1)

    with pytest.raises(CheckpointTooLarge):
        store_of(client).commit(step_commit(state, 1, text=huge))
    with pytest.raises(CheckpointTooLarge, match="head"):
        store_of(client).create_run(*new_run("big", goal=huge))
    with pytest.raises(CheckpointTooLarge, match="ledger decision"):
        ledger_of(client).begin(
            LedgerEntry(key="r1/step-1", run_id="r1", step=1, args_hash="h", decision={"x": huge})
        )
    with pytest.raises(CheckpointTooLarge, match="ledger result"):
        ledger_of(client).complete("r1/step-1", huge)

    assert meter.take() == []
    assert everything(client) == before


def test_the_size_check_counts_attribute_names_as_dynamodb_does(client):
    # A head whose JSON alone (as records keep it: no field that is None) is exactly at the
    # limit (the SQLite store takes it), but not once the item's other attributes and their
    # names are added.
    state, _ = new_run("edge")
    overhead = len(state.model_dump_json(exclude_none=True).encode()) - len(state.goal.encode())
    edge, checkpoint = new_run("edge", goal="g" * (MAX_ITEM_BYTES - overhead))
    assert len(edge.model_dump_json(exclude_none=True).encode()) == MAX_ITEM_BYTES

    # The head item keeps the goal in its static part; the first record keeps the whole state.
    with pytest.raises(CheckpointTooLarge, match=r"run edge (head|checkpoint)"):
        store_of(client).create_run(edge, checkpoint)

    assert store_of(client).load_head("edge") is None


def test_a_commit_reports_the_same_bytes_as_on_sqlite(client, tmp_path):
    # The receipt counts logical bytes (the UTF-8 values written), so figures compare across
    # backends; DynamoDB's own item sizes are a different, billing, figure.
    db = SqliteDatabase(tmp_path / "ratchet.db")
    state, checkpoint = new_run()
    commit = step_commit(state, 1, text="copied 1,000 rows")
    receipts = []
    for store in (SqliteCheckpointStore(db), store_of(client)):
        store.create_run(state, checkpoint)
        receipts.append(store.commit(commit).bytes_written)
    db.close()

    assert receipts[0] == receipts[1] > 0

"""The idempotency ledger on DynamoDB: the AWS twin of `ratchet.adapters.sqlite.ledger`.

The idempotency table, partition key `key`: one item per `<run_id>/step-<n>` (`run_id`, `step`,
`status`, `args_hash`, `decision` as JSON until completed, `result` once completed (while an
at-most-once call is `called`, its `CallStart` as JSON), `created_at`), expiring by the table's
TTL attribute. A commit completes its key in the
checkpoint store's transaction (`ratchet.adapters.dynamodb.store`), which removes the decision:
the step's record, in the same transaction, holds it. What DynamoDB turns away is `StoreBusy`
or `StoreUnavailable` (`ratchet.adapters.dynamodb.items`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import (
    DEFAULT_RETENTION_DAYS,
    TTL_ATTRIBUTE,
    check_size,
    epoch_seconds,
    error_code,
    number_attribute,
    text_attribute,
    translated_errors,
)
from ratchet.errors import IdempotencyConflict
from ratchet.ports import CallStart, LedgerEntry, LedgerStatus
from ratchet.sealing import PayloadCodec
from ratchet.state import utcnow
from ratchet.stored import open_sealed_text, opened_args_hash, sealed_args_hash, sealed_text

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    from ratchet.adapters.dynamodb.items import Item


class DynamoDbLedger:
    """`IdempotencyLedger` on DynamoDB: one item per key, expiring `retention_days` after the
    step was decided (`expires_at`, the table's TTL attribute; TTL deletes late, never early)."""

    def __init__(
        self,
        client: DynamoDBClient,
        *,
        table: str,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        codec: PayloadCodec | None = None,
    ) -> None:
        self._client = client
        self._table = table
        self._retention = timedelta(days=retention_days)
        self._codec = codec  # seals a decision's arguments until its step's record holds them

    @translated_errors
    def begin(self, entry: LedgerEntry) -> LedgerEntry:
        now = utcnow()
        # Whole seconds, as the TTL attribute stores it, so a re-read compares equal.
        expires_at = datetime.fromtimestamp(
            epoch_seconds(entry.expires_at or now + self._retention), UTC
        )
        item: Item = {
            "key": text_attribute(entry.key),
            "run_id": text_attribute(entry.run_id),
            "step": number_attribute(entry.step),
            "status": text_attribute(LedgerStatus.IN_PROGRESS.value),
            "args_hash": text_attribute(
                sealed_args_hash(entry.args_hash, self._codec, run_id=entry.run_id)
            ),
            "decision": text_attribute(
                sealed_text(
                    json.dumps(entry.decision, sort_keys=True),
                    self._codec,
                    part="decision",
                    run_id=entry.run_id,
                )
            ),
            "created_at": text_attribute(now.isoformat()),
            TTL_ATTRIBUTE: number_attribute(epoch_seconds(expires_at)),
        }
        check_size(f"ledger decision of {entry.key}", item)
        # Insert-if-absent: of two workers deciding the same step, the first record stands;
        # the second gets it back from the failed check (ALL_OLD) and compares the hashes.
        try:
            self._client.put_item(
                TableName=self._table,
                Item=item,
                ConditionExpression="attribute_not_exists(#key)",
                ExpressionAttributeNames={"#key": "key"},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            old = cast("dict[str, Any]", error.response).get("Item")
            stored = _ledger_entry(old, self._codec) if old is not None else self.get(entry.key)
            assert stored is not None, "a ledger record vanished between the check and the read"
            if stored.args_hash != entry.args_hash:
                raise IdempotencyConflict(entry.key) from None
            return stored
        return entry.model_copy(
            update={"status": LedgerStatus.IN_PROGRESS, "expires_at": expires_at}
        )

    @translated_errors
    def get(self, key: str) -> LedgerEntry | None:
        found = self._client.get_item(
            TableName=self._table, Key={"key": text_attribute(key)}, ConsistentRead=True
        ).get("Item")
        return None if found is None else _ledger_entry(found, self._codec)

    @translated_errors
    def complete(self, key: str, result: str) -> None:
        completion: Item = {
            "status": text_attribute(LedgerStatus.COMPLETED.value),
            "result": text_attribute(result),
        }
        check_size(f"ledger result of {key}", completion)
        # Conditional on the record existing, so a typo'd key fails instead of writing a
        # record of a step that never began.
        try:
            self._client.update_item(
                TableName=self._table,
                Key={"key": text_attribute(key)},
                UpdateExpression="SET #status = :status, #result = :result REMOVE #decision",
                ConditionExpression="attribute_exists(#key)",
                ExpressionAttributeNames={
                    "#status": "status",
                    "#result": "result",
                    "#decision": "decision",
                    "#key": "key",
                },
                ExpressionAttributeValues={
                    ":status": completion["status"],
                    ":result": completion["result"],
                },
            )
        except ClientError as error:
            if error_code(error) == "ConditionalCheckFailedException":
                raise KeyError(f"no idempotency record for {key!r}") from None
            raise

    @translated_errors
    def start_call(self, key: str, call: CallStart) -> bool:
        try:
            self._client.update_item(
                TableName=self._table,
                Key={"key": text_attribute(key)},
                UpdateExpression="SET #status = :called, #result = :call",
                ConditionExpression="#status = :in_progress",
                ExpressionAttributeNames={"#status": "status", "#result": "result"},
                ExpressionAttributeValues={
                    ":called": text_attribute(LedgerStatus.CALLED.value),
                    ":call": text_attribute(call.model_dump_json()),
                    ":in_progress": text_attribute(LedgerStatus.IN_PROGRESS.value),
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            if cast("dict[str, Any]", error.response).get("Item") is None:
                raise KeyError(f"no idempotency record for {key!r}") from None
            return False
        return True


def _ledger_entry(
    item: Mapping[str, AttributeValueTypeDef], codec: PayloadCodec | None
) -> LedgerEntry:
    # A completed key carries no decision (the completion removes it; one written for a key
    # that was never begun had none): it reads back as None. A called key's `result` is its
    # call's start.
    status = LedgerStatus(item["status"]["S"])
    result = item["result"]["S"] if "result" in item else None
    called = status is LedgerStatus.CALLED
    run_id = item["run_id"]["S"] if "run_id" in item else ""
    decision = (
        open_sealed_text(item["decision"]["S"], codec, part="decision", run_id=run_id)
        if "decision" in item
        else None
    )
    return LedgerEntry(
        key=item["key"]["S"],
        run_id=run_id,
        step=int(item["step"]["N"]) if "step" in item else 0,
        status=status,
        args_hash=opened_args_hash(item["args_hash"]["S"], codec, run_id=run_id)
        if "args_hash" in item
        else "",
        decision=None if decision is None else json.loads(decision),
        result=None if called else result,
        expires_at=_from_epoch(item.get(TTL_ATTRIBUTE)),
        call=CallStart.model_validate_json(result) if called and result else None,
    )


def _from_epoch(value: AttributeValueTypeDef | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(int(value["N"]), UTC)

"""The migration scenario's application data in a DynamoDB table (the stack's app table).

The same `MigrationData` Protocol as the SQLite implementation, for runs whose steps execute in
Lambda, where nothing on the function's disk survives. One partition per run,
`pk = "migration#<run_id>"`, with these sort keys:

- `META`: `source_rows`, `batches`, `target_rows` (a running count for `inspect`), `dropped`;
- `LEGACY#<batch>`: one legacy batch, its 1,000 rows as one compact JSON array;
- `ORDERS#<batch>#<key>`: the rows a copy wrote, one item per batch *and* idempotency key, so
  a batch applied twice under two keys shows up as duplicate rows in `counts()`, exactly as
  the SQLite table without a unique constraint would show it;
- `OUTBOX#<key>`: one queued email;
- `APPLIED#<key>`: the at-most-once record: argument hash, result, deliveries, and what the
  key did (`effect`, the method's name, and `args`, JSON), which a fork applies again to data
  of its own.

At most once per key: each side effect is one `TransactWriteItems` whose first item is the
`APPLIED#<key>` record, put only if absent. There is no read before the write: a redelivered
key cancels the transaction (nothing written) and is then read back, compared by argument hash
and counted as a delivery.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from ratchet.errors import IdempotencyConflict
from ratchet.scenarios.migration_data import (
    BATCH_SIZE,
    SOURCE_TABLE,
    TARGET_TABLE,
    Effect,
    MigrationCounts,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import (
        AttributeValueTypeDef,
        TransactWriteItemTypeDef,
        WriteRequestTypeDef,
    )

    Item = dict[str, AttributeValueTypeDef]

META = "META"
LEGACY = "LEGACY#"
ORDERS = "ORDERS#"
OUTBOX = "OUTBOX#"
APPLIED = "APPLIED#"
BATCH_WRITE_LIMIT = 25
BATCH_WRITE_ATTEMPTS = 8


def _s(value: str) -> AttributeValueTypeDef:
    return {"S": value}


def _n(value: int) -> AttributeValueTypeDef:
    return {"N": str(value)}


def legacy_rows(batch: int) -> list[list[Any]]:
    """The batch's rows as `[id, customer, amount_cents]`, the same data SQLite seeds."""
    low = (batch - 1) * BATCH_SIZE + 1
    return [
        [i, f"customer-{i % 997:03d}", (i * 7919) % 100_000] for i in range(low, low + BATCH_SIZE)
    ]


class DynamoDbMigrationData:
    def __init__(self, client: DynamoDBClient, table: str, run_id: str) -> None:
        self._client = client
        self._table = table
        self._pk = f"migration#{run_id}"

    def close(self) -> None:
        """Nothing to close: the client is shared. Here to match the SQLite implementation."""

    def seed(self, batches: int) -> None:
        if self._meta() is not None:
            return
        # The legacy items first, META last: META is what says the seed is complete, so a
        # seed cut short is redone whole (rewriting identical items) by the next call.
        self._batch_write(
            {
                "PutRequest": {
                    "Item": {
                        **self._key(f"{LEGACY}{batch:06d}"),
                        "rows": _s(_compact(legacy_rows(batch))),
                        "row_count": _n(BATCH_SIZE),
                    }
                }
            }
            for batch in range(1, batches + 1)
        )
        try:
            self._client.put_item(
                TableName=self._table,
                Item={
                    **self._key(META),
                    "source_rows": _n(batches * BATCH_SIZE),
                    "batches": _n(batches),
                    "target_rows": _n(0),
                },
                # Two seeds of one run race only to write the same thing; the first stands.
                ConditionExpression="attribute_not_exists(#pk)",
                ExpressionAttributeNames=_names("pk"),
            )
        except ClientError as error:
            if _code(error) != "ConditionalCheckFailedException":
                raise

    def inspect(self, table: str) -> str:
        if table not in (SOURCE_TABLE, TARGET_TABLE):
            return f"No table named {table!r}; tables: {SOURCE_TABLE}, {TARGET_TABLE}."
        meta = self._meta() or {}
        if table == SOURCE_TABLE and "dropped" in meta:
            return f"{SOURCE_TABLE} no longer exists (dropped)."
        # The legacy rows never change until the drop, and every copy adds its rows to
        # `target_rows` in the transaction that writes them: one small read either way.
        counter = "source_rows" if table == SOURCE_TABLE else "target_rows"
        rows = int(meta[counter]["N"]) if counter in meta else 0
        batches = -(-rows // BATCH_SIZE)
        return f"{table} has {rows:,} rows ({batches} batches of {BATCH_SIZE:,})."

    def copy_batch(self, batch: int, key: str) -> str:
        args = {"batch": batch}
        legacy = self._client.get_item(
            TableName=self._table, Key=self._key(f"{LEGACY}{batch:06d}"), ConsistentRead=True
        ).get("Item")
        rows = json.loads(legacy["rows"]["S"]) if legacy is not None else []
        low, high = (batch - 1) * BATCH_SIZE + 1, batch * BATCH_SIZE
        result = f"Copied {len(rows):,} rows (ids {low:,}-{high:,}) in batch {batch}."
        writes: list[TransactWriteItemTypeDef] = [
            # The copy must not land after the drop: the drop sets `dropped` on META in its
            # own transaction, so whichever of the two commits second sees the other.
            {
                "Update": {
                    "TableName": self._table,
                    "Key": self._key(META),
                    "UpdateExpression": "ADD #target_rows :rows",
                    "ConditionExpression": "attribute_exists(#pk) "
                    "AND attribute_not_exists(#dropped)",
                    "ExpressionAttributeNames": _names("target_rows", "pk", "dropped"),
                    "ExpressionAttributeValues": {":rows": _n(len(rows))},
                }
            }
        ]
        if rows:
            writes.append(
                {
                    "Put": {
                        "TableName": self._table,
                        "Item": {
                            **self._key(f"{ORDERS}{batch:06d}#{key}"),
                            "rows": _s(_compact(rows)),
                            "batch": _n(batch),
                            "row_count": _n(len(rows)),
                        },
                    }
                }
            )
        return self._apply_once(
            key, "copy_batch", args, result, writes, on_refused=self._why_no_copy
        )

    def drop_source(self, key: str) -> str:
        result = f"Dropped {SOURCE_TABLE}."
        writes: list[TransactWriteItemTypeDef] = [
            {
                "Update": {
                    "TableName": self._table,
                    "Key": self._key(META),
                    "UpdateExpression": "SET #dropped = :yes",
                    "ExpressionAttributeNames": _names("dropped"),
                    "ExpressionAttributeValues": {":yes": {"BOOL": True}},
                }
            }
        ]
        recorded = self._apply_once(key, "drop_source", {"table": SOURCE_TABLE}, result, writes)
        # META says the table is gone from the moment the transaction lands; the legacy items
        # are reclaimed after it. A crash in between leaves unreadable items, which the
        # redelivered step (this same call, with the same key) deletes.
        self._purge(LEGACY)
        return recorded

    def send_email(self, to: str, subject: str, body: str, key: str) -> str:
        args = {"to": to, "subject": subject, "body": body}
        result = f"Email to {to} queued: {subject!r}."
        writes: list[TransactWriteItemTypeDef] = [
            {
                "Put": {
                    "TableName": self._table,
                    "Item": {
                        **self._key(f"{OUTBOX}{key}"),
                        "recipient": _s(to),
                        "subject": _s(subject),
                        "body": _s(body),
                        "key": _s(key),
                    },
                }
            }
        ]
        return self._apply_once(key, "send_email", args, result, writes)

    def counts(self) -> MigrationCounts:
        meta = self._meta() or {}
        copied = [
            row[0] for item in self._query(ORDERS, "rows") for row in json.loads(item["rows"]["S"])
        ]
        distinct = len(set(copied))
        source = int(meta["source_rows"]["N"]) if "source_rows" in meta else 0
        applied = list(self._query(APPLIED, "deliveries"))
        return MigrationCounts(
            source_rows=source,
            target_rows=len(copied),
            duplicate_rows=len(copied) - distinct,
            missing_rows=source - distinct,
            emails_sent=sum(1 for _ in self._query(OUTBOX, "sk")),
            legacy_dropped="dropped" in meta,
            keys_delivered=sum(int(item["deliveries"]["N"]) for item in applied),
            keys_applied=len(applied),
        )

    def effects(self) -> list[Effect]:
        return [
            Effect(
                key=item["sk"]["S"].removeprefix(APPLIED),
                name=item["effect"]["S"] if "effect" in item else None,
                args=json.loads(item["args"]["S"]) if "args" in item else None,
            )
            for item in self._query(APPLIED, "sk", "effect", "args")
        ]

    # --- at most once per key ---------------------------------------------------------------

    def _apply_once(
        self,
        key: str,
        effect: str,
        args: dict[str, Any],
        result: str,
        writes: list[TransactWriteItemTypeDef],
        on_refused: Callable[[], None] | None = None,
    ) -> str:
        """Apply `writes` and record `key` in one transaction, unless `key` was applied: then
        count the redelivery and return the recorded result (another argument hash: refuse)."""
        record: TransactWriteItemTypeDef = {
            "Put": {
                "TableName": self._table,
                "Item": {
                    **self._key(f"{APPLIED}{key}"),
                    "args_hash": _s(_hash(args)),
                    "result": _s(result),
                    "deliveries": _n(1),
                    "effect": _s(effect),
                    "args": _s(json.dumps(args, sort_keys=True)),
                },
                # The race this settles: two deliveries of one key (a retried step whose
                # first attempt is still running, say) both try to apply it. The record is
                # put only if absent, in the same transaction as the effect, so exactly one
                # delivery's effect lands; the other is cancelled whole and reads the record.
                "ConditionExpression": "attribute_not_exists(#pk)",
                "ExpressionAttributeNames": _names("pk"),
            }
        }
        try:
            self._client.transact_write_items(TransactItems=[record, *writes])
        except ClientError as error:
            reasons = _cancellation_codes(error)
            if not reasons:
                raise
            if reasons[0] == "ConditionalCheckFailed":
                return self._redelivered(key, args)
            if on_refused is not None and "ConditionalCheckFailed" in reasons[1:]:
                on_refused()
            raise
        return result

    def _redelivered(self, key: str, args: dict[str, Any]) -> str:
        found = self._client.get_item(
            TableName=self._table, Key=self._key(f"{APPLIED}{key}"), ConsistentRead=True
        ).get("Item")
        assert found is not None, f"{key} was refused as applied, yet has no record"
        if found["args_hash"]["S"] != _hash(args):
            raise IdempotencyConflict(key)
        self._client.update_item(
            TableName=self._table,
            Key=self._key(f"{APPLIED}{key}"),
            UpdateExpression="ADD #deliveries :one",
            ExpressionAttributeNames=_names("deliveries"),
            ExpressionAttributeValues={":one": _n(1)},
        )
        return found["result"]["S"]

    def _why_no_copy(self) -> None:
        if self._meta() is None:
            raise RuntimeError(f"{SOURCE_TABLE} was never seeded for this run; nothing to copy")
        raise RuntimeError(f"{SOURCE_TABLE} was dropped; nothing left to copy")

    # --- plumbing ---------------------------------------------------------------------------

    def _key(self, sk: str) -> Item:
        return {"pk": _s(self._pk), "sk": _s(sk)}

    def _meta(self) -> Item | None:
        return self._client.get_item(
            TableName=self._table, Key=self._key(META), ConsistentRead=True
        ).get("Item")

    def _query(self, prefix: str, *projection: str) -> Iterator[Item]:
        pages = self._client.get_paginator("query").paginate(
            TableName=self._table,
            KeyConditionExpression="#pk = :pk AND begins_with(#sk, :prefix)",
            ProjectionExpression=", ".join(f"#{name}" for name in projection),
            ExpressionAttributeNames=_names("pk", "sk", *projection),
            ExpressionAttributeValues={":pk": _s(self._pk), ":prefix": _s(prefix)},
            ConsistentRead=True,
        )
        for page in pages:
            yield from page.get("Items", [])

    def _purge(self, prefix: str) -> None:
        keys = [{"pk": item["pk"], "sk": item["sk"]} for item in self._query(prefix, "pk", "sk")]
        self._batch_write({"DeleteRequest": {"Key": key}} for key in keys)

    def _batch_write(self, requests: Iterable[WriteRequestTypeDef]) -> None:
        pending: list[WriteRequestTypeDef] = list(requests)
        while pending:
            chunk, pending = pending[:BATCH_WRITE_LIMIT], pending[BATCH_WRITE_LIMIT:]
            for attempt in range(BATCH_WRITE_ATTEMPTS):
                unprocessed = self._client.batch_write_item(RequestItems={self._table: chunk}).get(
                    "UnprocessedItems", {}
                )
                chunk = cast("list[WriteRequestTypeDef]", unprocessed.get(self._table, []))
                if not chunk:
                    break
                # DynamoDB hands back what it throttled; back off before sending it again.
                time.sleep(0.05 * 2**attempt)
            else:
                raise RuntimeError(f"DynamoDB kept throttling writes to {self._table}")


def _names(*attributes: str) -> dict[str, str]:
    """Expression aliases for every attribute named, reserved word (`rows`) or not."""
    return {f"#{name}": name for name in attributes}


def _compact(rows: list[list[Any]]) -> str:
    return json.dumps(rows, separators=(",", ":"))


def _code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def _cancellation_codes(error: ClientError) -> list[str]:
    if _code(error) != "TransactionCanceledException":
        return []
    return [reason.get("Code", "") for reason in error.response.get("CancellationReasons", [])]


def _hash(args: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()

"""Checkpoints and the idempotency ledger in DynamoDB: the AWS twin of `adapters/sqlite.py`.

The item layout is a contract shared with the stack (`cdk/`) and the handlers:

- checkpoints table, partition key `run_id`, sort key `sk`, one partition per run:
  - `HEAD`: the run's head (`version`, `status`, `step`, `attempts`, `state` as RunState JSON,
    `updated_at`). It lives as long as the run: it never carries the TTL attribute.
  - `CP#<version, 12 digits>`: one immutable record per commit (`version`, `step`, `status`,
    `worker_id`, `bytes`, `created_at`, `event` as JSON) that expires `retention_days` after
    it was written (`expires_at`, epoch seconds, the table's TTL attribute).
  - `APPROVAL#<id>`: the handlers' approval items; this module ignores them.
- idempotency table, partition key `key`: one record per `<run_id>/step-<n>`.

Reads are strongly consistent. Every write that depends on something read is conditional, and
the conditions are the whole concurrency story: there are no locks. The client is injected and
its own retries are the orchestrator's business (Step Functions retries a step; the SDK
should retry little), so a rejected write surfaces at once as a typed error: `StaleVersion`,
`RunNotFound`, `IdempotencyConflict`, `CheckpointTooLarge`. What DynamoDB turns away for now
(throttling past the SDK's retries, a transaction cancelled by a concurrent one, a dropped or
timed-out connection) is `StoreBusy`; what retrying cannot fix (a missing table, no permission,
no credentials) is `StoreUnavailable`. Nothing above this module sees botocore's errors but
those it cannot name (a malformed request: a bug), which stay as they are.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from ratchet import stored
from ratchet.errors import (
    CheckpointTooLarge,
    IdempotencyConflict,
    RunNotFound,
    RunUnreadable,
    StaleVersion,
    StoreBusy,
    StoreUnavailable,
)
from ratchet.ports import (
    MAX_ITEM_BYTES,
    Commit,
    CommitReceipt,
    LedgerEntry,
    LedgerStatus,
    RunSummary,
)
from ratchet.state import (
    RECENT_STEPS,
    CheckpointEvent,
    RunState,
    RunStatus,
    StoredCheckpoint,
    utcnow,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef, TransactWriteItemTypeDef

    Item = dict[str, AttributeValueTypeDef]

HEAD_SK = "HEAD"
CHECKPOINT_PREFIX = "CP#"
APPROVAL_PREFIX = "APPROVAL#"
TTL_ATTRIBUTE = "expires_at"
DEFAULT_RETENTION_DAYS = 30

_CONDITION_FAILED = "ConditionalCheckFailed"


LAST_VERSION = 10**12 - 1
"""The highest version a checkpoint's sort key can hold (12 digits)."""


def checkpoint_sk(version: int) -> str:
    """Zero-padded so that the sort key orders records by version."""
    return f"{CHECKPOINT_PREFIX}{version:012d}"


# --- the tables --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableSpec:
    partition_key: str
    sort_key: str | None = None
    ttl_attribute: str | None = None


TABLES: Mapping[str, TableSpec] = {
    "checkpoints": TableSpec("run_id", "sk", TTL_ATTRIBUTE),
    "idempotency": TableSpec("key", None, TTL_ATTRIBUTE),
    "app": TableSpec("pk", "sk", None),
}
"""The key schema and TTL attribute of each table, by role. All keys are strings. The CDK stack
declares the same tables (it imports nothing from here; tests/infra compares them)."""


def create_tables(client: DynamoDBClient, *, checkpoints: str, idempotency: str, app: str) -> None:
    """Create the three tables on demand (pay per request) with TTL on, unless they exist.

    For tests on moto and local development against DynamoDB Local; deployed tables come from
    the CDK stack.
    """
    names = {"checkpoints": checkpoints, "idempotency": idempotency, "app": app}
    for role, name in names.items():
        spec = TABLES[role]
        keys = [spec.partition_key, *([spec.sort_key] if spec.sort_key else [])]
        try:
            client.create_table(
                TableName=name,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in keys],
                KeySchema=[
                    {"AttributeName": k, "KeyType": "HASH" if i == 0 else "RANGE"}
                    for i, k in enumerate(keys)
                ],
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


# --- attribute values and item sizes -----------------------------------------------------------


def text_attribute(value: str) -> AttributeValueTypeDef:
    return {"S": value}


def _n(value: int) -> AttributeValueTypeDef:
    return {"N": str(value)}


def _epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def item_size(item: Mapping[str, AttributeValueTypeDef]) -> int:
    """DynamoDB's size of an item of strings, numbers and booleans: attribute names plus values
    (a number takes one byte per two significant digits, plus one)."""
    size = 0
    for name, value in item.items():
        size += len(name.encode("utf-8"))
        if "S" in value:
            size += len(value["S"].encode("utf-8"))
        elif "N" in value:
            digits = value["N"].lstrip("-").replace(".", "").strip("0")
            size += (len(digits) + 1) // 2 + 1
        elif "BOOL" in value or "NULL" in value:
            size += 1
        else:
            raise TypeError(f"item_size does not handle attribute {name!r}: {value!r}")
    return size


def _check_size(what: str, item: Mapping[str, AttributeValueTypeDef]) -> None:
    size = item_size(item)
    if size > MAX_ITEM_BYTES:
        raise CheckpointTooLarge(what, size, MAX_ITEM_BYTES)


def _text_bytes(*values: str | None) -> int:
    """The logical byte count the SQLite store reports, so receipts compare across backends."""
    return sum(len(v.encode("utf-8")) for v in values if v is not None)


def error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


_TRANSIENT_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TransactionConflictException",
        "TransactionInProgressException",
        "InternalServerError",
        "ServiceUnavailable",
    }
)
_TRANSIENT_REASONS = frozenset({"TransactionConflict", "ThrottlingError"})


def is_transient(error: ClientError) -> bool:
    """Whether DynamoDB turned the request away for now rather than for good.

    A transaction cancelled only because another one touched the same items (or throttling)
    counts; one cancelled by a failed condition does not: that is a stale version, an answer.
    """
    if error_code(error) in _TRANSIENT_CODES:
        return True
    reasons = {r.get("Code") for r in _cancellation_reasons(error)} - {"None", None}
    return bool(reasons) and reasons <= _TRANSIENT_REASONS


def _cancellation_reasons(error: ClientError) -> list[dict[str, Any]]:
    """Per-item reasons of a cancelled transaction, in the order the items were sent."""
    if error_code(error) != "TransactionCanceledException":
        return []
    return cast("list[dict[str, Any]]", error.response.get("CancellationReasons", []))


_PERMANENT_CODES = frozenset(
    {
        "ResourceNotFoundException",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "MissingAuthenticationTokenException",
    }
)


def store_error(error: Exception, table: str) -> Exception:
    """Ratchet's name for a DynamoDB failure, or the failure itself if it has none.

    `StoreBusy` when the request may succeed if sent again: throttling and conflicts (see
    `is_transient`), and a connection that could not be made, was dropped or timed out (the
    write may or may not have landed; a retried step finds out from the version it reads).
    `StoreUnavailable` when it cannot: a missing table, no permission, no credentials.
    """
    if isinstance(error, ClientError):
        code = error_code(error)
        if is_transient(error):
            return StoreBusy(f"the store is busy (DynamoDB table {table}); try again: {error}")
        if code in _PERMANENT_CODES:
            return StoreUnavailable(f"the store cannot be read (DynamoDB table {table}): {error}")
    elif isinstance(error, BotocoreConnectionError | HTTPClientError):
        return StoreBusy(f"the store is busy (DynamoDB table {table}); try again: {error}")
    elif isinstance(error, NoCredentialsError):
        return StoreUnavailable(f"the store cannot be read (DynamoDB table {table}): {error}")
    return error


_Method = TypeVar("_Method", bound=Callable[..., Any])


def translated_errors(method: _Method) -> _Method:
    """Raise a backend failure that escaped `method`'s own handling under Ratchet's name."""

    @functools.wraps(method)
    def translating(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (ClientError, BotocoreConnectionError, HTTPClientError, NoCredentialsError) as error:
            translated = store_error(error, self._table)
            if translated is error:
                raise
            raise translated from error

    return cast("_Method", translating)


# --- the checkpoint store ----------------------------------------------------------------------


class DynamoDbCheckpointStore:
    """`CheckpointStore` on DynamoDB (see `ratchet.ports` for the contract it honours).

    A commit is one `TransactWriteItems`: the head update (conditional on the version read),
    the new checkpoint record (which must not exist yet) and the ledger completion, so either
    all three land or none does. `list_runs` is a Scan of the whole checkpoints table, kept
    for the CLI and tests: it reads every item, so it is not for a hot path.
    """

    def __init__(
        self,
        client: DynamoDBClient,
        *,
        table: str,
        ledger_table: str,
        retention_days: int = DEFAULT_RETENTION_DAYS,
    ) -> None:
        self._client = client
        self._table = table
        self._ledger_table = ledger_table
        self._retention = timedelta(days=retention_days)

    @translated_errors
    def create_run(self, state: RunState, checkpoint: StoredCheckpoint) -> bool:
        state_json = stored.head_json(state)
        static_json = stored.static_json(state)
        # The static part rides in the head item, written here only: a commit's update sets
        # the changing attributes and leaves it as it is.
        head = {**self._head_item(state, state_json), "static": text_attribute(static_json)}
        record, _ = self._checkpoint_item(
            checkpoint, other_bytes=_text_bytes(state_json, static_json)
        )
        _check_size(f"run {state.run_id} head", head)
        _check_size(f"run {state.run_id} checkpoint", record)
        # Two starts of one run id may both have seen no head. Both puts are conditional on
        # the items being new, in one transaction: the first start creates the run, the
        # second is cancelled whole and leaves the first start's items untouched.
        try:
            self._client.transact_write_items(
                TransactItems=[
                    {"Put": self._put_new(self._table, head, "run_id")},
                    {"Put": self._put_new(self._table, record, "run_id")},
                ]
            )
        except ClientError as error:
            if any(r.get("Code") == _CONDITION_FAILED for r in _cancellation_reasons(error)):
                return False
            raise
        return True

    @translated_errors
    def load_head(self, run_id: str) -> RunState | None:
        """The head and the records of its window in one Query, newest first: the head item
        sorts after every record (`HEAD` > `CP#...`), so it comes first (see `ratchet.stored`)."""
        query: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#run_id = :run_id AND #sk BETWEEN :first AND :head",
            "ExpressionAttributeNames": {"#run_id": "run_id", "#sk": "sk"},
            "ExpressionAttributeValues": {
                ":run_id": text_attribute(run_id),
                ":first": text_attribute(CHECKPOINT_PREFIX),
                ":head": text_attribute(HEAD_SK),
            },
            "ScanIndexForward": False,
            "ConsistentRead": True,
            # The head and a default window's step records, with room for a decision or two;
            # a larger window, or more records per step, reads on (below).
            "Limit": 1 + RECENT_STEPS + 2,
        }
        page = self._client.query(**query)
        items = page.get("Items", [])
        if not items or items[0]["sk"]["S"] != HEAD_SK:
            return None
        found, records = items[0], items[1:]
        static = found.get("static")
        state = stored.load_head(
            found["state"]["S"],
            static["S"] if static else None,
            version=int(found["version"]["N"]),
            attempts=int(found["attempts"]["N"]),
        )
        if state.step == 0:
            return state  # no step yet: no window
        first = stored.window_start(state)
        recent: list[CheckpointEvent] = []
        while True:
            for item in records:
                if int(item["step"]["N"]) < first:
                    return stored.with_window(state, recent[::-1])
                try:
                    recent.append(stored.parse_event(item["event"]["S"]))
                except ValueError as error:
                    version, reason = item["version"]["N"], " ".join(str(error).split())[:200]
                    raise RunUnreadable(
                        run_id, f"its checkpoint {version} is damaged ({reason})"
                    ) from None
            last = page.get("LastEvaluatedKey")
            if last is None:
                return stored.with_window(state, recent[::-1])
            page = self._client.query(**query, ExclusiveStartKey=last)
            records = page.get("Items", [])

    @translated_errors
    def begin_attempt(self, run_id: str, expected_version: int) -> int:
        # Conditional on the version read: of two workers counting an attempt at the same
        # step, one moves the head on and the other is told its view is stale.
        self._bump_head(
            run_id,
            expected_version,
            update="SET #attempts = #attempts + :one, #version = :next",
            condition="#version = :expected",
        )
        return expected_version + 1

    @translated_errors
    def release_attempt(self, run_id: str, expected_version: int) -> int:
        # Only the engine that counted ahead can still find the head at the version it left;
        # if anyone moved the run since, the count is theirs and this update is refused.
        self._bump_head(
            run_id,
            expected_version,
            update="SET #attempts = #attempts - :one, #version = :next",
            condition="#version = :expected AND #attempts > :zero",
            values={":zero": _n(0)},
        )
        return expected_version + 1

    @translated_errors
    def commit(self, commit: Commit) -> CommitReceipt:
        started = time.perf_counter()
        head = commit.head
        state_json = stored.head_json(head)
        result = commit.completes.result if commit.completes else None
        head_item = self._head_item(head, state_json)
        record, record_bytes = self._checkpoint_item(
            commit.checkpoint, other_bytes=_text_bytes(state_json, result)
        )
        _check_size(f"run {head.run_id} head", head_item)
        _check_size(f"run {head.run_id} step {commit.checkpoint.step} record", record)
        items: list[TransactWriteItemTypeDef] = [
            # The version check: the head must still be at the version this worker read. If
            # another worker committed or counted an attempt since, the whole transaction is
            # cancelled, so neither the record nor the ledger completion lands either.
            {
                "Update": {
                    "TableName": self._table,
                    "Key": self._head_key(head.run_id),
                    # A run made before schema 3 kept its whole head in `state` and has no
                    # `static` attribute: its first lean commit adds it (the item, not the
                    # request, is billed, so this costs no write unit).
                    "UpdateExpression": "SET #version = :version, #status = :status, "
                    "#step = :step, #attempts = :attempts, #state = :state, "
                    "#updated_at = :updated_at, #static = if_not_exists(#static, :static)",
                    "ConditionExpression": "#version = :expected",
                    "ExpressionAttributeNames": {
                        "#version": "version",
                        "#status": "status",
                        "#step": "step",
                        "#attempts": "attempts",
                        "#state": "state",
                        "#updated_at": "updated_at",
                        "#static": "static",
                    },
                    "ExpressionAttributeValues": {
                        ":version": head_item["version"],
                        ":status": head_item["status"],
                        ":step": head_item["step"],
                        ":attempts": head_item["attempts"],
                        ":state": head_item["state"],
                        ":updated_at": head_item["updated_at"],
                        ":static": text_attribute(stored.static_json(head)),
                        ":expected": _n(commit.expected_version),
                    },
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
            # Records are immutable: never overwrite one, even if the versions went wrong.
            {"Put": self._put_new(self._table, record, "run_id")},
        ]
        if commit.completes is not None:
            # The result joins the decision checked at `begin`; the engine keeps results small
            # (an output over 2 KB goes to a blob, and the result is its preview).
            completion = {
                "status": text_attribute(LedgerStatus.COMPLETED.value),
                "result": text_attribute(result or ""),
            }
            _check_size(f"ledger result of {commit.completes.key}", completion)
            items.append({"Update": self._ledger_completion(commit.completes.key, completion)})
        try:
            self._client.transact_write_items(TransactItems=items)
        except ClientError as error:
            self._raise_if_head_moved(error, head.run_id, commit.expected_version)
            raise
        written = _text_bytes(state_json, result) + record_bytes
        return CommitReceipt(written, (time.perf_counter() - started) * 1000)

    @translated_errors
    def list_checkpoints(self, run_id: str, *, after: int = 0) -> list[StoredCheckpoint]:
        pages = self._client.get_paginator("query").paginate(
            TableName=self._table,
            KeyConditionExpression="#run_id = :run_id AND #sk BETWEEN :first AND :last",
            ExpressionAttributeNames={"#run_id": "run_id", "#sk": "sk"},
            ExpressionAttributeValues={
                ":run_id": text_attribute(run_id),
                ":first": text_attribute(checkpoint_sk(after + 1)),
                ":last": text_attribute(checkpoint_sk(LAST_VERSION)),
            },
            ConsistentRead=True,
        )
        return [_checkpoint(item) for page in pages for item in page.get("Items", [])]

    @translated_errors
    def list_runs(self) -> list[RunSummary]:
        """Every run's head, oldest update first. A Scan: it reads the whole table."""
        pages = self._client.get_paginator("scan").paginate(
            TableName=self._table,
            FilterExpression="#sk = :head",
            ProjectionExpression="#run_id, #status, #step, #version, #updated_at",
            ExpressionAttributeNames={
                "#sk": "sk",
                "#run_id": "run_id",
                "#status": "status",
                "#step": "step",
                "#version": "version",
                "#updated_at": "updated_at",
            },
            ExpressionAttributeValues={":head": text_attribute(HEAD_SK)},
            ConsistentRead=True,
        )
        runs = [
            RunSummary(
                run_id=item["run_id"]["S"],
                status=item["status"]["S"],
                step=int(item["step"]["N"]),
                version=int(item["version"]["N"]),
                updated_at=datetime.fromisoformat(item["updated_at"]["S"]),
            )
            for page in pages
            for item in page.get("Items", [])
        ]
        return sorted(runs, key=lambda run: run.updated_at)

    # --- items -----------------------------------------------------------------------------

    @staticmethod
    def _head_key(run_id: str) -> Item:
        return {"run_id": text_attribute(run_id), "sk": text_attribute(HEAD_SK)}

    @staticmethod
    def _head_item(state: RunState, state_json: str) -> Item:
        return {
            "run_id": text_attribute(state.run_id),
            "sk": text_attribute(HEAD_SK),
            "version": _n(state.version),
            "status": text_attribute(state.status.value),
            "step": _n(state.step),
            "attempts": _n(state.attempts),
            "state": text_attribute(state_json),
            "updated_at": text_attribute(state.updated_at.isoformat()),
        }

    def _checkpoint_item(
        self, checkpoint: StoredCheckpoint, *, other_bytes: int
    ) -> tuple[Item, int]:
        """The record's item, and its own logical bytes (the SQLite row's, for the receipt)."""
        event_json = stored.event_json(checkpoint.event)
        own_bytes = _text_bytes(
            checkpoint.run_id, checkpoint.worker_id, event_json, checkpoint.status.value
        )
        item: Item = {
            "run_id": text_attribute(checkpoint.run_id),
            "sk": text_attribute(checkpoint_sk(checkpoint.version)),
            "version": _n(checkpoint.version),
            "step": _n(checkpoint.step),
            "status": text_attribute(checkpoint.status.value),
            "worker_id": text_attribute(checkpoint.worker_id),
            "bytes": _n(own_bytes + other_bytes),
            "created_at": text_attribute(checkpoint.created_at.isoformat()),
            "event": text_attribute(event_json),
            TTL_ATTRIBUTE: _n(_epoch(checkpoint.created_at + self._retention)),
        }
        return item, own_bytes

    @staticmethod
    def _put_new(table: str, item: Item, partition_key: str) -> Any:
        return {
            "TableName": table,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": partition_key},
        }

    def _ledger_completion(self, key: str, completion: Item) -> Any:
        # Unconditional, like the SQLite store's UPDATE: the engine always begins a key before
        # it commits it; should the record be gone (expired), the completion stands on its
        # own with the result, and expires like any ledger record.
        return {
            "TableName": self._ledger_table,
            "Key": {"key": text_attribute(key)},
            "UpdateExpression": "SET #status = :status, #result = :result, "
            "#expires_at = if_not_exists(#expires_at, :expires_at)",
            "ExpressionAttributeNames": {
                "#status": "status",
                "#result": "result",
                "#expires_at": TTL_ATTRIBUTE,
            },
            "ExpressionAttributeValues": {
                ":status": completion["status"],
                ":result": completion["result"],
                ":expires_at": _n(_epoch(utcnow() + self._retention)),
            },
        }

    # --- conditional updates of the head ---------------------------------------------------

    def _bump_head(
        self,
        run_id: str,
        expected_version: int,
        *,
        update: str,
        condition: str,
        values: Item | None = None,
    ) -> None:
        try:
            self._client.update_item(
                TableName=self._table,
                Key=self._head_key(run_id),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames={"#attempts": "attempts", "#version": "version"},
                ExpressionAttributeValues={
                    ":one": _n(1),
                    ":next": _n(expected_version + 1),
                    ":expected": _n(expected_version),
                    **(values or {}),
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            # ALL_OLD returns the head as the failed check saw it: none means no such run.
            if "Item" not in cast("dict[str, Any]", error.response):
                raise RunNotFound(run_id) from None
            raise StaleVersion(run_id, expected_version) from None

    @staticmethod
    def _raise_if_head_moved(error: ClientError, run_id: str, expected_version: int) -> None:
        reasons = _cancellation_reasons(error)
        if not reasons or reasons[0].get("Code") != _CONDITION_FAILED:
            return
        if "Item" not in reasons[0]:
            raise RunNotFound(run_id) from None
        raise StaleVersion(run_id, expected_version) from None


def _checkpoint(item: Mapping[str, AttributeValueTypeDef]) -> StoredCheckpoint:
    return StoredCheckpoint(
        run_id=item["run_id"]["S"],
        version=int(item["version"]["N"]),
        step=int(item["step"]["N"]),
        status=RunStatus(item["status"]["S"]),
        worker_id=item["worker_id"]["S"],
        size=int(item["bytes"]["N"]),
        created_at=datetime.fromisoformat(item["created_at"]["S"]),
        event=stored.parse_event(item["event"]["S"]),
    )


# --- the idempotency ledger --------------------------------------------------------------------


class DynamoDbLedger:
    """`IdempotencyLedger` on DynamoDB: one item per key, expiring `retention_days` after the
    step was decided (`expires_at`, the table's TTL attribute; TTL deletes late, never early)."""

    def __init__(
        self,
        client: DynamoDBClient,
        *,
        table: str,
        retention_days: int = DEFAULT_RETENTION_DAYS,
    ) -> None:
        self._client = client
        self._table = table
        self._retention = timedelta(days=retention_days)

    @translated_errors
    def begin(self, entry: LedgerEntry) -> LedgerEntry:
        now = utcnow()
        # Whole seconds, as the TTL attribute stores it, so a re-read compares equal.
        expires_at = datetime.fromtimestamp(_epoch(entry.expires_at or now + self._retention), UTC)
        item: Item = {
            "key": text_attribute(entry.key),
            "run_id": text_attribute(entry.run_id),
            "step": _n(entry.step),
            "status": text_attribute(LedgerStatus.IN_PROGRESS.value),
            "args_hash": text_attribute(entry.args_hash),
            "decision": text_attribute(json.dumps(entry.decision, sort_keys=True)),
            "created_at": text_attribute(now.isoformat()),
            TTL_ATTRIBUTE: _n(_epoch(expires_at)),
        }
        _check_size(f"ledger decision of {entry.key}", item)
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
            stored = _ledger_entry(old) if old is not None else self.get(entry.key)
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
        return None if found is None else _ledger_entry(found)

    @translated_errors
    def complete(self, key: str, result: str) -> None:
        completion: Item = {
            "status": text_attribute(LedgerStatus.COMPLETED.value),
            "result": text_attribute(result),
        }
        _check_size(f"ledger result of {key}", completion)
        # Conditional on the record existing, so a typo'd key fails instead of writing a
        # record of a step that never began.
        try:
            self._client.update_item(
                TableName=self._table,
                Key={"key": text_attribute(key)},
                UpdateExpression="SET #status = :status, #result = :result",
                ConditionExpression="attribute_exists(#key)",
                ExpressionAttributeNames={"#status": "status", "#result": "result", "#key": "key"},
                ExpressionAttributeValues={
                    ":status": completion["status"],
                    ":result": completion["result"],
                },
            )
        except ClientError as error:
            if error_code(error) == "ConditionalCheckFailedException":
                raise KeyError(f"no idempotency record for {key!r}") from None
            raise


def _ledger_entry(item: Mapping[str, AttributeValueTypeDef]) -> LedgerEntry:
    # A completion written for a key that was never begun carries no decision (see
    # `_ledger_completion`); it reads back with an empty one rather than failing.
    return LedgerEntry(
        key=item["key"]["S"],
        run_id=item["run_id"]["S"] if "run_id" in item else "",
        step=int(item["step"]["N"]) if "step" in item else 0,
        status=LedgerStatus(item["status"]["S"]),
        args_hash=item["args_hash"]["S"] if "args_hash" in item else "",
        decision=json.loads(item["decision"]["S"]) if "decision" in item else {},
        result=item["result"]["S"] if "result" in item else None,
        expires_at=_from_epoch(item.get(TTL_ATTRIBUTE)),
    )


def _from_epoch(value: AttributeValueTypeDef | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(int(value["N"]), UTC)

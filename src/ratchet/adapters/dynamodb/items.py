"""What every DynamoDB adapter shares: the tables' keys, attribute values and item sizes, and
Ratchet's names for DynamoDB's failures.

The clients are injected and their own retries are the orchestrator's business (Step Functions
retries a step; the SDK should retry little), so a rejected write surfaces at once. What
DynamoDB turns away for now (throttling past the SDK's retries, a transaction cancelled by a
concurrent one, a dropped or timed-out connection) is `StoreBusy`; what retrying cannot fix (a
missing table, no permission, no credentials) is `StoreUnavailable`: `store_error` names them,
and `translated_errors` applies it to each method of the store, the ledger and run data. Nothing
above those sees botocore's errors but those they cannot name (a malformed request: a bug),
which stay as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from ratchet.errors import CheckpointTooLarge, StoreBusy, StoreUnavailable
from ratchet.ports import MAX_ITEM_BYTES

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    Item = dict[str, AttributeValueTypeDef]

TTL_ATTRIBUTE = "expires_at"
DEFAULT_RETENTION_DAYS = 30


# --- the tables --------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexSpec:
    """A global secondary index: its keys (strings) and the attributes it projects."""

    name: str
    partition_key: str
    sort_key: str
    projected: tuple[str, ...]


@dataclass(frozen=True)
class TableSpec:
    partition_key: str
    sort_key: str | None = None
    ttl_attribute: str | None = None
    indexes: tuple[IndexSpec, ...] = ()


RUNS_INDEX = IndexSpec(
    "runs-by-status",
    partition_key="list_pk",
    sort_key="list_sk",
    projected=("status", "step", "version", "updated_at", "agent"),
)
"""Run heads by status and last change (`DynamoDbCheckpointStore.list_page`): only head items
carry its keys, so it holds one small item per run, never a step record."""

WAKES_INDEX = IndexSpec(
    "wakes-owed",
    partition_key="wake_pk",
    sort_key="wake_sk",
    projected=("wake_how",),
)
"""Settled waits whose parked execution may not have been answered yet, oldest first
(`ratchet.adapters.dynamodb.wakes`): only a wait item or an approval item carries its keys, from
just before a waker settles the wait until the execution is answered, so it holds nothing but
wakes still owed, and the sweep reads those alone."""

TABLES: Mapping[str, TableSpec] = {
    "checkpoints": TableSpec("run_id", "sk", TTL_ATTRIBUTE, (RUNS_INDEX, WAKES_INDEX)),
    "idempotency": TableSpec("key", None, TTL_ATTRIBUTE),
    "app": TableSpec("pk", "sk", None),
}
"""The key schema and TTL attribute of each table, by role. All keys are strings. The CDK stack
declares the same tables (it imports nothing from here; tests/infra compares them)."""


# --- attribute values and item sizes -----------------------------------------------------------


def text_attribute(value: str) -> AttributeValueTypeDef:
    return {"S": value}


def number_attribute(value: int) -> AttributeValueTypeDef:
    return {"N": str(value)}


def epoch_seconds(moment: datetime) -> int:
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


def check_size(what: str, item: Mapping[str, AttributeValueTypeDef]) -> None:
    size = item_size(item)
    if size > MAX_ITEM_BYTES:
        raise CheckpointTooLarge(what, size, MAX_ITEM_BYTES)


def text_bytes(*values: str | None) -> int:
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
    reasons = {r.get("Code") for r in cancellation_reasons(error)} - {"None", None}
    return bool(reasons) and reasons <= _TRANSIENT_REASONS


def cancellation_reasons(error: ClientError) -> list[dict[str, Any]]:
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

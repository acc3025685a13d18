"""The checkpoint store on DynamoDB: the AWS twin of `ratchet.adapters.sqlite.store`.

The item layout is a contract shared with the stack (`ratchet/cdk/`) and the handlers:

- checkpoints table, partition key `run_id`, sort key `sk`, one partition per run:
  - `HEAD`: the run's head (`version`, `status`, `step`, `attempts`, `state` as RunState JSON,
    `updated_at`). It lives as long as the run: it never carries the TTL attribute.
  - `CP#<version, 12 digits>`: one immutable record per commit (`version`, `step`, `status`,
    `worker_id`, `bytes`, `created_at`, `event` as JSON) that expires `retention_days` after
    it was written (`expires_at`, epoch seconds, the table's TTL attribute).
  - `APPROVAL#<id>`: the approval items (`ratchet.adapters.dynamodb.approvals`); this module
    ignores them.
  - `MAIL#<event id>` and `MAILBOX`: the run's mailbox (`ratchet.adapters.dynamodb.mailbox`);
    a commit that consumes an event updates its item (`Commit.consumes`), and nothing else
    here reads them.
  - `WAIT#<step, 10 digits>`: the task token of an execution parked on the run's event wait
    (`ratchet.adapters.dynamodb.waits`); this module ignores them.
- idempotency table (`ratchet.adapters.dynamodb.ledger`): a commit completes its step's key.

Reads are strongly consistent. Every write that depends on something read is conditional, and
the conditions are the whole concurrency story: there are no locks. A rejected write surfaces
at once as a typed error: `StaleVersion`, `RunNotFound`, `CheckpointTooLarge`; what DynamoDB
turns away is `StoreBusy` or `StoreUnavailable` (`ratchet.adapters.dynamodb.items`).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from ratchet import stored
from ratchet.adapters.dynamodb.items import (
    DEFAULT_RETENTION_DAYS,
    RUNS_INDEX,
    TTL_ATTRIBUTE,
    cancellation_reasons,
    check_size,
    epoch_seconds,
    error_code,
    number_attribute,
    text_attribute,
    text_bytes,
    translated_errors,
)
from ratchet.adapters.dynamodb.mailbox import consumption
from ratchet.errors import RunNotFound, RunUnreadable, StaleVersion
from ratchet.ports import Commit, CommitReceipt, LedgerStatus, RunCursor, RunSummary
from ratchet.sealing import PayloadCodec
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

    from ratchet.adapters.dynamodb.items import Item

HEAD_SK = "HEAD"
CHECKPOINT_PREFIX = "CP#"
_CONDITION_FAILED = "ConditionalCheckFailed"

LAST_VERSION = 10**12 - 1
"""The highest version a checkpoint's sort key can hold (12 digits)."""


LIST_SHARDS = 4
"""Partitions of the runs index per status. Each commit moves a run's index item (a delete and
a put, ~2 write units: it projects ~150 B, not the state), and one index partition key takes
about 1,000 write units a second, so one status's runs may commit ~500 steps a second per
shard: 2,000 across four. A page reads each shard's newest items and merges them."""


def list_shard(run_id: str) -> int:
    """The run's shard of the runs index, from its id's hash: the same for each status."""
    digest = hashlib.sha256(run_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % LIST_SHARDS


def list_partition(status: str, shard: int) -> str:
    return f"runs#{status}#{shard}"


def list_sort_key(updated_at: datetime, run_id: str) -> str:
    """Orders as (updated_at, run_id): the time in one fixed-width UTC form, so that text
    order is time order (`isoformat` drops zero microseconds)."""
    return f"{updated_at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%f')}#{run_id}"


def _summary(item: Mapping[str, Any]) -> RunSummary:
    """A head item (or its runs index item) as the store lists it; no agent for a head last
    written before heads kept it."""
    return RunSummary(
        run_id=item["run_id"]["S"],
        status=item["status"]["S"],
        step=int(item["step"]["N"]),
        version=int(item["version"]["N"]),
        updated_at=datetime.fromisoformat(item["updated_at"]["S"]),
        agent=item["agent"]["S"] if "agent" in item else None,
    )


def _key_of(item: Mapping[str, Any]) -> str | None:
    """The `concurrency_key` in a head item's static part (in clear when sealed)."""
    try:
        key = json.loads(item["static"]["S"]).get("concurrency_key")
    except (KeyError, ValueError, AttributeError):
        return None
    return key if isinstance(key, str) else None


def checkpoint_sk(version: int) -> str:
    """Zero-padded so that the sort key orders records by version."""
    return f"{CHECKPOINT_PREFIX}{version:012d}"


def committed_head_item(state: RunState, state_json: str) -> Item:
    """The head's item as a commit sets it: every attribute but `static`, which only
    `created_head_item` writes."""
    return {
        "run_id": text_attribute(state.run_id),
        "sk": text_attribute(HEAD_SK),
        "version": number_attribute(state.version),
        "status": text_attribute(state.status.value),
        "step": number_attribute(state.step),
        "attempts": number_attribute(state.attempts),
        "state": text_attribute(state_json),
        "updated_at": text_attribute(state.updated_at.isoformat()),
        "agent": text_attribute(state.agent),
        # The runs index's keys (RUNS_INDEX): the run's status and shard, then its last
        # change. Every commit sets them, so the index holds each run once, as it stands.
        "list_pk": text_attribute(list_partition(state.status.value, list_shard(state.run_id))),
        "list_sk": text_attribute(list_sort_key(state.updated_at, state.run_id)),
    }


def created_head_item(state: RunState, codec: PayloadCodec | None = None) -> Item:
    """The head's whole item, as `create_run` writes it and every later commit leaves it."""
    # The static part rides in the head item, written at creation only: a commit's update
    # sets the changing attributes and leaves it as it is.
    return {
        **committed_head_item(state, stored.head_json(state, codec)),
        "static": text_attribute(stored.static_json(state, codec)),
    }


def checkpoint_item(
    checkpoint: StoredCheckpoint,
    *,
    other_bytes: int,
    retention: timedelta,
    codec: PayloadCodec | None = None,
) -> tuple[Item, int]:
    """The record's item, expiring `retention` after it was written, and its own logical
    bytes (the SQLite row's, for the receipt)."""
    event_json = stored.event_json(checkpoint, codec)
    own_bytes = text_bytes(
        checkpoint.run_id, checkpoint.worker_id, event_json, checkpoint.status.value
    )
    item: Item = {
        "run_id": text_attribute(checkpoint.run_id),
        "sk": text_attribute(checkpoint_sk(checkpoint.version)),
        "version": number_attribute(checkpoint.version),
        "step": number_attribute(checkpoint.step),
        "status": text_attribute(checkpoint.status.value),
        "worker_id": text_attribute(checkpoint.worker_id),
        "bytes": number_attribute(own_bytes + other_bytes),
        "created_at": text_attribute(checkpoint.created_at.isoformat()),
        "event": text_attribute(event_json),
        TTL_ATTRIBUTE: number_attribute(epoch_seconds(checkpoint.created_at + retention)),
    }
    return item, own_bytes


class DynamoDbCheckpointStore:
    """`CheckpointStore` on DynamoDB (see `ratchet.ports` for the contract it honours).

    A commit is one `TransactWriteItems`: the head update (conditional on the version read),
    the new checkpoint record (which must not exist yet), the ledger completion and, for a
    commit that consumes an event, that event's update (conditional on it being pending), so
    either all land or none does. `list_runs` is a Scan of the whole checkpoints table, kept
    for the CLI and tests: it reads every item, so it is not for a hot path.
    """

    def __init__(
        self,
        client: DynamoDBClient,
        *,
        table: str,
        ledger_table: str,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        codec: PayloadCodec | None = None,
    ) -> None:
        self._client = client
        self._codec = codec  # seals what runs' records say of the world (`ratchet.stored`)
        self._table = table
        self._ledger_table = ledger_table
        self._retention = timedelta(days=retention_days)

    @translated_errors
    def create_run(self, state: RunState, checkpoint: StoredCheckpoint) -> bool:
        head = created_head_item(state, self._codec)
        record, _ = checkpoint_item(
            checkpoint,
            other_bytes=text_bytes(head["state"]["S"], head["static"]["S"]),
            retention=self._retention,
            codec=self._codec,
        )
        check_size(f"run {state.run_id} head", head)
        check_size(f"run {state.run_id} checkpoint", record)
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
            if any(r.get("Code") == _CONDITION_FAILED for r in cancellation_reasons(error)):
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
        try:
            state = stored.load_head(
                found["state"]["S"],
                static["S"] if static else None,
                version=int(found["version"]["N"]),
                attempts=int(found["attempts"]["N"]),
                codec=self._codec,
            )
        except (ValueError, TypeError, KeyError) as error:
            # The run's own damage, named as the SQLite store names it: the other runs, and
            # the pages that list them, go on.
            reason = " ".join(str(error).split())[:200]
            raise RunUnreadable(run_id, f"its stored state is damaged ({reason})") from None
        if state.step == 0:
            return state  # no step yet: no window
        first = stored.window_start(state)
        recent: list[CheckpointEvent] = []
        while True:
            for item in records:
                record_step = int(item["step"]["N"])
                if record_step < first:
                    return stored.with_window(state, recent[::-1])
                try:
                    event = stored.parse_event(
                        item["event"]["S"], run_id=run_id, step=record_step, codec=self._codec
                    )
                    recent.append(event)
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
        return self._count_attempt(run_id, expected_version, by=1)

    @translated_errors
    def release_attempt(self, run_id: str, expected_version: int) -> int:
        # Only the engine that counted the attempt can still find the head at the version it
        # left; if anyone moved the run since, the count is theirs and this update is refused.
        return self._count_attempt(run_id, expected_version, by=-1)

    def _count_attempt(self, run_id: str, expected_version: int, *, by: int) -> int:
        condition = "#version = :expected" + (" AND #attempts > :zero" if by < 0 else "")
        values = {
            ":by": number_attribute(by),
            ":next": number_attribute(expected_version + 1),
            ":expected": number_attribute(expected_version),
        }
        if by < 0:
            values[":zero"] = number_attribute(0)
        try:
            self._client.update_item(
                TableName=self._table,
                Key=self._head_key(run_id),
                UpdateExpression="SET #attempts = #attempts + :by, #version = :next",
                ConditionExpression=condition,
                ExpressionAttributeNames={"#attempts": "attempts", "#version": "version"},
                ExpressionAttributeValues=values,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            # ALL_OLD returns the head as the failed check saw it: none means no such run.
            if "Item" not in cast("dict[str, Any]", error.response):
                raise RunNotFound(run_id) from None
            raise StaleVersion(run_id, expected_version) from None
        return expected_version + 1

    @translated_errors
    def commit(self, commit: Commit) -> CommitReceipt:
        started = time.perf_counter()
        head = commit.head
        state_json = stored.head_json(head, self._codec)
        result = commit.completes.result if commit.completes else None
        head_item = committed_head_item(head, state_json)
        record, record_bytes = checkpoint_item(
            commit.checkpoint,
            other_bytes=text_bytes(state_json, result),
            retention=self._retention,
            codec=self._codec,
        )
        check_size(f"run {head.run_id} head", head_item)
        check_size(f"run {head.run_id} step {commit.checkpoint.step} record", record)
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
                    "#updated_at = :updated_at, #static = if_not_exists(#static, :static), "
                    "#list_pk = :list_pk, #list_sk = :list_sk, #agent = :agent",
                    "ConditionExpression": "#version = :expected",
                    "ExpressionAttributeNames": {
                        "#version": "version",
                        "#status": "status",
                        "#step": "step",
                        "#attempts": "attempts",
                        "#state": "state",
                        "#updated_at": "updated_at",
                        "#static": "static",
                        "#list_pk": "list_pk",
                        "#list_sk": "list_sk",
                        "#agent": "agent",
                    },
                    "ExpressionAttributeValues": {
                        ":version": head_item["version"],
                        ":status": head_item["status"],
                        ":step": head_item["step"],
                        ":attempts": head_item["attempts"],
                        ":state": head_item["state"],
                        ":updated_at": head_item["updated_at"],
                        ":static": text_attribute(stored.static_json(head, self._codec)),
                        ":list_pk": head_item["list_pk"],
                        ":list_sk": head_item["list_sk"],
                        ":agent": head_item["agent"],
                        ":expected": number_attribute(commit.expected_version),
                    },
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
            # Records are immutable: never overwrite one, even if the versions went wrong.
            {"Put": self._put_new(self._table, record, "run_id")},
        ]
        if commit.completes is not None:
            # The result replaces the decision checked at `begin`; the engine keeps results small
            # (an output over 2 KB goes to a blob, and the result is its preview).
            completion = {
                "status": text_attribute(LedgerStatus.COMPLETED.value),
                "result": text_attribute(result or ""),
            }
            check_size(f"ledger result of {commit.completes.key}", completion)
            items.append({"Update": self._ledger_completion(commit.completes.key, completion)})
        if commit.consumes is not None:
            # The event this commit settles a wait with is taken in the same transaction, and
            # only if it is still pending: one taken (or refused) meanwhile cancels the commit.
            # It expires with the record that names it.
            items.append(
                consumption(
                    self._table,
                    head.run_id,
                    commit.consumes,
                    expires_at=commit.checkpoint.created_at + self._retention,
                )
            )
        try:
            self._client.transact_write_items(TransactItems=items)
        except ClientError as error:
            self._raise_if_head_moved(error, head.run_id, commit.expected_version)
            if commit.consumes is not None and _failed_condition(error, len(items) - 1):
                raise StaleVersion(head.run_id, commit.expected_version) from None
            raise
        written = text_bytes(state_json, result) + record_bytes
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
        return [_checkpoint(item, self._codec) for page in pages for item in page.get("Items", [])]

    @translated_errors
    def last_checkpoints(self, run_id: str, *, limit: int) -> list[StoredCheckpoint]:
        """One Query of the run's partition from its newest record back, `limit` items at
        most: read on only where DynamoDB cut a page at 1 MB before `limit` records."""
        query: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#run_id = :run_id AND #sk BETWEEN :first AND :last",
            "ExpressionAttributeNames": {"#run_id": "run_id", "#sk": "sk"},
            "ExpressionAttributeValues": {
                ":run_id": text_attribute(run_id),
                ":first": text_attribute(checkpoint_sk(1)),
                ":last": text_attribute(checkpoint_sk(LAST_VERSION)),
            },
            "ScanIndexForward": False,
            "ConsistentRead": True,
        }
        items: list[Any] = []
        start: Any = None
        while len(items) < limit:
            page = self._client.query(
                **query,
                Limit=limit - len(items),
                **({"ExclusiveStartKey": start} if start else {}),
            )
            items.extend(page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        return [_checkpoint(item, self._codec) for item in reversed(items)]

    @translated_errors
    def index_unlisted(self, *, dry_run: bool = False) -> int:
        """Give the runs index the heads last written before it existed (a run's next commit
        would, but a run that has ended never commits again): one conditional update each, on
        the version read and only while the head is still unindexed (a commit meanwhile has
        indexed it). One Scan of the table; the number of heads indexed."""
        pages = self._client.get_paginator("scan").paginate(
            TableName=self._table,
            FilterExpression="#sk = :head AND attribute_not_exists(#list_pk)",
            ProjectionExpression="#run_id",
            ExpressionAttributeNames={"#sk": "sk", "#run_id": "run_id", "#list_pk": "list_pk"},
            ExpressionAttributeValues={":head": text_attribute(HEAD_SK)},
            ConsistentRead=True,
        )
        unlisted = [item["run_id"]["S"] for page in pages for item in page.get("Items", [])]
        if dry_run:
            return len(unlisted)
        indexed = 0
        for run_id in unlisted:
            state = self.load_head(run_id)
            if state is None:
                continue
            keys = committed_head_item(state, "")
            try:
                self._client.update_item(
                    TableName=self._table,
                    Key=self._head_key(run_id),
                    UpdateExpression="SET #list_pk = :list_pk, #list_sk = :list_sk, "
                    "#agent = :agent",
                    ConditionExpression="attribute_not_exists(#list_pk) AND #version = :version",
                    ExpressionAttributeNames={
                        "#list_pk": "list_pk",
                        "#list_sk": "list_sk",
                        "#agent": "agent",
                        "#version": "version",
                    },
                    ExpressionAttributeValues={
                        ":list_pk": keys["list_pk"],
                        ":list_sk": keys["list_sk"],
                        ":agent": keys["agent"],
                        ":version": number_attribute(state.version),
                    },
                )
            except ClientError as error:
                if error_code(error) != "ConditionalCheckFailedException":
                    raise
                continue  # committed (and so indexed) since it was read
            indexed += 1
        return indexed

    @translated_errors
    def list_runs(self) -> list[RunSummary]:
        """Every run's head, oldest update first. A Scan: it reads the whole table."""
        pages = self._client.get_paginator("scan").paginate(
            TableName=self._table,
            FilterExpression="#sk = :head",
            ProjectionExpression="#run_id, #status, #step, #version, #updated_at, #agent, #static",
            ExpressionAttributeNames={
                "#sk": "sk",
                "#run_id": "run_id",
                "#status": "status",
                "#step": "step",
                "#version": "version",
                "#updated_at": "updated_at",
                "#agent": "agent",
                "#static": "static",
            },
            ExpressionAttributeValues={":head": text_attribute(HEAD_SK)},
            ConsistentRead=True,
        )
        # A Scan reads (and is charged for) whole items: the static part, for the run's key,
        # costs no more read units.
        runs = [
            replace(_summary(item), concurrency_key=_key_of(item))
            for page in pages
            for item in page.get("Items", [])
        ]
        return sorted(runs, key=lambda run: run.updated_at)

    @translated_errors
    def list_page(
        self, *, status: str | None = None, limit: int, after: RunCursor | None = None
    ) -> list[RunSummary]:
        """Queries of the runs index, one per shard of each status asked for, read newest
        first a little at a time and merged: a page reads about `limit` items plus one
        read's worth per shard, however many runs and steps the table holds."""
        statuses = [status] if status is not None else [s.value for s in RunStatus]
        before = list_sort_key(after.updated_at, after.run_id) if after is not None else None
        chunk = max(1, -(-limit // LIST_SHARDS)) + 1
        partitions = [list_partition(s, shard) for s in statuses for shard in range(LIST_SHARDS)]
        # The merge needs every partition's newest items before it yields one: their first
        # reads go out at once (24 for a page of any status), the rest as the merge asks.
        with ThreadPoolExecutor(max_workers=len(partitions)) as pool:
            firsts = list(pool.map(lambda p: self._query_index(p, before, chunk, None), partitions))
        streams = [
            self._index_stream(p, before, chunk, first)
            for p, first in zip(partitions, firsts, strict=True)
        ]
        merged = heapq.merge(*streams, key=lambda item: item["list_sk"]["S"], reverse=True)
        page: list[RunSummary] = []
        seen: set[str] = set()
        for item in merged:
            # The index is eventually consistent: for a moment after a commit that changed a
            # run's status it may hold the run under both statuses. The newer one is listed.
            if item["run_id"]["S"] in seen:
                continue
            seen.add(item["run_id"]["S"])
            page.append(_summary(item))
            if len(page) == limit:
                break
        return page

    def _index_stream(
        self, partition: str, before: str | None, chunk: int, first: Any
    ) -> Iterator[Any]:
        """One index partition's items, newest first, from its `first` read on, read `chunk`
        at a time as the merge asks for them (a generator: a shard the page does not reach is
        read no further)."""
        page = first
        while True:
            yield from page.get("Items", [])
            start = page.get("LastEvaluatedKey")
            if not start:
                return
            page = self._query_index(partition, before, chunk, start)

    def _query_index(self, partition: str, before: str | None, chunk: int, start: Any) -> Any:
        condition = "#pk = :pk" + (" AND #sk < :before" if before is not None else "")
        names = {"#pk": "list_pk"}
        values = {":pk": text_attribute(partition)}
        if before is not None:
            names["#sk"] = "list_sk"
            values[":before"] = text_attribute(before)
        return self._client.query(
            TableName=self._table,
            IndexName=RUNS_INDEX.name,
            KeyConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            ScanIndexForward=False,
            Limit=chunk,
            **({"ExclusiveStartKey": start} if start else {}),
        )

    # --- items -----------------------------------------------------------------------------

    @staticmethod
    def _head_key(run_id: str) -> Item:
        return {"run_id": text_attribute(run_id), "sk": text_attribute(HEAD_SK)}

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
        # own with the result, and expires like any ledger record. The decision goes: the
        # step's record, put in the same transaction, holds it (the arguments kept once).
        return {
            "TableName": self._ledger_table,
            "Key": {"key": text_attribute(key)},
            "UpdateExpression": "SET #status = :status, #result = :result, "
            "#expires_at = if_not_exists(#expires_at, :expires_at) REMOVE #decision",
            "ExpressionAttributeNames": {
                "#status": "status",
                "#result": "result",
                "#expires_at": TTL_ATTRIBUTE,
                "#decision": "decision",
            },
            "ExpressionAttributeValues": {
                ":status": completion["status"],
                ":result": completion["result"],
                ":expires_at": number_attribute(epoch_seconds(utcnow() + self._retention)),
            },
        }

    # --- conditional updates of the head ---------------------------------------------------

    @staticmethod
    def _raise_if_head_moved(error: ClientError, run_id: str, expected_version: int) -> None:
        reasons = cancellation_reasons(error)
        if not reasons or reasons[0].get("Code") != _CONDITION_FAILED:
            return
        if "Item" not in reasons[0]:
            raise RunNotFound(run_id) from None
        raise StaleVersion(run_id, expected_version) from None


def _failed_condition(error: ClientError, index: int) -> bool:
    """Whether the transaction was cancelled because the condition of its `index`th item
    failed."""
    reasons = cancellation_reasons(error)
    return index < len(reasons) and reasons[index].get("Code") == _CONDITION_FAILED


def _checkpoint(
    item: Mapping[str, AttributeValueTypeDef], codec: PayloadCodec | None
) -> StoredCheckpoint:
    run_id, step = item["run_id"]["S"], int(item["step"]["N"])
    return StoredCheckpoint(
        run_id=run_id,
        version=int(item["version"]["N"]),
        step=step,
        status=RunStatus(item["status"]["S"]),
        worker_id=item["worker_id"]["S"],
        size=int(item["bytes"]["N"]),
        created_at=datetime.fromisoformat(item["created_at"]["S"]),
        event=stored.parse_event(item["event"]["S"], run_id=run_id, step=step, codec=codec),
    )

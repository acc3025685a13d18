"""Wakes owed on AWS: the settled waits whose parked execution a waker may not have answered.

A waker settles a wait in one write, then answers the execution parked on it (SendTaskSuccess
with the task token the run's wait item or approval item keeps). Those are two systems, so no
write makes both happen: a waker that dies between them (a killed process, a timed-out Lambda,
a throttled answer) leaves the run settled and its execution parked until its own timeout,
up to a week. So the item that keeps the token also says, from just before the settling write
until the answer, that a wake is owed:

- an event wait's or a children wait's item (`WAIT#<step>`, `ratchet.adapters.dynamodb.waits`)
  is marked by the waker before it settles the run (`AwsWaitTokens.owe`: one more write);
- an approval item (`APPROVAL#<id>`) is marked by the write that settles it (`AwsApprovals`).

The token's answer drops the mark with the token, in one update. A mark is two attributes that
are the keys of the sparse `wakes-owed` index (`WAKES_INDEX`), so the index holds only the
wakes still owed: `wake_pk` (`wakes#<shard>`, the run's shard of the runs index) and `wake_sk`
(when it was owed, in a fixed-width UTC form, so that text order is time order); `wake_how`
says what settled the wait (`event`, `children`, `woken`, `decided`).

The sweep (`ratchet.waiting.wakes`) reads the marks older than a grace, which no live waker
can still be working on, and answers what is still parked; a mark whose wait turns out not to
be settled (its waker died before the settling write) or whose execution has gone is cleared,
conditional on the mark read, so a mark made again meanwhile stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import WAKES_INDEX, error_code, translated_errors
from ratchet.adapters.dynamodb.store import LIST_SHARDS, list_shard
from ratchet.ports import WakeHow

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

WAKE_PK, WAKE_SK, WAKE_HOW = "wake_pk", "wake_sk", "wake_how"
CLEARED = f"REMOVE {WAKE_PK}, {WAKE_SK}, {WAKE_HOW}"
"""The part of an update expression that drops an item's mark."""


def wake_partition(shard: int) -> str:
    return f"wakes#{shard}"


def owed_at_text(at: datetime) -> str:
    """Fixed width, so that text order is time order (`isoformat` drops zero microseconds)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")


def mark_values(run_id: str, how: WakeHow, at: datetime) -> dict[str, AttributeValueTypeDef]:
    """The values of `SET wake_pk = :wake_pk, wake_sk = :wake_sk, wake_how = :wake_how`."""
    return {
        ":wake_pk": {"S": wake_partition(list_shard(run_id))},
        ":wake_sk": {"S": owed_at_text(at)},
        ":wake_how": {"S": how},
    }


MARKED = f"{WAKE_PK} = :wake_pk, {WAKE_SK} = :wake_sk, {WAKE_HOW} = :wake_how"
"""The part of a SET expression that marks an item (its values: `mark_values`)."""


@dataclass(frozen=True)
class OwedWake:
    """One mark, as the index holds it: the item's keys, what settled the wait, and when."""

    run_id: str
    sk: str
    """`WAIT#<step>` or `APPROVAL#<id>`."""
    how: str
    owed_at: str


class AwsOwedWakes:
    """The marks of the checkpoints table, read through its `wakes-owed` index."""

    def __init__(self, dynamodb: DynamoDBClient, table: str) -> None:
        self._client = dynamodb
        self._table = table

    @translated_errors
    def older_than(self, cutoff: datetime, *, limit: int) -> list[OwedWake]:
        """The marks made before `cutoff`, oldest first per shard, at most `limit` of them.
        The index is eventually consistent: a mark made or dropped a moment ago may be missing
        or still there; the sweep reads each item again before acting on it."""
        found: list[OwedWake] = []
        for shard in range(LIST_SHARDS):
            pages = self._client.get_paginator("query").paginate(
                TableName=self._table,
                IndexName=WAKES_INDEX.name,
                KeyConditionExpression="#pk = :pk AND #sk < :cutoff",
                ExpressionAttributeNames={"#pk": WAKE_PK, "#sk": WAKE_SK},
                ExpressionAttributeValues={
                    ":pk": {"S": wake_partition(shard)},
                    ":cutoff": {"S": owed_at_text(cutoff)},
                },
                PaginationConfig={"MaxItems": limit},
            )
            for page in pages:
                for item in page["Items"]:
                    found.append(
                        OwedWake(
                            run_id=item["run_id"]["S"],
                            sk=item["sk"]["S"],
                            how=item.get(WAKE_HOW, {}).get("S", ""),
                            owed_at=item[WAKE_SK]["S"],
                        )
                    )
        return sorted(found, key=lambda owed: owed.owed_at)[:limit]

    @translated_errors
    def clear(self, owed: OwedWake) -> bool:
        """Drop the mark `owed` read, if it is still that one (a waker may have marked the
        item again since: that mark is its own, and stays). True if it was dropped."""
        try:
            self._client.update_item(
                TableName=self._table,
                Key={"run_id": {"S": owed.run_id}, "sk": {"S": owed.sk}},
                UpdateExpression=CLEARED,
                ConditionExpression="#sk = :owed",
                ExpressionAttributeNames={"#sk": WAKE_SK},
                ExpressionAttributeValues={":owed": {"S": owed.owed_at}},
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            return False
        return True

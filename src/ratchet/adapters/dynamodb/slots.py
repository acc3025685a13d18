"""`ratchet.ports.Slots` in the checkpoints table: the partition `slots#<name>` holds one item
per slot, `slot#0000` to `slot#<limit - 1>`, each naming its holder and until when it holds it.
The engine names an agent's slots by the agent's name (`ratchet.ports.ConcurrencyBound`), so
the runs of one agent share them whatever reference each run stores.

A take reads the partition (one strongly consistent Query, a few small items) and writes one
free or lapsed slot with a condition that it is still free or lapsed: of two takers of the
same slot the second's condition fails and it tries the next, so no slot has two holders. A
release deletes the holder's slot on the condition that it is still theirs. Each item also
carries the table's TTL attribute a day past its time, so the slots of an agent that is no
longer run are collected.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import (
    TTL_ATTRIBUTE,
    error_code,
    number_attribute,
    text_attribute,
    translated_errors,
)
from ratchet.state import effective_priority

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

SLOTS_PARTITION_PREFIX = "slots#"
SLOT_SK_PREFIX = "slot#"
WAITER_SK_PREFIX = "wait#"
COLLECT_AFTER_SECONDS = 24 * 3600
WAITING_SECONDS = 60.0
"""How long a refused taker ranks as waiting after its last try: well past the queue's retry
time (1 to `DEFAULT_QUEUE_RETRY_SECONDS`, 10, seconds), so a waiter that still asks keeps its
place, and one that stopped (its run cancelled, its execution gone) holds nobody back for
longer than this."""


@dataclass(frozen=True)
class Waiter:
    priority: int
    since: float
    until: float


@dataclass
class Held:
    """A name's partition as one Query read it: its slots (holder, until) by sort key, and its
    waiters by holder."""

    slots: dict[str, tuple[str, float]] = field(default_factory=dict)
    waiters: dict[str, Waiter] = field(default_factory=dict)


class DynamoDbSlots:
    def __init__(
        self,
        dynamodb: DynamoDBClient,
        table: str,
        *,
        clock: Callable[[], float] = time.time,
        waiting_seconds: float = WAITING_SECONDS,
    ) -> None:
        self._client = dynamodb
        self._table = table
        self._clock = clock
        self._waiting_seconds = waiting_seconds

    @translated_errors
    def take(
        self, name: str, limit: int, holder: str, seconds: float, *, priority: int = 0
    ) -> bool:
        now = self._clock()
        held = self._held(name)
        own = next((sk for sk, (who, _) in held.slots.items() if who == holder), None)
        if own is not None:  # a retried step of the same run: its one slot, renewed
            return self._write(name, own, holder, now, until=now + seconds)
        mine = held.waiters.get(holder)
        since = mine.since if mine is not None and mine.until > now else now
        live = {sk for sk, (_, until) in held.slots.items() if until > now}
        if len(live) + self._ahead(held, holder, priority, since, now) >= limit:
            self._wait(name, holder, priority, since, now)
            return False
        # Each holder starts at its own slot, so takers at once rarely try the same one.
        first = zlib.crc32(holder.encode("utf-8")) % limit
        order = [_slot_sk((first + i) % limit) for i in range(limit)]
        candidates = [sk for sk in order if sk not in live]
        # The first write whose condition holds takes its slot (`any` stops there).
        if not any(self._write(name, sk, holder, now, until=now + seconds) for sk in candidates):
            self._wait(name, holder, priority, since, now)
            return False
        if mine is not None:
            self._client.delete_item(TableName=self._table, Key=_key(name, _waiter_sk(holder)))
        return True

    @staticmethod
    def _ahead(held: Held, holder: str, priority: int, since: float, now: float) -> int:
        """The live waiters other than `holder` that rank above it: a higher effective
        priority, or as high and waiting longer."""
        rank = (effective_priority(priority, now - since), -since)
        return sum(
            1
            for who, waiter in held.waiters.items()
            if who != holder
            and waiter.until > now
            and (effective_priority(waiter.priority, now - waiter.since), -waiter.since) > rank
        )

    def _wait(self, name: str, holder: str, priority: int, since: float, now: float) -> None:
        # The holder's own item, written by its own refused takes only: no condition needed.
        until = now + self._waiting_seconds
        self._client.put_item(
            TableName=self._table,
            Item={
                **_key(name, _waiter_sk(holder)),
                "holder": text_attribute(holder),
                "priority": number_attribute(priority),
                "since": {"N": f"{since:.3f}"},
                "slot_until": {"N": f"{until:.3f}"},
                TTL_ATTRIBUTE: number_attribute(int(until) + COLLECT_AFTER_SECONDS),
            },
        )

    @translated_errors
    def release(self, name: str, holder: str) -> None:
        for sk, (who, _) in self._held(name).slots.items():
            if who != holder:
                continue
            try:
                self._client.delete_item(
                    TableName=self._table,
                    Key=_key(name, sk),
                    ConditionExpression="holder = :me",
                    ExpressionAttributeValues={":me": text_attribute(holder)},
                )
            except ClientError as error:
                if error_code(error) != "ConditionalCheckFailedException":
                    raise
                # Lapsed and taken by another meanwhile: theirs now, left alone.

    def holders(self, name: str) -> dict[str, float]:
        """Who holds `name`'s slots that have not lapsed, and until when (for tests and the
        figures in bench/many_runs.py)."""
        now = self._clock()
        return {who: until for who, until in self._held(name).slots.values() if until > now}

    def waiting(self, name: str) -> dict[str, int]:
        """Who waits for `name`'s slots, by the mark of a refused take that has not lapsed,
        and at what priority (for tests)."""
        now = self._clock()
        return {
            who: waiter.priority
            for who, waiter in self._held(name).waiters.items()
            if waiter.until > now
        }

    def _held(self, name: str) -> Held:
        held = Held()
        pages = self._client.get_paginator("query").paginate(
            TableName=self._table,
            KeyConditionExpression="run_id = :pk",
            ExpressionAttributeValues={":pk": text_attribute(SLOTS_PARTITION_PREFIX + name)},
            ConsistentRead=True,
        )
        for item in (item for page in pages for item in page.get("Items", [])):
            sk, who, until = item["sk"]["S"], item["holder"]["S"], float(item["slot_until"]["N"])
            if sk.startswith(WAITER_SK_PREFIX):
                held.waiters[who] = Waiter(
                    int(item["priority"]["N"]), float(item["since"]["N"]), until
                )
            else:
                held.slots[sk] = (who, until)
        return held

    def _write(self, name: str, sk: str, holder: str, now: float, *, until: float) -> bool:
        item: dict[str, AttributeValueTypeDef] = {
            **_key(name, sk),
            "holder": text_attribute(holder),
            "slot_until": {"N": f"{until:.3f}"},
            TTL_ATTRIBUTE: number_attribute(int(until) + COLLECT_AFTER_SECONDS),
        }
        try:
            self._client.put_item(
                TableName=self._table,
                Item=item,
                ConditionExpression="attribute_not_exists(sk) OR slot_until <= :now "
                "OR holder = :me",
                ExpressionAttributeValues={
                    ":now": {"N": f"{now:.3f}"},
                    ":me": text_attribute(holder),
                },
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            return False
        return True


def _slot_sk(index: int) -> str:
    return f"{SLOT_SK_PREFIX}{index:04d}"


def _waiter_sk(holder: str) -> str:
    return f"{WAITER_SK_PREFIX}{holder}"


def _key(name: str, sk: str) -> dict[str, AttributeValueTypeDef]:
    return {"run_id": text_attribute(SLOTS_PARTITION_PREFIX + name), "sk": text_attribute(sk)}

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
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import (
    TTL_ATTRIBUTE,
    error_code,
    number_attribute,
    text_attribute,
    translated_errors,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

SLOTS_PARTITION_PREFIX = "slots#"
SLOT_SK_PREFIX = "slot#"
COLLECT_AFTER_SECONDS = 24 * 3600


class DynamoDbSlots:
    def __init__(
        self, dynamodb: DynamoDBClient, table: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._client = dynamodb
        self._table = table
        self._clock = clock

    @translated_errors
    def take(self, name: str, limit: int, holder: str, seconds: float) -> bool:
        now = self._clock()
        held = self._held(name)
        own = next((sk for sk, (who, _) in held.items() if who == holder), None)
        live = {sk for sk, (_, until) in held.items() if until > now}
        if own is None and len(live) >= limit:
            return False
        # Each holder starts at its own slot, so takers at once rarely try the same one.
        first = zlib.crc32(holder.encode("utf-8")) % limit
        order = [_slot_sk((first + i) % limit) for i in range(limit)]
        candidates = [own] if own is not None else [sk for sk in order if sk not in live]
        # The first write whose condition holds takes its slot (`any` stops there).
        return any(self._write(name, sk, holder, now, until=now + seconds) for sk in candidates)

    @translated_errors
    def release(self, name: str, holder: str) -> None:
        for sk, (who, _) in self._held(name).items():
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
        return {who: until for who, until in self._held(name).values() if until > now}

    def _held(self, name: str) -> dict[str, tuple[str, float]]:
        items = self._client.query(
            TableName=self._table,
            KeyConditionExpression="run_id = :pk",
            ExpressionAttributeValues={":pk": text_attribute(SLOTS_PARTITION_PREFIX + name)},
            ConsistentRead=True,
        )["Items"]
        return {
            item["sk"]["S"]: (item["holder"]["S"], float(item["slot_until"]["N"])) for item in items
        }

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


def _key(name: str, sk: str) -> dict[str, AttributeValueTypeDef]:
    return {"run_id": text_attribute(SLOTS_PARTITION_PREFIX + name), "sk": text_attribute(sk)}

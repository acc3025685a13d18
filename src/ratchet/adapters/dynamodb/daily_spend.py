"""`ratchet.ports.DailySpend` in the checkpoints table: the partition `spend#<agent>` holds an
item per day, moved by `ADD` on the condition that the new total stays within the limit, so
every step invocation of a deployment shares one counter. Each item carries the table's TTL
attribute a week past its day.

A condition cannot add two attributes, so the item keeps the spend net of the day's raises
(`micros`) beside the raises (`raised`): a raise moves both in one update, and a reservation's
condition compares `micros` with the limit alone, in the one write it always was."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
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

SPEND_PARTITION_PREFIX = "spend#"
KEPT_DAYS = 7


class DynamoDbDailySpend:
    def __init__(self, dynamodb: DynamoDBClient, table: str) -> None:
        self._client = dynamodb
        self._table = table

    @translated_errors
    def reserve(self, agent: str, day: str, amount: int, limit: int) -> bool:
        # A day with no item has spent nothing and been raised by nothing: the amount fits
        # it only within the limit alone. One with an item is checked by its net spend.
        fresh = "attribute_not_exists(#micros) OR " if amount <= limit else ""
        try:
            # The condition is read and the count moved in one write: of two reservers at
            # once, the second is checked against the total the first left.
            self._client.update_item(
                TableName=self._table,
                Key=self._key(agent, day),
                UpdateExpression="ADD #micros :amount SET #ttl = :ttl",
                ConditionExpression=fresh + "#micros <= :room",
                ExpressionAttributeNames={"#micros": "micros", "#ttl": TTL_ATTRIBUTE},
                ExpressionAttributeValues={
                    ":amount": number_attribute(amount),
                    ":room": number_attribute(limit - amount),
                    ":ttl": number_attribute(_expires(day)),
                },
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            return False
        return True

    @translated_errors
    def settle(self, agent: str, day: str, reserved: int, used: int) -> None:
        if used == reserved:
            return
        self._client.update_item(
            TableName=self._table,
            Key=self._key(agent, day),
            UpdateExpression="ADD #micros :delta",
            ConditionExpression="attribute_exists(#micros)",
            ExpressionAttributeNames={"#micros": "micros"},
            ExpressionAttributeValues={":delta": number_attribute(used - reserved)},
        )

    @translated_errors
    def raise_budget(self, agent: str, day: str, amount: int) -> int:
        # One write moves both: a reservation at once sees the raise whole or not at all.
        found = self._client.update_item(
            TableName=self._table,
            Key=self._key(agent, day),
            UpdateExpression="ADD #micros :less, #raised :amount SET #ttl = :ttl",
            ExpressionAttributeNames={
                "#micros": "micros",
                "#raised": "raised",
                "#ttl": TTL_ATTRIBUTE,
            },
            ExpressionAttributeValues={
                ":less": number_attribute(-amount),
                ":amount": number_attribute(amount),
                ":ttl": number_attribute(_expires(day)),
            },
            ReturnValues="UPDATED_NEW",
        )
        return int(found["Attributes"]["raised"]["N"])

    @translated_errors
    def spent(self, agent: str, day: str) -> int:
        micros, raised = self._read(agent, day)
        return micros + raised

    @translated_errors
    def raised(self, agent: str, day: str) -> int:
        return self._read(agent, day)[1]

    def _read(self, agent: str, day: str) -> tuple[int, int]:
        found = self._client.get_item(
            TableName=self._table, Key=self._key(agent, day), ConsistentRead=True
        ).get("Item")
        if not found:
            return 0, 0
        micros = int(found["micros"]["N"]) if "micros" in found else 0
        raised = int(found["raised"]["N"]) if "raised" in found else 0
        return micros, raised

    def _key(self, agent: str, day: str) -> dict[str, AttributeValueTypeDef]:
        return {
            "run_id": text_attribute(SPEND_PARTITION_PREFIX + agent),
            "sk": text_attribute(f"day#{day}"),
        }


def _expires(day: str) -> int:
    ends = datetime.combine(date.fromisoformat(day), time(), tzinfo=UTC) + timedelta(days=1)
    return int((ends + timedelta(days=KEPT_DAYS)).timestamp())

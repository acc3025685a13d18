"""`ratchet.ports.RateLimit` in the checkpoints table: the partition `rate#<name>` holds an item
per minute, counted up by a conditional update (`ADD`, on the condition that the count is
under the limit), so every step invocation of a deployment shares the count. Each item
carries the table's TTL attribute a day past its minute."""

from __future__ import annotations

import time
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

RATE_PARTITION_PREFIX = "rate#"
COLLECT_AFTER_SECONDS = 24 * 3600


class DynamoDbRateLimit:
    def __init__(
        self, dynamodb: DynamoDBClient, table: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._client = dynamodb
        self._table = table
        self._clock = clock

    @translated_errors
    def take(self, name: str, per_minute: int) -> float:
        now = self._clock()
        minute = int(now // 60)
        try:
            self._client.update_item(
                TableName=self._table,
                Key={
                    "run_id": text_attribute(RATE_PARTITION_PREFIX + name),
                    "sk": text_attribute(f"minute#{minute:012d}"),
                },
                UpdateExpression="ADD #count :one SET #ttl = :ttl",
                ConditionExpression="attribute_not_exists(#count) OR #count < :limit",
                ExpressionAttributeNames={"#count": "count", "#ttl": TTL_ATTRIBUTE},
                ExpressionAttributeValues={
                    ":one": number_attribute(1),
                    ":limit": number_attribute(per_minute),
                    ":ttl": number_attribute((minute + 1) * 60 + COLLECT_AFTER_SECONDS),
                },
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            return (minute + 1) * 60 - now
        return 0.0

"""A run's own data (`RunData`) in the stack's app table: the AWS twin of
`ratchet.adapters.sqlite.data`.

One partition per run, `pk = "data#<run_id>"`, one item per key (`sk` = the key, `value` the
text). Reads are strongly consistent, so a step retried in a new container sees what the last
attempt wrote. What DynamoDB turns away is `StoreBusy` or `StoreUnavailable`
(`ratchet.adapters.dynamodb.items`); a bad key or value is refused before any request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import error_code, text_attribute, translated_errors
from ratchet.adapters.run_data import checked_key, checked_prefix, checked_value
from ratchet.sealing import PayloadCodec
from ratchet.stored import opened_value, sealed_value

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import QueryInputTypeDef

DATA_PREFIX = "data#"


def data_pk(run_id: str) -> str:
    return f"{DATA_PREFIX}{run_id}"


class DynamoDbRunData:
    """`RunData` for one run (see `ratchet.ports.RunData` for the contract).

    `page_size` caps the items one Query returns (DynamoDB's own cap is 1 MB); `items` reads
    every page either way. Tests set it to see the pagination with a few items.
    """

    def __init__(
        self,
        client: DynamoDBClient,
        table: str,
        run_id: str,
        *,
        page_size: int | None = None,
        codec: PayloadCodec | None = None,
    ) -> None:
        self._client = client
        self._table = table
        self._run_id = run_id
        self._pk = data_pk(run_id)
        self._page_size = page_size
        self._codec = codec  # seals each value, bound to its run and key

    @translated_errors
    def get(self, key: str) -> str | None:
        checked_key(key)
        found = self._client.get_item(
            TableName=self._table,
            Key={"pk": text_attribute(self._pk), "sk": text_attribute(key)},
            ConsistentRead=True,
        ).get("Item")
        return None if found is None else self._opened(key, found["value"]["S"])

    @translated_errors
    def put(self, key: str, value: str) -> None:
        checked_key(key)
        checked_value(value)
        self._client.put_item(TableName=self._table, Item=self._item(key, value))

    @translated_errors
    def put_once(self, key: str, value: str) -> bool:
        checked_key(key)
        checked_value(value)
        # Put-if-absent: of two writers of one key (a step retried in another container while
        # the first attempt still runs), DynamoDB applies one put and fails the other's
        # condition, which is the answer "it was there already", with nothing changed.
        try:
            self._client.put_item(
                TableName=self._table,
                Item=self._item(key, value),
                ConditionExpression="attribute_not_exists(sk)",
            )
        except ClientError as error:
            if error_code(error) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    @translated_errors
    def delete(self, key: str) -> None:
        checked_key(key)
        self._client.delete_item(
            TableName=self._table, Key={"pk": text_attribute(self._pk), "sk": text_attribute(key)}
        )

    @translated_errors
    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        checked_prefix(prefix)
        # Sort keys are ordered by their UTF-8 bytes, as Python orders str: the Query returns
        # the keys in the order the contract asks for, page after page.
        query: QueryInputTypeDef = {
            "TableName": self._table,
            "ConsistentRead": True,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": text_attribute(self._pk)},
        }
        if prefix:
            query["KeyConditionExpression"] = "pk = :pk AND begins_with(sk, :prefix)"
            query["ExpressionAttributeValues"] = {
                ":pk": text_attribute(self._pk),
                ":prefix": text_attribute(prefix),
            }
        if self._page_size is not None:
            query["Limit"] = self._page_size
        found: list[tuple[str, str]] = []
        while True:
            page = self._client.query(**query)
            found.extend(
                (item["sk"]["S"], self._opened(item["sk"]["S"], item["value"]["S"]))
                for item in page.get("Items", [])
            )
            last: Any = page.get("LastEvaluatedKey")
            if not last:
                return found
            query["ExclusiveStartKey"] = last

    def _item(self, key: str, value: str) -> dict[str, Any]:
        return {
            "pk": text_attribute(self._pk),
            "sk": text_attribute(key),
            "value": text_attribute(
                sealed_value(value, self._codec, part=f"data:{key}", run_id=self._run_id)
            ),
        }

    def _opened(self, key: str, value: str) -> str:
        return opened_value(value, self._codec, part=f"data:{key}", run_id=self._run_id)

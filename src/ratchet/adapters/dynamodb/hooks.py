"""The webhooks on AWS: one item per hook in the checkpoints table (`ratchet.ports.HookBook`).

Each hook is an item of its own partition, `run_id = hook#<hook id>`, `sk = hook`, with the
run it delivers to in `for_run` and the `Hook` as JSON in `record`. Its own partition because
a delivery knows only the hook id: one consistent GetItem by key finds it, with no index from
id to run and no scan. A run id cannot hold `#`, so no run's partition is ever a hook's, and
nothing that reads a run's partition (its checkpoints, approvals, mailbox) meets one. It lets
the hook function's policy tell the two apart, too: it reads hook items by their key prefix.

The item has no TTL: a run may wait for its event up to a year, and a hook must answer for as
long as its run may take events. It holds no secret (that is derived from the id and the key).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import error_code, text_attribute, translated_errors
from ratchet.ports import Hook

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

HOOK_PARTITION_PREFIX = "hook#"
HOOK_SK = "hook"


def hook_key(hook_id: str) -> dict[str, AttributeValueTypeDef]:
    return {
        "run_id": text_attribute(f"{HOOK_PARTITION_PREFIX}{hook_id}"),
        "sk": text_attribute(HOOK_SK),
    }


class DynamoDbHookBook:
    """A DynamoDB failure its methods do not answer themselves is raised under Ratchet's name
    (`StoreBusy`, `StoreUnavailable`), as the store's are."""

    def __init__(self, dynamodb: DynamoDBClient, table: str) -> None:
        self._client = dynamodb
        self._table = table

    @translated_errors
    def add(self, hook: Hook) -> tuple[Hook, bool]:
        item: dict[str, AttributeValueTypeDef] = {
            **hook_key(hook.hook_id),
            "for_run": text_attribute(hook.run_id),
            "name": text_attribute(hook.name),
            "record": text_attribute(hook.model_dump_json()),
        }
        # Put-if-absent: of two callers making the same hook (its id is derived from the run
        # and the name), the first write stands and the second reads it back.
        try:
            self._client.put_item(
                TableName=self._table, Item=item, ConditionExpression="attribute_not_exists(sk)"
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            stored = self.get(hook.hook_id)
            if stored is None:  # only if it was deleted between the two calls
                raise
            return stored, False
        return hook, True

    @translated_errors
    def get(self, hook_id: str) -> Hook | None:
        found = self._client.get_item(
            TableName=self._table,
            Key=hook_key(hook_id),
            ConsistentRead=True,
            ProjectionExpression="#r",
            ExpressionAttributeNames={"#r": "record"},
        ).get("Item")
        return Hook.model_validate_json(found["record"]["S"]) if found else None

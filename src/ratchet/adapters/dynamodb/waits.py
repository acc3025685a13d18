"""The task tokens of executions parked on an event wait, in DynamoDB beside the run's checkpoints
(`ratchet.adapters.stepfunctions.StepFunctionsNudge` answers the execution with them).

The `AwaitEvent` state hands its task token to the open_wait function, which keeps it here, as
the notify function keeps an approval's: the token is a bearer credential for the execution, so
it lives server-side only, never in a log, a URL or an output. When the event desk settles the
wait, the nudge reads the token, answers the execution, and drops it.

One item per waiting step, in the run's partition of the checkpoints table: `run_id`, `sk =
WAIT#<step>`, `step`, `task_token` until answered, and `expires_at` (the TTL attribute). A run
parked again at the same step (its park lasted a chunk and ran out before the wait was due)
replaces the token: the old one's task is over, so only the newest may be answered.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import TTL_ATTRIBUTE, error_code, translated_errors
from ratchet.state import MAX_WAIT_SECONDS

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

WAIT_PREFIX = "WAIT#"
"""The sort key prefix of a wait item: after `HEAD`, outside the checkpoint store's range of its
run's partition (`CP#...` to `HEAD`), which it never reads."""


def wait_sk(step: int) -> str:
    return f"{WAIT_PREFIX}{step:010d}"


class AwsWaitTokens:
    """The keeper of each parked event wait's task token (`WaitTokens`). A DynamoDB failure its
    methods do not answer themselves is raised under Ratchet's name (`StoreBusy`,
    `StoreUnavailable`), as the store's and the approval book's are."""

    def __init__(self, dynamodb: DynamoDBClient, table: str, *, retention_days: int = 30) -> None:
        self._client = dynamodb
        self._table = table
        # No park outlives its execution's year; the item outlives it by the retention.
        self._kept_for = timedelta(seconds=MAX_WAIT_SECONDS, days=retention_days)

    @translated_errors
    def keep(self, run_id: str, step: int, task_token: str, *, at: datetime) -> None:
        self._client.put_item(
            TableName=self._table,
            Item={
                **self._key(run_id, step),
                "step": {"N": str(step)},
                "task_token": {"S": task_token},
                TTL_ATTRIBUTE: {"N": str(int((at + self._kept_for).timestamp()))},
            },
        )

    @translated_errors
    def task_token(self, run_id: str, step: int) -> str | None:
        """The token of the execution parked on the run's wait at `step`, or None (none
        parked there, or it was answered)."""
        found = self._client.get_item(
            TableName=self._table,
            Key=self._key(run_id, step),
            ConsistentRead=True,
            ProjectionExpression="task_token",
        ).get("Item")
        if not found or "task_token" not in found:
            return None
        return found["task_token"]["S"]

    @translated_errors
    def forget(self, run_id: str, step: int, task_token: str) -> None:
        """Drop `task_token`, answered or over; a newer park's token, kept since, stays."""
        try:
            self._client.update_item(
                TableName=self._table,
                Key=self._key(run_id, step),
                UpdateExpression="REMOVE task_token",
                ConditionExpression="task_token = :token",
                ExpressionAttributeValues={":token": {"S": task_token}},
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise

    @translated_errors
    def drop(self, run_id: str, step: int) -> None:
        """Drop whatever token is kept for the run's wait at `step`: its park is over (timed
        out, or the run was cancelled), and no newer park of that step holds the item yet."""
        try:
            # Conditional: an update of a missing item would create it.
            self._client.update_item(
                TableName=self._table,
                Key=self._key(run_id, step),
                UpdateExpression="REMOVE task_token",
                ConditionExpression="attribute_exists(sk)",
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise

    @staticmethod
    def _key(run_id: str, step: int) -> dict[str, AttributeValueTypeDef]:
        return {"run_id": {"S": run_id}, "sk": {"S": wait_sk(step)}}

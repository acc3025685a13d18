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

A waker marks the item before it settles the wait (`owe`: the keys of the `wakes-owed` index,
`ratchet.adapters.dynamodb.wakes`), and the answer drops the mark with the token, so a waker
that dies in between leaves the mark for the sweep. Every write here updates only the
attributes it owns: keeping a token must not drop a mark made before the token was kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import TTL_ATTRIBUTE, error_code, translated_errors
from ratchet.adapters.dynamodb.wakes import CLEARED, MARKED, WAKE_SK, mark_values
from ratchet.ports import WakeHow
from ratchet.state import MAX_WAIT_SECONDS

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

WAIT_PREFIX = "WAIT#"
"""The sort key prefix of a wait item: after `HEAD`, outside the checkpoint store's range of its
run's partition (`CP#...` to `HEAD`), which it never reads."""


def wait_sk(step: int) -> str:
    return f"{WAIT_PREFIX}{step:010d}"


def wait_step(sk: str) -> int | None:
    """The step of a wait item's sort key; None for another item's."""
    if not sk.startswith(WAIT_PREFIX):
        return None
    return int(sk.removeprefix(WAIT_PREFIX))


@dataclass(frozen=True)
class ParkedWait:
    token: str | None
    """The parked execution's task token, until it is answered."""
    owed: bool
    """A waker marked the wait settled (or about to be) and has not answered it yet."""


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
        # An update, not a put: a waker may have marked the item already (it settles the
        # wait now, and will look for this token), and that mark must stay until the answer.
        self._client.update_item(
            TableName=self._table,
            Key=self._key(run_id, step),
            UpdateExpression="SET #step = :step, task_token = :token, #ttl = :ttl",
            ExpressionAttributeNames={"#step": "step", "#ttl": TTL_ATTRIBUTE},
            ExpressionAttributeValues={
                ":step": {"N": str(step)},
                ":token": {"S": task_token},
                ":ttl": self._expiry(at),
            },
        )

    @translated_errors
    def owe(self, run_id: str, step: int, how: WakeHow, *, at: datetime) -> None:
        """Mark the run's wait at `step` as about to be settled by a waker that will then
        answer its parked execution: until the answer drops it, the sweep can see the wake is
        owed. Made whether or not a token is kept yet (the execution may park after this)."""
        self._client.update_item(
            TableName=self._table,
            Key=self._key(run_id, step),
            UpdateExpression=f"SET #step = :step, #ttl = if_not_exists(#ttl, :ttl), {MARKED}",
            ExpressionAttributeNames={"#step": "step", "#ttl": TTL_ATTRIBUTE},
            ExpressionAttributeValues={
                ":step": {"N": str(step)},
                ":ttl": self._expiry(at),
                **mark_values(run_id, how, at),
            },
        )

    def task_token(self, run_id: str, step: int) -> str | None:
        """The token of the execution parked on the run's wait at `step`, or None (none
        parked there, or it was answered)."""
        return self.look(run_id, step).token

    @translated_errors
    def look(self, run_id: str, step: int) -> ParkedWait:
        """The token kept for the run's wait at `step`, and whether a wake is owed there."""
        found = self._client.get_item(
            TableName=self._table,
            Key=self._key(run_id, step),
            ConsistentRead=True,
            ProjectionExpression="task_token, #owed",
            ExpressionAttributeNames={"#owed": WAKE_SK},
        ).get("Item", {})
        token = found.get("task_token", {}).get("S")
        return ParkedWait(token=token, owed=WAKE_SK in found)

    @translated_errors
    def forget(self, run_id: str, step: int, task_token: str) -> None:
        """Drop `task_token`, answered or over, and the wake owed with it; a newer park's
        token, kept since, stays."""
        try:
            self._client.update_item(
                TableName=self._table,
                Key=self._key(run_id, step),
                UpdateExpression=f"{CLEARED}, task_token",
                ConditionExpression="task_token = :token",
                ExpressionAttributeValues={":token": {"S": task_token}},
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise

    @translated_errors
    def clear_owed(self, run_id: str, step: int) -> None:
        """Drop the wake owed on the run's wait at `step`: the waker found no token to answer
        (no execution parked there yet, and the one that parks will find the wait settled
        when it looks, or none parks there at all)."""
        try:
            self._client.update_item(
                TableName=self._table,
                Key=self._key(run_id, step),
                UpdateExpression=CLEARED,
                ConditionExpression="attribute_exists(sk)",
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise

    @translated_errors
    def drop(self, run_id: str, step: int) -> None:
        """Drop whatever token is kept for the run's wait at `step`, and any wake owed: its
        park is over (timed out, or the run was cancelled), and no newer park of that step
        holds the item yet."""
        try:
            # Conditional: an update of a missing item would create it.
            self._client.update_item(
                TableName=self._table,
                Key=self._key(run_id, step),
                UpdateExpression=f"{CLEARED}, task_token",
                ConditionExpression="attribute_exists(sk)",
            )
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise

    def _expiry(self, at: datetime) -> AttributeValueTypeDef:
        return {"N": str(int((at + self._kept_for).timestamp()))}

    @staticmethod
    def _key(run_id: str, step: int) -> dict[str, AttributeValueTypeDef]:
        return {"run_id": {"S": run_id}, "sk": {"S": wait_sk(step)}}

"""Approvals on AWS: where a parked execution's task token is kept, and what a decision sends.

The `AwaitApproval` state hands its task token to the notify Lambda, which keeps it here under
a random approval id; the link a person gets carries that id, never the token (a token in a
URL ends up in mail scanners, proxies and browser history). Whoever decides later reads the
token back and answers the execution with one of the two messages below; the state machine's
paths name their fields, so they are the contract.

Items live in the checkpoints table, in the run's partition: `run_id`, `sk =
APPROVAL#<approval id>`, with `task_token`, `step`, `created_at`, `expires_at` (the table's TTL
attribute, epoch seconds) and `status`.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from ratchet.adapters.dynamodb import APPROVAL_PREFIX, TTL_ATTRIBUTE
from ratchet.state import utcnow

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

REJECTED_ERROR = "Rejected"
"""The `error` of SendTaskFailure for a rejection; the state machine catches this name."""


class ApprovalAnswer(BaseModel):
    """The `output` of SendTaskSuccess: the person approved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: str = Field(min_length=1, max_length=200)
    comment: str = Field(default="", max_length=10_000)


class Rejection(BaseModel):
    """The `cause` of SendTaskFailure (error `Rejected`), as JSON: the person said no."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: str = Field(min_length=1, max_length=200)
    reason: str = Field(default="", max_length=10_000)


class StoredApproval(BaseModel):
    model_config = ConfigDict(frozen=True)

    approval_id: str
    run_id: str
    step: int
    task_token: str = Field(repr=False)
    created_at: datetime
    expires_at: datetime
    """When the approval task times out; TTL deletes the item some time after."""
    status: str = "pending"


def approval_sk(approval_id: str) -> str:
    return f"{APPROVAL_PREFIX}{approval_id}"


class ApprovalTokens:
    """The task tokens of parked executions, by run and approval id."""

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    def keep(self, *, run_id: str, step: int, task_token: str, timeout_seconds: int) -> str:
        """Store a token under a new approval id and return the id."""
        created = utcnow()
        approval = StoredApproval(
            approval_id=secrets.token_urlsafe(16),
            run_id=run_id,
            step=step,
            task_token=task_token,
            created_at=created,
            expires_at=created + timedelta(seconds=timeout_seconds),
        )
        # 128 random bits do not collide; the condition makes "a stored token is never
        # overwritten" a property of the write rather than of the odds.
        self._client.put_item(
            TableName=self._table,
            Item=_item(approval),
            ConditionExpression="attribute_not_exists(sk)",
        )
        return approval.approval_id

    def get(self, run_id: str, approval_id: str) -> StoredApproval | None:
        found = self._client.get_item(
            TableName=self._table,
            Key={"run_id": {"S": run_id}, "sk": {"S": approval_sk(approval_id)}},
            ConsistentRead=True,
        ).get("Item")
        return _approval(found) if found else None

    def of_run(self, run_id: str) -> list[StoredApproval]:
        """Every approval of the run still stored (expired ones linger until TTL removes
        them: check `expires_at`)."""
        items = self._client.query(
            TableName=self._table,
            KeyConditionExpression="run_id = :run_id AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={
                ":run_id": {"S": run_id},
                ":prefix": {"S": APPROVAL_PREFIX},
            },
            ConsistentRead=True,
        )["Items"]
        return sorted((_approval(i) for i in items), key=lambda a: a.created_at)


def _item(approval: StoredApproval) -> dict[str, AttributeValueTypeDef]:
    return {
        "run_id": {"S": approval.run_id},
        "sk": {"S": approval_sk(approval.approval_id)},
        "approval_id": {"S": approval.approval_id},
        "task_token": {"S": approval.task_token},
        "step": {"N": str(approval.step)},
        "created_at": {"S": approval.created_at.isoformat()},
        TTL_ATTRIBUTE: {"N": str(int(approval.expires_at.timestamp()))},
        "status": {"S": approval.status},
    }


def _approval(item: dict[str, AttributeValueTypeDef]) -> StoredApproval:
    return StoredApproval(
        approval_id=item["approval_id"]["S"],
        run_id=item["run_id"]["S"],
        step=int(item["step"]["N"]),
        task_token=item["task_token"]["S"],
        created_at=datetime.fromisoformat(item["created_at"]["S"]),
        expires_at=datetime.fromtimestamp(int(item[TTL_ATTRIBUTE]["N"]), UTC),
        status=item["status"]["S"],
    )

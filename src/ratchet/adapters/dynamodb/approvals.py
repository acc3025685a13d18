"""The approval book on AWS: the approval items in DynamoDB, beside the parked execution's task
token (`ratchet.adapters.stepfunctions` answers the execution with it).

The `AwaitApproval` state hands its task token to the notify function, which keeps it here
under a random approval id; links and Slack buttons carry that id, never the token (a token in
a URL ends up in mail scanners, proxies and browser history). Whoever decides settles the item
with a conditional write, then answers the execution with the token, then deletes the token.

Items live in the checkpoints table, in the run's partition: `run_id`, `sk =
APPROVAL#<approval id>`, with `status` (what conditions test), `record` (the `Approval` as
JSON), `task_token` until the decision, and `expires_at` (the table's TTL attribute: the
request's deadline plus the checkpoint retention, so a decided request stays inspectable).

The write that settles an item also marks it as owing its execution a wake (the keys of the
`wakes-owed` index, `ratchet.adapters.dynamodb.wakes`), and dropping the token drops the mark:
a decider that dies between its decision and the answer leaves the mark for the sweep, which
answers the execution with the decision the item records.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import TTL_ATTRIBUTE, error_code, translated_errors
from ratchet.adapters.dynamodb.wakes import CLEARED, MARKED, mark_values
from ratchet.errors import ApprovalClosed, ApprovalDecided, ApprovalExpired
from ratchet.sealing import PayloadCodec
from ratchet.stored import open_record_text, sealed_record_text
from ratchet.waits import Approval, ApprovalStatus, Verdict

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

APPROVAL_PREFIX = "APPROVAL#"
"""The sort key prefix of an approval item: outside the checkpoint store's range of its run's
partition (`CP#...` to `HEAD`), which it never reads."""


def approval_sk(approval_id: str) -> str:
    return f"{APPROVAL_PREFIX}{approval_id}"


class AwsApprovals:
    """The approval book of the AWS runtime, and the keeper of each parked task's token
    (`TaskTokens`, which `StepFunctionsResumer` answers the execution with). A DynamoDB failure
    its methods do not answer themselves is raised under Ratchet's name (`StoreBusy`,
    `StoreUnavailable`), as the store's and the ledger's are."""

    def __init__(
        self,
        dynamodb: DynamoDBClient,
        table: str,
        *,
        retention_days: int = 30,
        codec: PayloadCodec | None = None,
    ) -> None:
        self._client = dynamodb
        self._table = table
        self._retention = timedelta(days=retention_days)
        # Seals each request's record: its question, the answer and comment a person gives.
        self._codec = codec

    @translated_errors
    def open(self, approval: Approval, *, task_token: str | None = None) -> Approval:
        item = self._item(approval)
        if task_token is not None:
            item["task_token"] = {"S": task_token}
        # 128 random bits do not collide; the condition makes "a stored token is never
        # overwritten" a property of the write rather than of the odds.
        self._client.put_item(
            TableName=self._table, Item=item, ConditionExpression="attribute_not_exists(sk)"
        )
        return approval

    @translated_errors
    def get(self, run_id: str, approval_id: str) -> Approval | None:
        found = self._client.get_item(
            TableName=self._table,
            Key=self._key(run_id, approval_id),
            ConsistentRead=True,
            ProjectionExpression="#r",
            ExpressionAttributeNames={"#r": "record"},
        ).get("Item")
        return self._approval(found["record"]["S"]) if found else None

    @translated_errors
    def of_run(self, run_id: str) -> list[Approval]:
        """Every approval of the run still stored, oldest first."""
        pages = self._client.get_paginator("query").paginate(
            TableName=self._table,
            KeyConditionExpression="run_id = :run_id AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={
                ":run_id": {"S": run_id},
                ":prefix": {"S": APPROVAL_PREFIX},
            },
            ProjectionExpression="#r",
            ExpressionAttributeNames={"#r": "record"},
            ConsistentRead=True,
        )
        found = [self._approval(i["record"]["S"]) for p in pages for i in p["Items"]]
        return sorted(found, key=lambda a: a.created_at)

    @translated_errors
    def has_token(self, run_id: str, approval_id: str) -> bool:
        found = self._client.get_item(
            TableName=self._table,
            Key=self._key(run_id, approval_id),
            ConsistentRead=True,
            ProjectionExpression="task_token",
        ).get("Item")
        return bool(found and "task_token" in found)

    @translated_errors
    def settle(
        self, approval: Approval, verdict: Verdict, *, channel: str, at: datetime
    ) -> Approval:
        settled = approval.settled(verdict, channel=channel, at=at)
        if approval.is_expired(at):
            raise ApprovalExpired("this request has expired")
        # Pending -> decided, once: of two clicks, two channels or a replayed POST, the
        # first write wins and every later one fails this condition and changes nothing.
        try:
            self._set(settled, expect=ApprovalStatus.PENDING, owe_wake_at=at)
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            current = self.get(approval.run_id, approval.approval_id)
            status = current.status.value if current else "gone"
            by = f" by {current.decided_by}" if current and current.decided_by else ""
            raise ApprovalDecided(f"already {status}{by}") from None
        return settled

    @translated_errors
    def reopen(self, approval: Approval) -> None:
        reopened = approval.reopened()
        try:
            self._set(reopened, expect=approval.status)
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise

    @translated_errors
    def close(self, run_id: str, step: int, status: ApprovalStatus, *, at: datetime) -> None:
        """Mark the step's pending approvals `status` and drop every token of the step: the
        execution has its answer (or gave up waiting), so no token of it may be used again."""
        for approval in self.of_run(run_id):
            if approval.step != step:
                continue
            if approval.status is ApprovalStatus.PENDING:
                closed = approval.model_copy(update={"status": status, "decided_at": at})
                try:
                    self._set(closed, expect=ApprovalStatus.PENDING, drop_token=True)
                    continue
                except ClientError as error:
                    if error_code(error) != "ConditionalCheckFailedException":
                        raise
            self.forget_token(run_id, approval.approval_id)

    # --- the task tokens -------------------------------------------------------------------

    @translated_errors
    def task_token(self, approval: Approval) -> str:
        """The token of the approval's parked task; `ApprovalClosed` if it was dropped."""
        found = self._client.get_item(
            TableName=self._table,
            Key=self._key(approval.run_id, approval.approval_id),
            ConsistentRead=True,
            ProjectionExpression="task_token",
        ).get("Item")
        if not found or "task_token" not in found:
            raise ApprovalClosed("the run is no longer waiting for this request")
        return found["task_token"]["S"]

    @translated_errors
    def forget_token(self, run_id: str, approval_id: str) -> None:
        """Drop the token (answered, or its task over) and the wake owed with it."""
        self._client.update_item(
            TableName=self._table,
            Key=self._key(run_id, approval_id),
            UpdateExpression=f"{CLEARED}, task_token",
            ConditionExpression="attribute_exists(sk)",
        )

    # --- items -----------------------------------------------------------------------------

    def _set(
        self,
        approval: Approval,
        *,
        expect: ApprovalStatus,
        drop_token: bool = False,
        owe_wake_at: datetime | None = None,
    ) -> None:
        """Move the item from `expect` to `approval`'s status. A decision (`owe_wake_at`)
        marks the wake it owes its parked execution; any other move drops a mark, with the
        token when `drop_token`: a reopened request owes nothing, a closed one has no task."""
        values: dict[str, AttributeValueTypeDef] = {
            ":new": {"S": approval.status.value},
            ":record": {"S": self._record(approval)},
            ":expected": {"S": expect.value},
        }
        if owe_wake_at is not None:
            update = f"SET #s = :new, #r = :record, {MARKED}"
            values.update(mark_values(approval.run_id, "decided", owe_wake_at))
        else:
            update = f"SET #s = :new, #r = :record {CLEARED}"
            if drop_token:
                update += ", task_token"
        self._client.update_item(
            TableName=self._table,
            Key=self._key(approval.run_id, approval.approval_id),
            UpdateExpression=update,
            ConditionExpression="#s = :expected",
            ExpressionAttributeNames={"#s": "status", "#r": "record"},
            ExpressionAttributeValues=values,
        )

    def _record(self, approval: Approval) -> str:
        return sealed_record_text(
            approval.model_dump_json(), self._codec, part="approval", run_id=approval.run_id
        )

    def _approval(self, record: str) -> Approval:
        return Approval.model_validate_json(open_record_text(record, self._codec, part="approval"))

    @staticmethod
    def _key(run_id: str, approval_id: str) -> dict[str, AttributeValueTypeDef]:
        return {"run_id": {"S": run_id}, "sk": {"S": approval_sk(approval_id)}}

    def _item(self, approval: Approval) -> dict[str, AttributeValueTypeDef]:
        return {
            **self._key(approval.run_id, approval.approval_id),
            "approval_id": {"S": approval.approval_id},
            "step": {"N": str(approval.step)},
            "status": {"S": approval.status.value},
            "record": {"S": self._record(approval)},
            TTL_ATTRIBUTE: {"N": str(int((approval.expires_at + self._retention).timestamp()))},
        }

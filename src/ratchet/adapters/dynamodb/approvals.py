"""Approvals on AWS: the approval items beside the parked execution's task token, how a
decision answers the execution, and how the state machine's answer is read back.

The `AwaitApproval` state hands its task token to the notify function, which keeps it here
under a random approval id; links and Slack buttons carry that id, never the token (a token in
a URL ends up in mail scanners, proxies and browser history). Whoever decides settles the item
with a conditional write, then answers the execution with the token, then deletes the token.

Items live in the checkpoints table, in the run's partition: `run_id`, `sk =
APPROVAL#<approval id>`, with `status` (what conditions test), `record` (the `Approval` as
JSON), `task_token` until the decision, and `expires_at` (the table's TTL attribute: the
request's deadline plus the checkpoint retention, so a decided request stays inspectable).

This module owns the answer's schema on both sides: what `SendTaskSuccess` and
`SendTaskFailure` carry (`task_success_output`, `task_failure`) and how the `RecordDecision`
task reads whatever arrived (`verdict_from_answer`), leniently: an answer sent by hand in any
shape still becomes a decision, because its token is spent and the run must not strand.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from ratchet.adapters.dynamodb.store import APPROVAL_PREFIX, TTL_ATTRIBUTE
from ratchet.errors import ApprovalClosed, ApprovalDecided, ApprovalExpired, StoreBusy
from ratchet.state import RunState, utcnow
from ratchet.untrusted import loads
from ratchet.waits import (
    MAX_BY_CHARS,
    MAX_COMMENT_CHARS,
    Approval,
    ApprovalStatus,
    Verdict,
    expired_verdict,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef
    from mypy_boto3_stepfunctions import SFNClient

REJECTED_ERROR = "Rejected"
"""The `error` of SendTaskFailure for a rejection; the state machine catches this name."""
UNNAMED = "(not named)"
"""Who decided, when a hand-sent answer did not say."""

VerdictKind = Literal["approved", "rejected", "expired"]
_TASK_CLOCK_LEAD = timedelta(seconds=30)


class ApprovalAnswer(BaseModel):
    """The `output` of SendTaskSuccess: the person approved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: str = Field(min_length=1, max_length=MAX_BY_CHARS)
    comment: str = Field(default="", max_length=MAX_COMMENT_CHARS)
    answer: dict[str, Any] | None = None
    """The structured answer, checked by the desk before it was sent."""


class Rejection(BaseModel):
    """The `cause` of SendTaskFailure (error `Rejected`), as JSON: the person said no."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: str = Field(min_length=1, max_length=MAX_BY_CHARS)
    reason: str = Field(default="", max_length=MAX_COMMENT_CHARS)


def task_success_output(verdict: Verdict) -> str:
    answer = ApprovalAnswer(by=verdict.by, comment=verdict.comment, answer=verdict.answer)
    return answer.model_dump_json(exclude_none=True)


def task_failure(verdict: Verdict) -> tuple[str, str]:
    """SendTaskFailure's `error` and `cause` (the cause is capped at 32,768 characters)."""
    return REJECTED_ERROR, Rejection(by=verdict.by, reason=verdict.comment).model_dump_json()


def verdict_from_answer(kind: VerdictKind, answer: Any, *, timeout_seconds: int) -> Verdict:
    """The decision the state machine's answer stands for, whatever its shape.

    `answer` is SendTaskSuccess's output (approved), the `{Error, Cause}` of a SendTaskFailure
    with error `Rejected` (rejected), or the timeout's (expired)."""
    if kind == "expired":
        return expired_verdict(timeout_seconds)
    if kind == "rejected":
        cause = answer.get("Cause") if isinstance(answer, dict) else None
        fields = _json_object(cause)
        if fields is None:
            return Verdict(approved=False, by=UNNAMED, comment=_text(cause))
        return Verdict(
            approved=False,
            by=_name(fields.get("by")),
            comment=_text(fields.get("reason", fields.get("comment"))),
        )
    fields = _json_object(answer) if isinstance(answer, str) else answer
    if not isinstance(fields, dict):
        return Verdict(approved=True, by=UNNAMED, comment=_text(answer))
    given = fields.get("answer")
    return Verdict(
        approved=True,
        by=_name(fields.get("by")),
        comment=_text(fields.get("comment")),
        answer=given if isinstance(given, dict) else None,
    )


def _json_object(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = loads(value, field="answer")  # a ValueError too when nested too deep
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _name(value: Any) -> str:
    text = " ".join(str(value).split()) if isinstance(value, str | int | float) else ""
    return text[:MAX_BY_CHARS] or UNNAMED


def _text(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) <= MAX_COMMENT_CHARS:
        return text
    return text[: MAX_COMMENT_CHARS - 1] + "…"


def approval_sk(approval_id: str) -> str:
    return f"{APPROVAL_PREFIX}{approval_id}"


class AwsApprovals:
    """The approval book (DynamoDB) and the resumer (Step Functions) of the AWS runtime."""

    def __init__(
        self,
        dynamodb: DynamoDBClient,
        table: str,
        *,
        stepfunctions: SFNClient | None = None,
        retention_days: int = 30,
    ) -> None:
        self._client = dynamodb
        self._table = table
        self._sfn = stepfunctions
        self._retention = timedelta(days=retention_days)

    # --- the book --------------------------------------------------------------------------

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

    def get(self, run_id: str, approval_id: str) -> Approval | None:
        found = self._client.get_item(
            TableName=self._table,
            Key=self._key(run_id, approval_id),
            ConsistentRead=True,
            ProjectionExpression="#r",
            ExpressionAttributeNames={"#r": "record"},
        ).get("Item")
        return Approval.model_validate_json(found["record"]["S"]) if found else None

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
        found = [Approval.model_validate_json(i["record"]["S"]) for p in pages for i in p["Items"]]
        return sorted(found, key=lambda a: a.created_at)

    def has_token(self, run_id: str, approval_id: str) -> bool:
        found = self._client.get_item(
            TableName=self._table,
            Key=self._key(run_id, approval_id),
            ConsistentRead=True,
            ProjectionExpression="task_token",
        ).get("Item")
        return bool(found and "task_token" in found)

    def settle(
        self, approval: Approval, verdict: Verdict, *, channel: str, at: datetime
    ) -> Approval:
        settled = approval.settled(verdict, channel=channel, at=at)
        if approval.is_expired(at):
            raise ApprovalExpired("this request has expired")
        # Pending -> decided, once: of two clicks, two channels or a replayed POST, the
        # first write wins and every later one fails this condition and changes nothing.
        try:
            self._set(settled, expect=ApprovalStatus.PENDING)
        except ClientError as error:
            if _code(error) != "ConditionalCheckFailedException":
                raise
            current = self.get(approval.run_id, approval.approval_id)
            status = current.status.value if current else "gone"
            by = f" by {current.decided_by}" if current and current.decided_by else ""
            raise ApprovalDecided(f"already {status}{by}") from None
        return settled

    def reopen(self, approval: Approval) -> None:
        reopened = approval.reopened()
        try:
            self._set(reopened, expect=approval.status)
        except ClientError as error:
            if _code(error) != "ConditionalCheckFailedException":
                raise

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
                    if _code(error) != "ConditionalCheckFailedException":
                        raise
            self._forget_token(run_id, approval.approval_id)

    # --- the resumer -----------------------------------------------------------------------

    def resume(self, approval: Approval, verdict: Verdict, run: RunState) -> RunState:
        if self._sfn is None:
            raise RuntimeError("this runtime was built without a Step Functions client")
        token = self._token(approval)
        try:
            if verdict.approved:
                self._sfn.send_task_success(taskToken=token, output=task_success_output(verdict))
            else:
                error, cause = task_failure(verdict)
                self._sfn.send_task_failure(taskToken=token, error=error, cause=cause)
        except ClientError as failed:
            code = _code(failed)
            if code == "TaskTimedOut":
                # Step Functions says TaskTimedOut for any task that is over: timed out,
                # answered another way, or its execution stopped. Only the first is an
                # expiry (the task's clock starts a moment before the request is stored).
                if approval.is_expired(utcnow() + _TASK_CLOCK_LEAD):
                    raise ApprovalExpired(
                        "the run stopped waiting: the request timed out"
                    ) from None
                raise ApprovalClosed("the run is no longer waiting for this request") from None
            if code in ("InvalidToken", "TaskDoesNotExist"):
                raise ApprovalClosed("the run is no longer waiting for this request") from None
            if code in ("ThrottlingException", "ServiceUnavailable", "InternalFailure"):
                raise StoreBusy(f"Step Functions is busy: {code}") from None
            raise
        self._forget_token(approval.run_id, approval.approval_id)
        return run  # as it stands until `RecordDecision` records the answer

    def _token(self, approval: Approval) -> str:
        found = self._client.get_item(
            TableName=self._table,
            Key=self._key(approval.run_id, approval.approval_id),
            ConsistentRead=True,
            ProjectionExpression="task_token",
        ).get("Item")
        if not found or "task_token" not in found:
            raise ApprovalClosed("the run is no longer waiting for this request")
        return found["task_token"]["S"]

    def _forget_token(self, run_id: str, approval_id: str) -> None:
        self._client.update_item(
            TableName=self._table,
            Key=self._key(run_id, approval_id),
            UpdateExpression="REMOVE task_token",
            ConditionExpression="attribute_exists(sk)",
        )

    # --- items -----------------------------------------------------------------------------

    def _set(self, approval: Approval, *, expect: ApprovalStatus, drop_token: bool = False) -> None:
        update = "SET #s = :new, #r = :record"
        if drop_token:
            update += " REMOVE task_token"
        self._client.update_item(
            TableName=self._table,
            Key=self._key(approval.run_id, approval.approval_id),
            UpdateExpression=update,
            ConditionExpression="#s = :expected",
            ExpressionAttributeNames={"#s": "status", "#r": "record"},
            ExpressionAttributeValues={
                ":new": {"S": approval.status.value},
                ":record": {"S": approval.model_dump_json()},
                ":expected": {"S": expect.value},
            },
        )

    @staticmethod
    def _key(run_id: str, approval_id: str) -> dict[str, AttributeValueTypeDef]:
        return {"run_id": {"S": run_id}, "sk": {"S": approval_sk(approval_id)}}

    def _item(self, approval: Approval) -> dict[str, AttributeValueTypeDef]:
        return {
            **self._key(approval.run_id, approval.approval_id),
            "approval_id": {"S": approval.approval_id},
            "step": {"N": str(approval.step)},
            "status": {"S": approval.status.value},
            "record": {"S": approval.model_dump_json()},
            TTL_ATTRIBUTE: {"N": str(int((approval.expires_at + self._retention).timestamp()))},
        }


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))

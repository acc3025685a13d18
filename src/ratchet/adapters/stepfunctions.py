"""Step Functions: the names of a run's executions, and the answer a parked approval task gets.

An execution name is at most 80 characters of a restricted alphabet, unique per state machine
for 90 days. Deriving it from the run id (and the rollover generation) makes a duplicate start
a no-op: the second StartExecution with the same name and input is refused or returns the
first execution.

The `AwaitApproval` state parks with a task token, which the approval book keeps
(`ratchet.adapters.dynamodb.approvals`). A decision answers it here (`StepFunctionsResumer`):
`SendTaskSuccess` or `SendTaskFailure` with the token, which is then dropped. This module owns
the answer's schema on both sides: what those calls carry (`task_success_output`,
`task_failure`) and how the `RecordDecision` task reads whatever arrived
(`verdict_from_answer`), leniently: an answer sent by hand in any shape still becomes a
decision, because its token is spent and the run must not strand. What Step Functions says
of a token is Ratchet's error: `ApprovalClosed`, `ApprovalExpired`, or `StoreBusy` for now.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from ratchet.errors import ApprovalClosed, ApprovalExpired, StoreBusy
from ratchet.state import RunState, WaitSettled, utcnow
from ratchet.untrusted import loads
from ratchet.waits import MAX_BY_CHARS, MAX_COMMENT_CHARS, Approval, Verdict, expired_verdict

if TYPE_CHECKING:
    from collections.abc import Callable

    from mypy_boto3_stepfunctions import SFNClient

    from ratchet.adapters.dynamodb.waits import ParkedWait
    from ratchet.ports import WakeHow

# --- execution names ------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX = 80


def execution_name(run_id: str, generation: int = 0) -> str:
    """`<readable run id>-<hash>-g<generation>`: stable, unique per run and generation."""
    digest = hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:10]
    suffix = f"-{digest}-g{generation}"
    readable = _UNSAFE.sub("_", run_id)[: _MAX - len(suffix)]
    return f"{readable}{suffix}"


RETRY_GENERATIONS = 1_000_000
"""Generations set aside for each retry of a run. A run's executions roll over at most once per
step taken (`rollover_after` >= 1) and a run takes at most `MAX_STEPS` (10,000) steps, so the
generations of one retry never reach the next retry's: the names of a retried run's executions
cannot collide with those of its earlier executions."""

_NAME = re.compile(r"^.*-[0-9a-f]{10}-g(\d+)$")


def first_generation(retry: int) -> int:
    """The generation of the first execution after the run's `retry`-th retry (0: its start)."""
    return retry * RETRY_GENERATIONS


def is_execution_of(name: str, run_id: str) -> bool:
    """Whether `name` is the name of one of the run's executions (any generation)."""
    return generation_of(name, run_id) is not None


def generation_of(name: str, run_id: str) -> int | None:
    """The generation of the run's execution `name`; None if it is not one of the run's."""
    found = _NAME.fullmatch(name)
    if found is None or execution_name(run_id, int(found.group(1))) != name:
        return None
    return int(found.group(1))


def execution_arn(machine_arn: str, name: str) -> str:
    """The ARN of the execution `name` of the state machine `machine_arn`."""
    return f"{machine_arn.replace(':stateMachine:', ':execution:', 1)}:{name}"


def last_of(holds: Callable[[int], bool], first: int) -> int | None:
    """The last number of the unbroken run from `first` for which `holds` is true; None if it
    is false for `first`. Strides double until one lands past the end, then the gap halves:
    about 2 log2(n) + 2 calls of `holds` for a run of n numbers."""
    if not holds(first):
        return None
    found, stride = first, 1
    while holds(first + stride):
        found, stride = first + stride, stride * 2
    past = first + stride
    while past - found > 1:
        middle = (found + past) // 2
        if holds(middle):
            found = middle
        else:
            past = middle
    return found


def latest_execution(sfn: SFNClient, machine_arn: str, run_id: str) -> tuple[int, Any] | None:
    """The run's latest execution: its generation and DescribeExecution's answer; None if the
    run has none. A run's executions fill its slots of generations (`first_generation`) in
    order, from 0 (a start, then each retry or hand-over in the first free slot), and the
    generations within a slot with no gap (each rollover or relaunch is the next one), so
    two searches (`last_of`) find it in about 2 log2(slots) + 2 log2(generations) + 2
    DescribeExecution calls: 3 for a run with one execution, 22 for one that rolled over 999
    times, where ListExecutions would page through every execution the machine keeps (1,000
    a call, for 90 days)."""
    described: dict[int, Any] = {}

    def exists(generation: int) -> bool:
        if generation in described:
            return True
        arn = execution_arn(machine_arn, execution_name(run_id, generation))
        try:
            described[generation] = sfn.describe_execution(executionArn=arn)
        except sfn.exceptions.ExecutionDoesNotExist:
            return False
        return True

    slot = last_of(lambda retry: exists(first_generation(retry)), 0)
    if slot is None:
        return None
    generation = last_of(exists, first_generation(slot))
    assert generation is not None  # the slot's first generation exists: it was just found
    return generation, described[generation]


# --- the answer's schema --------------------------------------------------------------------------

REJECTED_ERROR = "Rejected"
"""The `error` of SendTaskFailure for a rejection; the state machine catches this name."""
UNNAMED = "(not named)"
"""Who decided, when a hand-sent answer did not say."""

VerdictKind = Literal["approved", "rejected", "expired"]


class ExecutionInput(BaseModel):
    """The input of every execution: the first (started by the API) and each successor. The
    field names are the ones the ASL's paths name (tests/unit/test_agent_run_asl.py)."""

    # The ASL adds nothing the model does not name; anything else is a wiring mistake.
    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    generation: int = Field(default=0, ge=0)
    """0 for the execution the API starts; +1 at every rollover."""
    iteration: int = Field(default=0, ge=0)
    approval_timeout_seconds: int = Field(ge=1)


def start_execution(sfn: SFNClient, machine_arn: str, execution: ExecutionInput) -> bool:
    """Start the run's execution of `execution.generation`; False if its name is taken.

    Same name and input as a running execution: Step Functions returns that execution. A
    closed one (the run finished or rolled over): `ExecutionAlreadyExists`. Either way the run
    already has, or had, that execution."""
    try:
        sfn.start_execution(
            stateMachineArn=machine_arn,
            name=execution_name(execution.run_id, execution.generation),
            input=execution.model_dump_json(),
        )
    except sfn.exceptions.ExecutionAlreadyExists:
        return False
    return True


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


# --- answering a parked task ----------------------------------------------------------------------


_TASK_CLOCK_LEAD = timedelta(seconds=30)
"""How long before the request was stored the parked task's own timeout may have started."""


class TaskTokens(Protocol):
    """Where each parked task's token is kept until its decision (`AwsApprovals`)."""

    def task_token(self, approval: Approval) -> str:
        """The token of the approval's parked task; `ApprovalClosed` if it was dropped."""
        ...

    def forget_token(self, run_id: str, approval_id: str) -> None: ...


class StepFunctionsResumer:
    """`Resumer` on AWS: answers the parked execution with the approval's task token, then
    drops the token, so that no link or button can answer it again."""

    def __init__(self, tokens: TaskTokens, stepfunctions: SFNClient | None) -> None:
        self._tokens = tokens
        self._sfn = stepfunctions

    def resume(self, approval: Approval, verdict: Verdict, run: RunState) -> RunState:
        if self._sfn is None:
            raise RuntimeError("this runtime was built without a Step Functions client")
        token = self._tokens.task_token(approval)
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
        self._tokens.forget_token(approval.run_id, approval.approval_id)
        return run  # as it stands until `RecordDecision` records the answer


# --- waking an execution parked on an event or a time ---------------------------------------------

WAIT_SETTLED_OUTPUT = '{"settled":true}'
"""SendTaskSuccess's output for a settled event wait. `AwaitEvent` drops it (ResultPath null):
the run's head holds what settled the wait, and `Step` reads it there."""
_TASK_OVER = ("TaskTimedOut", "InvalidToken", "TaskDoesNotExist")
"""What Step Functions says of a token whose task is over: answered already, timed out (a
chunk ran out), or its execution stopped."""
_BUSY = ("ThrottlingException", "ServiceUnavailable", "InternalFailure")


class WaitTokens(Protocol):
    """Where the token of each execution parked on an event wait is kept, and the wake owed
    to it marked (`AwsWaitTokens`)."""

    def look(self, run_id: str, step: int) -> ParkedWait: ...

    def forget(self, run_id: str, step: int, task_token: str) -> None: ...

    def owe(self, run_id: str, step: int, how: WakeHow, *, at: datetime) -> None: ...

    def clear_owed(self, run_id: str, step: int) -> None: ...


class StepFunctionsNudge:
    """`Nudge` on AWS: wakes the execution parked on a wait a desk settled.

    Before the desk settles, `owe` marks the wait's item: a wake is owed from then until the
    answer drops the mark, so a desk that dies in between (or whose answer is throttled past
    its retries) leaves the mark for the sweep (`ratchet.waiting.wakes`), which answers later.

    An event wait's (and a children wait's) execution waits for its task token
    (`AwaitEvent`): the nudge answers it with SendTaskSuccess and drops it with the mark; the
    execution goes on to `Step`, which finds the run runnable. A token whose task is over
    (answered by open_wait itself, or by another waker, timed out, stopped) means the
    execution moved on: nothing to do. Answering twice is harmless for the same reason: the
    second answer finds the task over, and an execution woken while its run still waits
    (never the case for a settled wait) would only find it waiting in `Step` and park again.
    No token kept: no execution is parked there yet, and the one that parks looks at the run
    after keeping its token (open_wait), so the mark is dropped.

    A sleeping execution sits in a `Wait` state, which nothing can interrupt: a run woken
    early (`how == "woken"`) has its execution restarted instead (`relaunch`: the successor
    starts, the sleeper is stopped), and the mark is dropped after it. Failures are
    `StoreBusy` for now; the desk has settled the wait durably either way, and the mark stays
    for the sweep."""

    def __init__(
        self,
        tokens: WaitTokens,
        stepfunctions: SFNClient | None,
        *,
        relaunch: Callable[[str], object] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._tokens = tokens
        self._sfn = stepfunctions
        self._relaunch = relaunch
        self._clock = clock

    def owe(self, run_id: str, step: int, how: WakeHow) -> None:
        self._tokens.owe(run_id, step, how, at=self._clock())

    def __call__(self, head: RunState, settled: WaitSettled) -> None:
        if settled.how in ("event", "timeout", "children"):
            self.resume(head.run_id, settled.step)
        elif settled.how == "woken" and self._relaunch is not None:
            self._relaunch(head.run_id)
            self._tokens.clear_owed(head.run_id, settled.step)

    def resume(self, run_id: str, step: int) -> bool:
        """Answer the execution parked on the run's event wait at `step`, if one is: True if
        a token was kept (answered now, or found over), False if none was. Either way the
        wake owed there is paid."""
        if self._sfn is None:
            raise RuntimeError("this runtime was built without a Step Functions client")
        parked = self._tokens.look(run_id, step)
        token = parked.token
        if token is None:
            if parked.owed:
                self._tokens.clear_owed(run_id, step)
            return False
        try:
            self._sfn.send_task_success(taskToken=token, output=WAIT_SETTLED_OUTPUT)
        except ClientError as failed:
            code = _code(failed)
            if code in _BUSY:
                raise StoreBusy(f"Step Functions is busy: {code}") from None
            if code not in _TASK_OVER:
                raise
        self._tokens.forget(run_id, step, token)
        return True


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))

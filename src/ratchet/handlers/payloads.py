"""What travels through the state machine (`statemachine/agent_run.asl.json`): each task's
payload and result (the execution's own input, which the runtime starts executions with, is
`ratchet.adapters.stepfunctions.ExecutionInput`).

Only the run id and small counters travel; the run's state stays in DynamoDB, so an execution's
payload never approaches Step Functions' 256 KB cap however long the run. The field names here
are the ones the ASL's paths name: rename one and the state machine breaks.
"""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from ratchet.adapters.stepfunctions import execution_name
from ratchet.engine import Outcome, StepOutcome
from ratchet.limits import DEFAULT_QUEUE_RETRY_SECONDS
from ratchet.state import ApprovalRequest, ChildrenWait, EventWait, RunState, TimerWait, utcnow

MAX_REASON_CHARS = 2000
"""How much of a failure's error and cause the run keeps as its `error`."""

LoopOutcome = Literal["continue", "waiting", "done", "failed", "rollover", "queued"]
"""The engine's outcomes plus `rollover`: continue in a successor execution."""

_LOOP_OUTCOME: dict[Outcome, LoopOutcome] = {
    Outcome.CONTINUE: "continue",
    Outcome.WAITING: "waiting",
    Outcome.DONE: "done",
    Outcome.FAILED: "failed",
    # The run ended on its own terms (the step cap) or was cancelled: the execution ends as
    # it does when the run is done; the run's status says which.
    Outcome.STOPPED: "done",
    Outcome.CANCELLED: "done",
    # No slot of the run's bounded agent was free: the state machine waits `retry_in`
    # seconds (a Wait state, no compute) and tries the step again, no attempt used.
    Outcome.QUEUED: "queued",
}


WAIT_CHUNK_SECONDS = 7 * 24 * 3600
"""The longest one park of an event wait or a timer lasts (a week). A wait may last a year
(`MAX_WAIT_SECONDS`), as long as an execution may live, so no park is as long as the wait: the
execution parks for at most a chunk, and when the chunk ends before the wait is due the loop
goes round (`RecordWait` records nothing, `Step` finds the run still waiting and parks again).
A week keeps the loop's cost out of sight (one Step and one RecordWait invocation, about a
dozen history events, 52 times a year) and keeps the margin an old execution needs before it
rolls over (`PARK_ROLLOVER_AGE`) small against its year. Read at each step, so a test may set
it short."""

EXECUTION_MAX_AGE = timedelta(days=365)
"""Step Functions ends a Standard execution a year after it started, parked or not."""
PARK_ROLLOVER_AGE = EXECUTION_MAX_AGE - timedelta(days=30)
"""An execution this old rolls over before it parks for an event or a time, so its successor
parks instead: a park of a chunk, and the steps that follow it, end well inside the year.
Person waits keep their own path (an approval's task times out with the request)."""

WaitKind = Literal["person", "event", "timer"]


class _Payload(BaseModel):
    # The ASL adds nothing the models do not name; anything else is a wiring mistake.
    model_config = ConfigDict(frozen=True, extra="forbid")


class StepRequest(_Payload):
    run_id: str
    generation: int = Field(default=0, ge=0)
    iteration: int = Field(default=0, ge=0)
    """Invocations of the step function (loop iterations) this execution has made so far,
    each of one step or several."""
    started_at: datetime | None = None
    """When this execution started (`$$.Execution.StartTime`): an old one rolls over before
    it parks (`PARK_ROLLOVER_AGE`). None from a definition older than the field."""
    retry_count: int = Field(default=0, ge=0)
    """How many times the state machine has retried this entry of `Step`
    (`$$.State.RetryCount`). A retry takes one step only: Step Functions counts retries per
    entry of the state, so an invocation that went on past the step it retried would spend
    that step's retries on the failures of the steps after it."""

    @field_validator("started_at")
    @classmethod
    def _as_utc(cls, value: datetime | None) -> datetime | None:
        # Step Functions writes UTC with a `Z`; a time with no zone is UTC too.
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class WaitPlan(_Payload):
    """How the execution parks a waiting run, which the state machine routes on
    (`$.loop.wait`): a person's request through `AwaitApproval`, an event through
    `AwaitEvent` (a task token, timing out after `timeout_seconds`; child runs too), a time
    through `Sleep` (a `Wait` state until `wake_at`). An event's or a timer's park lasts at most
    `WAIT_CHUNK_SECONDS`; the run's real due time stays in its head, which `RecordWait`
    checks."""

    kind: WaitKind
    wake_at: datetime | None = None
    """A timer's park ends then: its time, or a chunk from now if that is sooner."""
    timeout_seconds: int | None = Field(default=None, ge=1)
    """An event's park times out after this: the seconds left until the wait's own timeout,
    or a chunk if that is sooner or it has none."""

    @field_serializer("wake_at")
    def _timestamp(self, value: datetime | None) -> str | None:
        # The form a Wait state's TimestampPath takes everywhere (moto's interpreter accepts
        # only `Z`), rounded up: a park that ends before the time only goes round once more.
        if value is None:
            return None
        utc = value.astimezone(UTC)
        if utc.microsecond:
            utc = utc.replace(microsecond=0) + timedelta(seconds=1)
        return utc.strftime("%Y-%m-%dT%H:%M:%SZ")

    @classmethod
    def of(cls, head: RunState, now: datetime) -> WaitPlan:
        """The park of the run's wait, as it stands at `now`. A wait already due parks for
        no time (a past `wake_at`, a 1 s timeout), so `RecordWait` settles it at once."""
        request = head.waiting.request if head.waiting is not None else None
        chunk = timedelta(seconds=WAIT_CHUNK_SECONDS)
        if isinstance(request, TimerWait):
            wake_at = now + chunk if request.until is None else min(request.until, now + chunk)
            return cls(kind="timer", wake_at=wake_at)
        if isinstance(request, EventWait):
            seconds = float(WAIT_CHUNK_SECONDS)
            if request.expires_at is not None:
                seconds = min(seconds, (request.expires_at - now).total_seconds())
            return cls(kind="event", timeout_seconds=max(1, math.ceil(seconds)))
        if isinstance(request, ChildrenWait):
            # Parked as an event wait is: on a task token the children's ends answer, for a
            # chunk at a time (each renewal looks at the children again).
            return cls(kind="event", timeout_seconds=WAIT_CHUNK_SECONDS)
        if isinstance(request, ApprovalRequest):
            return cls(kind="person")
        raise ValueError(f"run {head.run_id!r} is waiting with no request to park on")


class StepResult(_Payload):
    outcome: LoopOutcome
    run_id: str
    step: int
    version: int
    generation: int
    iteration: int
    next_execution: str | None = None
    """The successor's execution name, when the outcome is `rollover`."""
    wait: WaitPlan | None = None
    """How to park, when the outcome is `waiting`."""
    retry_in: int | None = None
    """Seconds to wait before trying the step again, when the outcome is `queued`."""

    @classmethod
    def after(
        cls,
        request: StepRequest,
        taken: StepOutcome,
        *,
        rollover_after: int,
        now: datetime | None = None,
        queue_retry_seconds: int = DEFAULT_QUEUE_RETRY_SECONDS,
        rng: random.Random | None = None,
    ) -> StepResult:
        """The loop's next move. Continue-as-new happens between two steps that both
        continue (the step just taken is committed, so the successor starts at the next one),
        and before an old execution parks for an event or a time (the successor finds the run
        waiting and parks in its stead)."""
        now = now or utcnow()
        iteration = request.iteration + 1
        outcome = _LOOP_OUTCOME[taken.outcome]
        wait = None
        if taken.outcome is Outcome.WAITING:
            if taken.head is None:
                raise ValueError(f"run {taken.run_id!r}: a waiting outcome without its head")
            wait = WaitPlan.of(taken.head, now)
        # Full jitter: runs that found no slot at once do not all come back at once.
        draw = rng or random
        retry_in = None
        if taken.outcome is Outcome.QUEUED:
            retry_in = draw.randint(1, queue_retry_seconds)
            if taken.retry_after is not None:  # the next minute of model calls, spread out
                retry_in += math.ceil(taken.retry_after) - 1
        next_execution = None
        looping = taken.outcome in (Outcome.CONTINUE, Outcome.QUEUED)
        if (looping and iteration >= rollover_after) or (
            wait is not None
            and wait.kind != "person"
            and request.started_at is not None
            and now - request.started_at >= PARK_ROLLOVER_AGE
        ):
            outcome = "rollover"
            next_execution = execution_name(request.run_id, request.generation + 1)
            wait = retry_in = None
        return cls(
            outcome=outcome,
            run_id=taken.run_id,
            step=taken.step,
            version=taken.version,
            generation=request.generation,
            iteration=iteration,
            next_execution=next_execution,
            wait=wait,
            retry_in=retry_in,
        )


class NotifyRequest(_Payload):
    """The `AwaitApproval` task's payload. The token is a bearer credential for the
    execution: it is stored, never logged and never returned."""

    run_id: str
    task_token: str = Field(min_length=1, repr=False)
    timeout_seconds: int | None = Field(default=None, ge=1)
    """The task's timeout, so the stored approval expires with it (default: the setting)."""


class NotifyResult(_Payload):
    approval_id: str


class DecideRequest(_Payload):
    """The `RecordDecision` task's payload: what the parked task ended with, as it arrived
    (read by `ratchet.adapters.stepfunctions.verdict_from_answer`, which owns its shape)."""

    run_id: str
    step: int | None = Field(default=None, ge=0)
    """The step the execution parked at; the decision is recorded only on a run that still
    waits there (absent from executions started by a definition before this field)."""
    verdict: Literal["approved", "rejected", "expired"]
    answer: Any = None
    """SendTaskSuccess's output, or the `{Error, Cause}` the task failed with."""
    approval_timeout_seconds: int | None = Field(default=None, ge=1)


class DecideResult(_Payload):
    run_id: str
    status: str
    step: int
    recorded: bool
    """False when the run was no longer waiting: someone decided first, nothing changed."""


class OpenWaitRequest(_Payload):
    """The `AwaitEvent` task's payload. The token is a bearer credential for the execution:
    it is stored in the run's wait item, never logged and never returned."""

    run_id: str
    step: int = Field(ge=0)
    """The step the run waits at: the token answers this wait and no later one."""
    task_token: str = Field(min_length=1, repr=False)


class OpenWaitResult(_Payload):
    """What the open_wait function returns (the task itself waits for its token)."""

    run_id: str
    step: int
    settled: bool
    """True when the wait was settled already (an event in the mailbox, taken now or before
    the execution parked): the function answered its own token and the run goes on."""


class RecordWaitRequest(_Payload):
    """The `RecordWait` task's payload: a park ended by its own clock (a `Sleep` that ended, an
    `AwaitEvent` that timed out), which settles the wait only if it is really due."""

    run_id: str
    step: int = Field(ge=0)
    kind: Literal["event", "timer"]


class RecordWaitResult(_Payload):
    run_id: str
    status: str
    step: int
    recorded: bool
    """False when nothing was settled: a chunk that ended before the wait was due, or a wait
    that another writer settled first (an event, a wake, a cancel)."""


class TaskFailure(BaseModel):
    """What a Catch puts at its ResultPath: Step Functions' own field names."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    error: str = Field(alias="Error")
    cause: str = Field(default="", alias="Cause")

    def reason(self) -> str:
        """One readable line for the run's `error`. A Lambda's cause is its error JSON; its
        message says more than the stack trace beside it."""
        cause = self.cause
        try:
            detail: Any = json.loads(cause)
        except ValueError:
            detail = None
        if isinstance(detail, dict) and isinstance(detail.get("errorMessage"), str):
            cause = detail["errorMessage"]
        text = f"{self.error}: {cause}" if cause else self.error
        return text[:MAX_REASON_CHARS]


class MarkFailedRequest(_Payload):
    run_id: str
    error: TaskFailure


class MarkFailedResult(_Payload):
    run_id: str
    status: str
    step: int

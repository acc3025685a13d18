"""What travels through the state machine (`statemachine/agent_run.asl.json`): each task's
payload and result (the execution's own input, which the runtime starts executions with, is
`ratchet.adapters.stepfunctions.ExecutionInput`).

Only the run id and small counters travel; the run's state stays in DynamoDB, so an execution's
payload never approaches Step Functions' 256 KB cap however long the run. The field names here
are the ones the ASL's paths name: rename one and the state machine breaks.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ratchet.adapters.stepfunctions import execution_name
from ratchet.engine import Outcome, StepOutcome

MAX_REASON_CHARS = 2000
"""How much of a failure's error and cause the run keeps as its `error`."""

LoopOutcome = Literal["continue", "waiting", "done", "failed", "rollover"]
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
}


class _Payload(BaseModel):
    # The ASL adds nothing the models do not name; anything else is a wiring mistake.
    model_config = ConfigDict(frozen=True, extra="forbid")


class StepRequest(_Payload):
    run_id: str
    generation: int = Field(default=0, ge=0)
    iteration: int = Field(default=0, ge=0)
    """Steps this execution has taken so far."""


class StepResult(_Payload):
    outcome: LoopOutcome
    run_id: str
    step: int
    version: int
    generation: int
    iteration: int
    next_execution: str | None = None
    """The successor's execution name, when the outcome is `rollover`."""

    @classmethod
    def after(cls, request: StepRequest, taken: StepOutcome, *, rollover_after: int) -> StepResult:
        """The loop's next move. Continue-as-new happens only between two steps that both
        continue: the step just taken is committed, so the successor starts at the next one."""
        iteration = request.iteration + 1
        outcome = _LOOP_OUTCOME[taken.outcome]
        next_execution = None
        if taken.outcome is Outcome.CONTINUE and iteration >= rollover_after:
            outcome = "rollover"
            next_execution = execution_name(request.run_id, request.generation + 1)
        return cls(
            outcome=outcome,
            run_id=taken.run_id,
            step=taken.step,
            version=taken.version,
            generation=request.generation,
            iteration=iteration,
            next_execution=next_execution,
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

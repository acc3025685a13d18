"""The `Step` task: advance the run by one step or several, and say where the loop goes next.

Each invocation takes steps one after another, each committed before the next, while the run
keeps running and the invocation's time left holds another step of its agent (its step time
limit and a margin), up to `max_steps_per_invocation` (`ratchet.engine.budget`): a scripted
run pays two state transitions per invocation rather than per step. A retry of the task takes
the step it retries alone (`StepRequest.retry_count`), so the retries of one entry of `Step`
are spent on one step's failures, as when each step had an entry of its own; a retry that
finds the step not begun (the invocation died between two steps) takes none, and the loop
enters `Step` anew, so that death spends none of the step's retries.

Errors are the state machine's business and keep their class names, which its Retry and Catch
clauses match: `StaleVersion` and `Superseded` (another execution owns the run; stop without
touching it) are answers; anything else is retried, the engine's count of attempts ending a
run that keeps failing. The adapters have already named a store that is busy (`StoreBusy`).

One error ends the sandbox instead: `AbandonedCallRunning`, a run whose strikes are used up
while a call this sandbox abandoned at a step deadline still runs. Frozen with the sandbox, the
call would go on at its next invocation, after the run was failed; the end of the process ends
it, and the state machine's retry of the crash (`Runtime.ExitError`) fails the run in a new one.
So does a failed attempt that gave up an at-most-once call at its deadline (recorded first):
the retry in another sandbox asks a person whether the call ran once its deadline has passed
(`ratchet.engine.calls`), and a call that thawed later with this sandbox would land after the
answer.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, NoReturn

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.engine import Outcome, StepBudget, StepOutcome, running_calls, take_steps
from ratchet.errors import (
    AbandonedCallRunning,
    StaleVersion,
    StepAttemptFailed,
    StoreBusy,
    Superseded,
)
from ratchet.handlers._wiring import approvals, engine, logger, metrics, settings, tracer
from ratchet.handlers.payloads import StepRequest, StepResult
from ratchet.state import RunStatus, utcnow
from ratchet.waits import ApprovalStatus


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics(capture_cold_start_metric=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = StepRequest.model_validate(event)
    return take_step(request, context).model_dump(mode="json")


def take_step(request: StepRequest, context: LambdaContext) -> StepResult:
    logger.append_keys(run_id=request.run_id, generation=request.generation)
    config = settings()
    if request.retry_count:
        head = engine(context).load(request.run_id)
        if head.status is RunStatus.RUNNING and head.attempts == 0:
            # The invocation this retries died before the run's next step began (right after
            # the commit of the step before): no attempt of the step, so none of the entry's
            # retries, which count the step's deaths, must go to it. Back to the loop: `Step`
            # is entered afresh, with all its retries, for the step's own attempts.
            metrics.add_metric(name="DeathsBetweenSteps", unit=MetricUnit.Count, value=1)
            logger.info("the invocation retried died between two steps; entering the step anew")
            return StepResult.after(
                request,
                StepOutcome.of(head),
                rollover_after=config.rollover_after,
                queue_retry_seconds=config.queue_retry_seconds,
            )
    budget = StepBudget(
        max_steps=1 if request.retry_count else config.max_steps_per_invocation,
        seconds_left=lambda: context.get_remaining_time_in_millis() / 1000,
    )
    try:
        taken = take_steps(engine(context), request.run_id, budget, on_step=_Measured())
    except StaleVersion:
        metrics.add_metric(name="StaleCommits", unit=MetricUnit.Count, value=1)
        logger.warning("stale version: another execution advanced the run; stopping")
        raise
    except StepAttemptFailed:
        metrics.add_metric(name="FailedAttempts", unit=MetricUnit.Count, value=1)
        if running_calls(request.run_id):
            logger.error("ending the sandbox, which ends the at-most-once call it gave up")
            end_sandbox()
        raise
    except StoreBusy:
        metrics.add_metric(name="StoreBusy", unit=MetricUnit.Count, value=1)
        raise
    except AbandonedCallRunning as running:
        logger.error(
            "ending the sandbox, which ends the call it abandoned", extra={"error": str(running)}
        )
        end_sandbox()
    metrics.add_metric(name="StepsPerInvocation", unit=MetricUnit.Count, value=budget.taken)
    _stop_if_parked_elsewhere(taken)
    if taken.outcome is Outcome.QUEUED:
        metrics.add_metric(name="QueuedSteps", unit=MetricUnit.Count, value=1)
        if taken.why is None:  # else the engine said why
            logger.info("no free slot for the run's agent; the step waits its turn")
    return StepResult.after(
        request,
        taken,
        rollover_after=config.rollover_after,
        queue_retry_seconds=config.queue_retry_seconds,
    )


class _Measured:
    """Each step's duration and checkpoint bytes, as metrics."""

    def __init__(self) -> None:
        self._since = time.perf_counter()

    def __call__(self, taken: StepOutcome) -> None:
        now = time.perf_counter()
        metrics.add_metric(
            name="StepDuration", unit=MetricUnit.Milliseconds, value=(now - self._since) * 1000
        )
        self._since = now
        if taken.bytes_written:
            metrics.add_metric(
                name="CheckpointBytes", unit=MetricUnit.Bytes, value=taken.bytes_written
            )


def end_sandbox() -> NoReturn:
    """End this process at once (Lambda reports `Runtime.ExitError`), its threads with it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _stop_if_parked_elsewhere(taken: StepOutcome) -> None:
    """A run found waiting (this invocation wrote nothing) with an open request is parked by
    another execution already: a second one must not park it again with a second request.
    Found waiting with none, this execution parked it and died before asking (a retry)."""
    if taken.outcome is not Outcome.WAITING or taken.bytes_written:
        return
    now = utcnow()
    if any(
        a.step == taken.step and a.status is ApprovalStatus.PENDING and not a.is_expired(now)
        for a in approvals().of_run(taken.run_id)
    ):
        metrics.add_metric(name="SupersededExecutions", unit=MetricUnit.Count, value=1)
        logger.warning("the run is already parked under another execution; stopping")
        raise Superseded(taken.run_id)

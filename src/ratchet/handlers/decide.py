"""The `RecordDecision` task: record the answer the parked execution got (or its absence) as
the waiting step's result, so the run moves on knowing it.

The state machine calls this after SendTaskSuccess (approved), after SendTaskFailure with the
error `Rejected`, and after the approval timed out (rejected by "nobody"). The answer arrives as
it was sent and is read leniently (`verdict_from_answer`): its token is spent, so whatever its
shape it becomes a decision rather than a stranded run. A run that no longer waits at the step
the execution parked at was decided already (a retried task, a second execution, another
channel): nothing changes. Either way that step's approval requests are closed and their tokens
dropped.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.adapters.stepfunctions import verdict_from_answer
from ratchet.errors import NotWaiting
from ratchet.handlers._wiring import approvals, engine, logger, metrics, settings, tracer
from ratchet.handlers.payloads import DecideRequest, DecideResult
from ratchet.state import RunState, utcnow
from ratchet.waits import ApprovalStatus


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = DecideRequest.model_validate(event)
    return record_decision(request, context).model_dump(mode="json")


def record_decision(request: DecideRequest, context: LambdaContext) -> DecideResult:
    timeout = request.approval_timeout_seconds or settings().approval_timeout_seconds
    verdict = verdict_from_answer(request.verdict, request.answer, timeout_seconds=timeout)
    ratchet = engine(context)
    # The step the execution parked at: a run that went on and waits again at a later step
    # (worked in process meanwhile) must not take this answer as that wait's. An execution
    # started by a definition older than `step` parked where the run is: its head, read once.
    run: str | RunState = request.run_id
    waiting_at = request.step
    if waiting_at is None:
        run = ratchet.load(request.run_id)
        waiting_at = run.step
    try:
        state = ratchet.decide_waiting(run, verdict, step=waiting_at)
        recorded = True
    except NotWaiting as already:
        metrics.add_metric(name="DecisionsIgnored", unit=MetricUnit.Count, value=1)
        logger.info(
            "decision ignored: the run is not waiting",
            extra={"run_id": request.run_id, "status": already.status},
        )
        state = ratchet.load(request.run_id)
        recorded = False
    closed = ApprovalStatus.EXPIRED if request.verdict == "expired" else ApprovalStatus.CLOSED
    approvals().close(request.run_id, waiting_at, closed, at=utcnow())
    if recorded:
        metric = {"approved": "ApprovalsGranted", "rejected": "ApprovalsDenied"}.get(
            request.verdict, "ApprovalsExpired"
        )
        metrics.add_metric(name=metric, unit=MetricUnit.Count, value=1)
    return DecideResult(
        run_id=state.run_id, status=state.status.value, step=state.step, recorded=recorded
    )

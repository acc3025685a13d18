"""The `RecordDecision` task: record a person's answer (or its absence) as the waiting step's
result, so the run moves on knowing it.

The state machine calls this after SendTaskSuccess (approved), after SendTaskFailure with the
error `Rejected`, and after the approval timed out (rejected by "nobody"). A run that is no
longer waiting was decided already (a retried task, a second execution): nothing changes.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.aws.payloads import DecideRequest, DecideResult
from ratchet.errors import NotWaiting
from ratchet.handlers._wiring import engine, logger, metrics, tracer


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = DecideRequest.model_validate(event)
    return record_decision(request, context).model_dump(mode="json")


def record_decision(request: DecideRequest, context: LambdaContext) -> DecideResult:
    ratchet = engine(context)
    try:
        state = ratchet.decide_waiting(
            request.run_id, approved=request.approved, by=request.by, comment=request.comment
        )
    except NotWaiting as already:
        metrics.add_metric(name="DecisionsIgnored", unit=MetricUnit.Count, value=1)
        logger.info(
            "decision ignored: the run is not waiting",
            extra={"run_id": request.run_id, "status": already.status},
        )
        state = ratchet.load(request.run_id)
        return DecideResult(
            run_id=state.run_id, status=state.status.value, step=state.step, recorded=False
        )
    metrics.add_metric(
        name="ApprovalsGranted" if request.approved else "ApprovalsDenied",
        unit=MetricUnit.Count,
        value=1,
    )
    return DecideResult(
        run_id=state.run_id, status=state.status.value, step=state.step, recorded=True
    )

"""The `MarkFailed` task: a step failed in a way the state machine will not retry; mark the run
failed with the error, keeping its last checkpoint. A run that already finished stays as it
is, so a retried task changes nothing."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.handlers._wiring import engine, logger, metrics, tracer
from ratchet.handlers.payloads import MarkFailedRequest, MarkFailedResult
from ratchet.state import RunStatus


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = MarkFailedRequest.model_validate(event)
    return mark_failed(request, context).model_dump(mode="json")


def mark_failed(request: MarkFailedRequest, context: LambdaContext) -> MarkFailedResult:
    state = engine(context).fail(request.run_id, request.error.reason())
    metrics.add_metric(name="RunsMarkedFailed", unit=MetricUnit.Count, value=1)
    logger.warning(
        "run marked failed" if state.status is RunStatus.FAILED else "run had finished",
        extra={
            "run_id": state.run_id,
            "step": state.step,
            "status": state.status.value,
            "error": request.error.error,
        },
    )
    return MarkFailedResult(run_id=state.run_id, status=state.status.value, step=state.step)

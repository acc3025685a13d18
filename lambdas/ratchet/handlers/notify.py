"""The `AwaitApproval` task: keep the parked execution's task token under a new approval id.

The token is a bearer credential for the execution, so it goes to the table and nowhere else:
not to the log, not to the result. Sending the person the approval link is the next step of
the approval flow; until then the id is logged for an operator to act on.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.aws.payloads import NotifyRequest, NotifyResult
from ratchet.errors import RunNotFound
from ratchet.handlers._wiring import approvals, logger, metrics, runtime, settings, tracer


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = NotifyRequest.model_validate(event)
    return keep_token(request).model_dump(mode="json")


def keep_token(request: NotifyRequest) -> NotifyResult:
    head = runtime().store.load_head(request.run_id)
    if head is None:
        raise RunNotFound(request.run_id)
    step = head.step
    approval_id = approvals().keep(
        run_id=request.run_id,
        step=step,
        task_token=request.task_token,
        timeout_seconds=request.timeout_seconds or settings().approval_timeout_seconds,
    )
    metrics.add_metric(name="ApprovalsRequested", unit=MetricUnit.Count, value=1)
    logger.info(
        "approval requested",
        extra={"run_id": request.run_id, "step": step, "approval_id": approval_id},
    )
    return NotifyResult(approval_id=approval_id)

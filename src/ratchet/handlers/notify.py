"""The `AwaitApproval` task: open an approval request for the parked run and send it out.

The task token is a bearer credential for the execution, so it goes to the table and nowhere
else: not to the log, not to a message, not to the result. People get signed links to the
approval page (email) or buttons (Slack), which name the approval id only.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.handlers._wiring import approval_desk, logger, metrics, settings, tracer
from ratchet.handlers.payloads import NotifyRequest, NotifyResult


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = NotifyRequest.model_validate(event)
    return open_request(request).model_dump(mode="json")


def open_request(request: NotifyRequest) -> NotifyResult:
    opened = approval_desk().open(
        request.run_id,
        timeout_seconds=request.timeout_seconds or settings().approval_timeout_seconds,
        task_token=request.task_token,
    )
    approval = opened.approval
    metrics.add_metric(name="ApprovalsRequested", unit=MetricUnit.Count, value=1)
    for failure in opened.failures:
        metrics.add_metric(name="NotificationsFailed", unit=MetricUnit.Count, value=1)
        logger.error(
            "approval notification failed", extra={"run_id": approval.run_id, "error": failure}
        )
    if opened.created and not opened.notice.emails and not opened.notice.slack_channel:
        metrics.add_metric(name="ApprovalsUnaddressed", unit=MetricUnit.Count, value=1)
        logger.warning(
            "approval request sent to nobody: name `notify` on the run, or set the stack's "
            "notifyEmails / notifySlackChannel; a program can still decide it through the API",
            extra={"run_id": approval.run_id, "approval_id": approval.approval_id},
        )
    logger.info(
        "approval requested",
        extra={
            "run_id": approval.run_id,
            "step": approval.step,
            "approval_id": approval.approval_id,
            "emails": len(opened.notice.emails),
            "slack": opened.notice.slack_channel is not None,
        },
    )
    return NotifyResult(approval_id=approval.approval_id)

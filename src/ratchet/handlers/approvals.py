"""The public approval routes' Lambda function: `ratchet.web.approvals`, served with the AWS
services (the approvals kept beside each run's checkpoints, SES, Slack)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.handlers import _wiring
from ratchet.web.approvals import build_app

# --- the Lambda function ---------------------------------------------------------------------

app = build_app(lambda: _wiring.approval_services())


@_wiring.logger.inject_lambda_context(clear_state=True)
@_wiring.tracer.capture_lambda_handler(capture_response=False)
@_wiring.metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    answer = app.resolve(event, context)
    # Refusals (forged or stale links, bad Slack signatures) are what an alarm should watch.
    status = int(answer.get("statusCode", 500))
    name = "ApprovalRequestsRefused" if 400 <= status < 500 else "ApprovalRequestsServed"
    _wiring.metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)
    return answer

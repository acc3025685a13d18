"""The runs API's Lambda function: the routes of `ratchet.web.runs`, served with the AWS
services (DynamoDB, the state machine that works each run), behind IAM-signed API Gateway."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.handlers import _wiring
from ratchet.web.runs import build_app

app = build_app(_wiring.runs_services)


@_wiring.logger.inject_lambda_context(
    correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True
)
@_wiring.tracer.capture_lambda_handler(capture_response=False)
@_wiring.metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # Every invocation publishes at least this one, so a read emits no empty-metrics warning.
    _wiring.metrics.add_metric(name="ApiRequests", unit=MetricUnit.Count, value=1)
    return app.resolve(event, context)

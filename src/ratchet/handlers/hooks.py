"""The webhook route's Lambda function: `ratchet.web.hooks`, served with the AWS services (the
hook items and the mailbox in the checkpoints table, the hook key in Secrets Manager, the
nudge that wakes a parked execution).

The event is never logged, whatever `POWERTOOLS_LOGGER_LOG_EVENT` says: it holds the
delivery's signature and its payload.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.handlers import _wiring
from ratchet.web.hooks import HookServices, build_app


def _services() -> HookServices:
    """Built per delivery: the desk's engine is named after the invocation."""
    return _wiring.hook_services(app.lambda_context)


app = build_app(_services)


@_wiring.logger.inject_lambda_context(clear_state=True, log_event=False)
@_wiring.tracer.capture_lambda_handler(capture_response=False)
@_wiring.metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    answer = app.resolve(event, context)
    # Refusals (forged signatures, stale timestamps, unknown hooks) are what an alarm watches.
    status = int(answer.get("statusCode", 500))
    name = "WebhookDeliveriesRefused" if 400 <= status < 500 else "WebhookDeliveriesTaken"
    _wiring.metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)
    return answer

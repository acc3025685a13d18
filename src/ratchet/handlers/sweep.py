"""The wake sweep, run every minute by an EventBridge rule: answers the executions parked on
waits that were settled by a waker that died before answering them (`ratchet.waiting.wakes`).

The rule's event says nothing the sweep needs (it reads the marks older than its grace), so
it is not parsed beyond being an event. Throttled marks stay for the next minute; anything
else raises, and the next minute's run tries again (the rule does not retry).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict

from ratchet.handlers._wiring import engine, logger, metrics, runtime, tracer


class SweepResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    answered: int
    """Parked executions answered (a token, or a sleeper restarted)."""
    settled: int
    """Waits whose waker died before its settling write, settled here."""
    nothing_owed: int
    failed: int


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return sweep(context).model_dump(mode="json")


def sweep(context: LambdaContext) -> SweepResult:
    ratchet = engine(context)
    outcomes = runtime().wake_sweep(ratchet, logger=logger)()
    result = SweepResult(
        answered=outcomes["answered"],
        settled=outcomes["settled"],
        nothing_owed=outcomes["nothing owed"],
        failed=outcomes["failed"],
    )
    metrics.add_metric(
        name="OwedWakesAnswered", unit=MetricUnit.Count, value=result.answered + result.settled
    )
    if result.answered or result.settled or result.failed:
        logger.info("wake sweep", extra=result.model_dump())
    return result

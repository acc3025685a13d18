"""The status-events function: reads the checkpoints table's stream and puts an EventBridge
event (`Ratchet Run Status Change`) for each change of a run's status (docs/following-runs.md).

Its event source mapping filters the stream to the runs' heads and retries a failed batch (it
raises): events put before the failure come again, each with the id to deduplicate on.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import boto3
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict

from ratchet.handlers._wiring import CLIENT_CONFIG, logger, metrics, runtime, tracer


class StreamBatch(BaseModel):
    model_config = ConfigDict(frozen=True)

    Records: list[dict[str, Any]]


class StatusEventsResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    records: int
    events: int


@cache
def _events() -> Any:
    return boto3.client("events", config=CLIENT_CONFIG)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    batch = StreamBatch.model_validate(event)
    put = runtime().status_events(_events())(batch.Records)
    metrics.add_metric(name="RunStatusEvents", unit=MetricUnit.Count, value=put)
    return StatusEventsResult(records=len(batch.Records), events=put).model_dump()

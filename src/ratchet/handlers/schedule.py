"""A schedule's fire on AWS: EventBridge Scheduler invokes this function (asynchronously) at
each fire time of a `[tool.ratchet] schedules` entry, and it starts the fire's run through
the start path of `POST /runs` (`ratchet.runtime.services.aws_runs_services`).

The run id derives from the schedule's name and Scheduler's scheduled time (the time the fire
was due, not when it was delivered: `ratchet.schedules.fire_run_id`), and starting is
idempotent by run id, so a fire delivered twice (Scheduler's and Lambda's retries, or its
at-least-once delivery) creates one run and starts one execution.

A start the agent refuses (input its model refuses, a `prepare` hook that raises) is logged
and answered, not raised: a retry would be refused the same way. Anything else raises, and
Lambda's own retries of the asynchronous invocation try the same fire again, under the same id.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from ratchet.client import AgentHookFailed
from ratchet.errors import AgentNotFound, InvalidInput
from ratchet.handlers._wiring import logger, metrics, runs_services, tracer
from ratchet.runs import RunRequest
from ratchet.schedules import SCHEDULE_NAME, fire_run_id

SCHEDULED_TIME = "<aws.scheduler.scheduled-time>"
"""The context attribute Scheduler replaces, in the target's input, with the fire's time."""


class ScheduledFire(BaseModel):
    """The target's input of each schedule the stack deploys (`ratchet/cdk/schedules.py`
    writes it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schedule: str = Field(pattern=SCHEDULE_NAME.pattern)
    agent: str = Field(min_length=1, max_length=300)
    input: dict[str, JsonValue] = Field(default_factory=dict)
    scheduled_time: AwareDatetime
    """When the fire was due, as Scheduler says it (`2026-12-02T02:00:00Z`)."""


class FireStarted(BaseModel):
    run_id: str
    created: bool
    """False: the fire was delivered before, and its run exists."""
    execution_name: str | None
    refused: str | None = None
    """Why the start was refused (nothing was written); None when the run exists."""


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    fire = ScheduledFire.model_validate(event)
    return start_fire(fire, request_id=context.aws_request_id).model_dump(mode="json")


def start_fire(fire: ScheduledFire, *, request_id: str) -> FireStarted:
    run_id = fire_run_id(fire.schedule, fire.scheduled_time)
    request = RunRequest(run_id=run_id, agent=fire.agent, input=fire.input or None)
    where = {"schedule": fire.schedule, "run_id": run_id, "due": fire.scheduled_time.isoformat()}
    try:
        started = runs_services().start(request, request_id=request_id)
    except (InvalidInput, AgentNotFound, AgentHookFailed) as refused:
        metrics.add_metric(name="ScheduleFiresRefused", unit=MetricUnit.Count, value=1)
        logger.error("schedule fire refused", extra={**where, "error": str(refused)})
        return FireStarted(run_id=run_id, created=False, execution_name=None, refused=str(refused))
    metrics.add_metric(name="ScheduleFires", unit=MetricUnit.Count, value=1)
    logger.info("schedule fired", extra={**where, "run_created": started.created})
    return FireStarted(
        run_id=run_id, created=started.created, execution_name=started.execution_name
    )

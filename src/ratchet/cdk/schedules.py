"""The project's schedules on AWS: one EventBridge Scheduler schedule per `[tool.ratchet]
schedules` entry, each invoking the schedule function with the fire's time.

Scheduler assumes a role of its own that may invoke that one function and nothing else. A
delivery that fails (Lambda throttles or is unavailable) is retried by Scheduler for up to an
hour; the function's own failures by Lambda's retries of the asynchronous invocation, also
within an hour. Every retry carries the same scheduled time, so it starts the same run id.
"""

from __future__ import annotations

import json

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

from ratchet.cdk import contract
from ratchet.cdk.schedule_expressions import eventbridge_cron, eventbridge_rate
from ratchet.schedules import ScheduleSpec

RETRY_WITHIN = Duration.hours(1)
"""How long a fire is worth delivering late: after an hour it is dropped (docs/schedules.md)."""
SCHEDULER_RETRIES = 5
MAX_DESCRIPTION_CHARS = 512
FUNCTION_RETRIES = 2
"""Lambda's retries of a failed asynchronous invocation (its most)."""


def schedule_expression(spec: ScheduleSpec) -> str:
    if spec.cron is not None:
        return eventbridge_cron(spec.cron)
    return eventbridge_rate(spec.every_seconds or 0)


def target_input(spec: ScheduleSpec) -> str:
    """What the function is invoked with (`ratchet.handlers.schedule.ScheduledFire`)."""
    fire = {
        "schedule": spec.name,
        "agent": spec.agent,
        "input": spec.input,
        "scheduled_time": contract.SCHEDULED_TIME,
    }
    return json.dumps(fire, separators=(",", ":"), sort_keys=True)


class Schedules(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        specs: tuple[ScheduleSpec, ...],
        function: lambda_.Function,
    ) -> None:
        super().__init__(scope, construct_id)
        function.configure_async_invoke(retry_attempts=FUNCTION_RETRIES, max_event_age=RETRY_WITHIN)
        self.role = iam.Role(
            self,
            "SchedulerRole",
            # Only schedules of this account may assume it (the confused deputy).
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            ),
            description="EventBridge Scheduler: invokes Ratchet's schedule function, only it",
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"], resources=[function.function_arn]
            )
        )
        self.schedules = [self._schedule(spec, function) for spec in specs]

    def _schedule(self, spec: ScheduleSpec, function: lambda_.Function) -> scheduler.CfnSchedule:
        return scheduler.CfnSchedule(
            self,
            spec.name,  # unique, and the logical id's readable part
            description=f"Ratchet schedule {spec.name}: {spec.rule}, starts {spec.agent}"[
                :MAX_DESCRIPTION_CHARS
            ],
            schedule_expression=schedule_expression(spec),
            # A rate counts from when the schedule was created, whatever the zone.
            schedule_expression_timezone=spec.timezone if spec.cron is not None else None,
            flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
            state="ENABLED",
            target=scheduler.CfnSchedule.TargetProperty(
                arn=function.function_arn,
                role_arn=self.role.role_arn,
                input=target_input(spec),
                retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                    maximum_event_age_in_seconds=int(RETRY_WITHIN.to_seconds()),
                    maximum_retry_attempts=SCHEDULER_RETRIES,
                ),
            ),
        )

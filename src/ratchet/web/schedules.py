"""The schedules routes of the runs API (`build_app` in `ratchet.web.runs` registers them):

    GET    /schedules                 the store's schedules, by name
    POST   /schedules                 {"name", "agent", "cron" | "every", "input"?, "timezone"?}
    POST   /schedules/{name}/pause    its fires are skipped until it is resumed
    POST   /schedules/{name}/resume   it fires next at its first time from now
    DELETE /schedules/{name}          the runs it started stay

Each goes through the client's schedule methods, as `ratchet schedule` does, and refuses what
the CLI refuses, naming the field: 400 for a schedule that cannot fire (a cron expression that
does not parse, an interval under a minute, an unknown zone, an agent or input the start would
refuse), 409 for a name taken, 404 for a name unknown. On AWS the store keeps no schedules:
they are declared in the project's `[tool.ratchet] schedules` and deployed with the stack
(docs/schedules.md), and every route answers 404 saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from ratchet.client import AnswerModel
from ratchet.errors import ScheduleExists, ScheduleInvalid, ScheduleNotFound, SchedulesNotKept
from ratchet.schedules import SCHEDULE_NAME, Schedule
from ratchet.web.routes import (
    Problem,
    RunsServices,
    count_metric,
    openapi_responses,
    refuse,
    require_json,
)

SCHEDULES_ON_AWS = (
    "schedules on AWS are declared in the project's [tool.ratchet] schedules and deployed "
    "with the stack (docs/schedules.md)"
)

_SAID = {
    "cron": "not a five-field cron expression (minute hour day-of-month month day-of-week), "
    "or given with every",
    "every": "not an interval from a minute to 366 days (15m, 2h, 1d)",
    "timezone": "not an IANA time zone name (Europe/Berlin, UTC)",
}
"""What a refusal says of each field, in words of its own: the client's quote what was sent."""


class AddSchedule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=SCHEDULE_NAME.pattern,
        description="1-63 lowercase letters, digits and '-', starting with a letter or digit; "
        "each fire's run is named after it and the fire time (`<name>-20261202T020000Z`).",
    )
    agent: str = Field(
        min_length=1,
        max_length=300,
        description="An agent this server may start, as POST /runs takes it.",
    )
    cron: str | None = Field(
        default=None,
        max_length=200,
        description="Five-field cron: minute hour day-of-month month day-of-week ('0 2 * * *').",
    )
    every: str | None = Field(
        default=None,
        max_length=20,
        description="Or an interval: 15m, 2h, 1d, 90s (a minute at least).",
    )
    input: dict[str, JsonValue] | None = Field(
        default=None, description="The input of every run it starts."
    )
    timezone: str = Field(
        default="UTC", max_length=64, description="The zone `cron` reads the clock of (IANA)."
    )


class ScheduleView(AnswerModel):
    name: str
    agent: str
    rule: str
    """In words: `cron 0 2 * * * (Europe/Berlin)`, `every 15m`."""
    cron: str | None
    every_seconds: int | None
    timezone: str
    input: dict[str, JsonValue]
    paused: bool
    next_fire: datetime
    """When it fires next (UTC)."""
    last_run: str | None
    """The run its last fire started."""

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleView:
        spec = schedule.spec
        return cls(
            name=spec.name,
            agent=spec.agent,
            rule=spec.rule,
            cron=spec.cron,
            every_seconds=spec.every_seconds,
            timezone=spec.timezone,
            input=spec.input,
            paused=schedule.paused,
            next_fire=schedule.next_fire,
            last_run=schedule.last_run,
        )


class ScheduleList(AnswerModel):
    schedules: list[ScheduleView]


class ScheduleRemoved(AnswerModel):
    name: str


ScheduleName = Annotated[
    str,
    Path(
        pattern=SCHEDULE_NAME.pattern,
        description="1-63 lowercase letters, digits and '-', starting with a letter or digit",
    ),
]


class ScheduleRoutes:
    def __init__(self, app: APIGatewayRestResolver, services: Callable[[], RunsServices]) -> None:
        self.app = app
        self.services = services

    def list_schedules(self) -> ScheduleList:
        schedules = self.services().client.schedules()
        return ScheduleList(schedules=[ScheduleView.of(s) for s in schedules])

    def add_schedule(self, body: Annotated[AddSchedule, Body()]) -> Response[ScheduleView]:
        require_json(self.app)
        wired = self.services()
        schedule = wired.client.schedule_add(
            body.name,
            agent=body.agent,
            cron=body.cron,
            every=body.every,
            input=body.input,
            timezone=body.timezone,
        )
        count_metric(wired, "SchedulesAdded")
        wired.logger.info("schedule added", extra={"schedule": body.name})
        return Response(
            status_code=HTTPStatus.CREATED,
            content_type=content_types.APPLICATION_JSON,
            body=ScheduleView.of(schedule),
        )

    def pause_schedule(self, name: ScheduleName) -> ScheduleView:
        return self._pause(name, pause=True)

    def resume_schedule(self, name: ScheduleName) -> ScheduleView:
        return self._pause(name, pause=False)

    def remove_schedule(self, name: ScheduleName) -> ScheduleRemoved:
        wired = self.services()
        wired.client.schedule_remove(name)
        count_metric(wired, "SchedulesRemoved")
        wired.logger.info("schedule removed", extra={"schedule": name})
        return ScheduleRemoved(name=name)

    def _pause(self, name: str, *, pause: bool) -> ScheduleView:
        require_json(self.app)
        wired = self.services()
        schedule = wired.client.schedule_pause(name, pause=pause)
        wired.logger.info(
            "schedule paused" if pause else "schedule resumed", extra={"schedule": name}
        )
        return ScheduleView.of(schedule)


class ScheduleRefusals:
    def __init__(self, services: Callable[[], RunsServices]) -> None:
        self.services = services

    def invalid(self, error: ScheduleInvalid) -> Response[str]:
        if isinstance(error, ScheduleExists):
            status, said = HTTPStatus.CONFLICT, "a schedule of this name exists: remove it first"
        elif isinstance(error, ScheduleNotFound):
            status, said = HTTPStatus.NOT_FOUND, "no schedule has this name"
        else:
            status, said = HTTPStatus.BAD_REQUEST, _SAID.get(error.field, error.reason)
        return refuse(self.services(), status, said, [Problem(field=error.field, message=said)])

    def not_kept(self, error: SchedulesNotKept) -> Response[str]:
        problem = Problem(field="(path)", message=SCHEDULES_ON_AWS)
        return refuse(
            self.services(), HTTPStatus.NOT_FOUND, "this store keeps no schedules", [problem]
        )


def register(app: APIGatewayRestResolver, services: Callable[[], RunsServices]) -> None:
    """Add the schedules routes, and how their refusals are answered, to the runs API."""
    routes = ScheduleRoutes(app, services)
    app.get(
        "/schedules",
        responses=openapi_responses(200, 404),
        summary="List schedules",
        operation_id="listSchedules",
    )(routes.list_schedules)
    app.post(
        "/schedules",
        responses=openapi_responses(201, 400, 404, 409, 413, 415),
        summary="Add a schedule",
        operation_id="addSchedule",
    )(routes.add_schedule)
    app.post(
        "/schedules/<name>/pause",
        responses=openapi_responses(200, 400, 404, 415),
        summary="Pause a schedule",
        operation_id="pauseSchedule",
    )(routes.pause_schedule)
    app.post(
        "/schedules/<name>/resume",
        responses=openapi_responses(200, 400, 404, 415),
        summary="Resume a paused schedule",
        operation_id="resumeSchedule",
    )(routes.resume_schedule)
    app.delete(
        "/schedules/<name>",
        responses=openapi_responses(200, 400, 404),
        summary="Remove a schedule",
        operation_id="removeSchedule",
    )(routes.remove_schedule)
    answers = ScheduleRefusals(services)
    app.exception_handler(ScheduleInvalid)(answers.invalid)
    app.exception_handler(SchedulesNotKept)(answers.not_kept)

"""What the runs API's route modules share: `ratchet.web.runs` and `ratchet.web.schedules`,
whose routes `runs.build_app` registers. The services they work through, the refusal a route
raises and the envelope every refusal is answered in (`{"error", "problems"}`), the JSON a POST
must say it sends, and how a route documents its answers. Here, a floor under both, so that
`schedules` needs nothing of `runs` (the `web-routes-floors` contract).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.metrics import MetricUnit

from ratchet.approvals.desk import ApprovalDesk
from ratchet.client import AnswerModel, Client, Started
from ratchet.runs import RunRequest
from ratchet.state import RunStatus

# --- the answers every route may give ----------------------------------------------------------


class Problem(AnswerModel):
    field: str
    """The field at fault: a body field (`max_steps`, `notify.email.0`), a path or query
    parameter (`run_id`, `limit`), or `(body)` when the body as a whole is."""
    message: str


class RequestRefused(AnswerModel):
    error: str
    problems: list[Problem]
    """Which fields are wrong, and how; empty when nothing the caller sent is at fault."""


class RunStarted(AnswerModel):
    run_id: str
    status: RunStatus
    step: int
    execution_name: str | None
    """The Step Functions execution working the run (AWS); none locally, where a worker
    picks the run up."""
    created: bool
    """False when the run existed already: the request changed nothing about it."""

    @classmethod
    def of(cls, started: Started, *, execution_name: str | None) -> RunStarted:
        run = started.run
        return cls(
            run_id=run.run_id,
            status=run.status,
            step=run.step,
            execution_name=execution_name,
            created=started.created,
        )


# --- what the routes need from a runtime ---------------------------------------------------------


class StartRun(Protocol):
    def __call__(self, request: RunRequest, *, request_id: str) -> RunStarted:
        """Validate the request for this runtime (`new_run`), create the run if it is new and
        set it going; raise `RunRequestInvalid` and change nothing if it is refused."""
        ...


@dataclass(frozen=True)
class RunsServices:
    """What the routes use. The same app serves AWS and the local runtime; these differ."""

    client: Client
    """Reads runs (and starts them, through `start`) on the runtime's store."""
    desk: Callable[[], ApprovalDesk]
    """Built when a decision needs it, so that reading runs needs no approval settings."""
    start: StartRun
    logger: Any
    metrics: Any = None
    """Powertools metrics (AWS, flushed by the handler); none locally."""
    anonymous_caller: str | None = None
    """Who decides when a request carries no IAM identity: locally, whoever runs `ratchet
    serve` (it listens on localhost, unsigned). None: such a request is refused (403)."""
    launch: Callable[[str], str | None] = lambda run_id: None
    """Sets a run just retried or forked going: on AWS starts its execution and returns its
    name; locally nothing (None): the next free worker takes it."""
    holds_long_polls: bool = True
    """Whether the history route holds a long poll (`wait`) itself: on AWS it does; `ratchet
    serve` holds it before the app sees it, on the connection's own thread
    (`ratchet.web.feed.HistoryWaits`), so that its app's one thread never waits."""


def count_metric(services: RunsServices, name: str) -> None:
    if services.metrics is not None:
        services.metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)


def refuse(
    services: RunsServices, status: int, error: str, problems: Sequence[Problem]
) -> Response[str]:
    """The JSON answer to a refused request, counted (4xx) and logged with the fields named."""
    if status < HTTPStatus.INTERNAL_SERVER_ERROR:
        count_metric(services, "RequestsRefused")
    services.logger.info(
        "request refused",
        extra={"status": int(status), "error": error, "fields": [p.field for p in problems]},
    )
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=RequestRefused(error=error, problems=list(problems)).model_dump_json(),
    )


class Refusal(Exception):
    """A request a route refuses, naming the field at fault (`RunsRefusals.refused` answers
    it)."""

    def __init__(self, status: int, error: str, field: str, message: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.problems = [Problem(field=field, message=message)]


def require_json(app: APIGatewayRestResolver) -> None:
    """Every POST says it sends JSON, even with no body. A web page can make a browser send a
    form or a bodiless POST anywhere without asking first (CORS lets "simple" requests
    through), but not one that claims to be JSON: so no page can start or decide a run
    through `ratchet serve`, which listens on localhost unsigned."""
    content_type = app.current_event.headers.get("content-type") or ""
    if content_type.split(";")[0].strip().lower() != content_types.APPLICATION_JSON:
        raise Refusal(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            "the body must be JSON",
            "Content-Type",
            "use application/json",
        )


def openapi_responses(*codes: int) -> dict[int, OpenAPIResponse]:
    """The OpenAPI responses of a route: its model for 2xx, `RequestRefused` for the rest."""
    described: dict[int, OpenAPIResponse] = {}
    for code in (*codes, HTTPStatus.INTERNAL_SERVER_ERROR):
        if code < HTTPStatus.BAD_REQUEST:
            described[code] = {"description": HTTPStatus(code).phrase}
        else:
            described[code] = {
                "description": HTTPStatus(code).phrase,
                "content": {"application/json": {"model": RequestRefused}},
            }
    return described

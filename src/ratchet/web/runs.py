"""The runs API for programs (API Gateway REST, proxy integration, IAM-signed).

    POST /runs                               start a run: 201 created, 200 it existed
    GET  /runs?status=&limit=&after=         recent runs first, a page at a time (`next`)
    GET  /runs/{run_id}                      where a run stands
    GET  /runs/{run_id}/history?after=&wait= one row per checkpoint; with `wait`, held until
                                             there is one after `after` (a long poll)
    GET  /runs/{run_id}/checkpoints/{step}   the run's state as of that step's last checkpoint
    POST /runs/{run_id}/approve              {"comment"?}: decide what the run waits for
    POST /runs/{run_id}/reject               {"reason"?}
    POST /runs/{run_id}/retry                a failed run: fresh attempts at the failed step
    POST /runs/{run_id}/cancel               {"reason"?}: a running or waiting run ends cancelled
    POST /runs/{run_id}/fork                 {"from_step", "run_id"?}: a new run from a step
    POST /runs/{run_id}/events/{name}        {"data"?, "event_id"?}: send the run an event
    POST /runs/{run_id}/wake                 {"by"?}: wake a sleeping run now
    POST /runs/{run_id}/hooks/{name}         the run's webhook for an event: URL and secret
    GET  /runs/{run_id}/steps/{step}/prompt  the prompt the step's model saw, from the records
    GET, POST /schedules; POST /schedules/{name}/pause|resume; DELETE /schedules/{name}
                                             a local store's schedules (`ratchet.web.schedules`)

Starting is idempotent by run id, end to end: the run is created only if it does not exist, and
on AWS the execution's name derives from the run id, so a retried request (say, after a
timeout between the two writes) starts whatever is missing and answers 200 with the run as it
stands. The caller who decides is the request's IAM identity, never a field of the body.

Sending an event is idempotent by its `event_id`: a retry answers what the first send did
(`duplicate` set), and the event is delivered at most once: 200 when it settled the run's wait,
202 when it is kept in the run's mailbox until a wait for its name takes it. Opening a hook is
idempotent too: the same run and name always answer the same URL and secret (docs/webhooks.md),
which only this signed route shows; no route lists hooks.

Following a run: `GET /runs/{id}/history?after=<version>&wait=<seconds>` answers at once when
the run has written something after `after` (or has ended); otherwise it holds the request,
reading the run's records once a second (`HISTORY_POLL_SECONDS`), until it has, or `wait`
seconds (at most `MAX_HISTORY_WAIT_SECONDS`) have passed, then answers what there is: a
client learns of a commit within a second or so, with one request per `wait` seconds while
nothing happens. (`ratchet serve` also serves the run's feed as Server-Sent Events,
`GET /runs/{id}/feed`: `ratchet.web.feed`.)

Every refusal is JSON, `{"error": ..., "problems": [{"field": ..., "message": ...}]}`, naming
the fields at fault and never quoting what was sent. A body over 1 MiB (413) or nested more
than 64 levels deep (400, naming the top-level field) is refused before it is parsed.
Powertools validates bodies, paths and queries against the models below, and the same routes
generate the OpenAPI document
(`docs/openapi.json`: `python -m ratchet.web.runs --openapi > docs/openapi.json`).

`build_app(services)` makes the app; the Lambda function (`ratchet.handlers.api`) serves it
with the AWS services and `ratchet serve` with a local runtime's
(`ratchet.runtime.services.local_runs_services`). Nothing here needs boto3: the base install
serves it locally.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http import HTTPStatus
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.models import APIKey, APIKeyIn
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from ratchet.client import (
    MAX_PAGE_RUNS,
    AnswerModel,
    Checkpoint,
    CheckpointsExpired,
    EventSent,
    HookOpened,
    NoCheckpointAtStep,
    Run,
    RunListed,
)
from ratchet.errors import (
    AgentNotFound,
    AnswerInvalid,
    ApprovalClosed,
    ApprovalError,
    ApprovalExpired,
    ApprovalNotFound,
    EventNotAwaited,
    ForkRefused,
    InvalidInput,
    JsonOverLimit,
    JsonTooLarge,
    MailboxFull,
    NotCancellable,
    NotRetryable,
    NotSleeping,
    PayloadTooLarge,
    RunEnded,
    RunNotFound,
    RunUnreadable,
    StoreBusy,
    StoreDamaged,
    StoreUnavailable,
    UnsupportedSchema,
    WaitError,
)
from ratchet.feed import hold_until_written
from ratchet.runs import MAX_STEPS, RunRequest, RunRequestInvalid
from ratchet.state import (
    EVENT_NAME_PATTERN,
    RUN_ID_PATTERN,
    ConcurrencyKey,
    RunState,
    RunStatus,
)
from ratchet.untrusted import loads
from ratchet.waiting.desk import EventInvalid
from ratchet.waiting.hooks import WebhooksNotTaken
from ratchet.waits import EVENT_ID_PATTERN, MAX_BY_CHARS, MAX_COMMENT_CHARS, Verdict
from ratchet.web import schedules
from ratchet.web.routes import (
    Problem,
    Refusal,
    RunsServices,
    RunStarted,
    count_metric,
    openapi_responses,
    refuse,
    require_json,
)

OPENAPI_TITLE = "Ratchet runs API"
OPENAPI_VERSION = "1"
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = MAX_PAGE_RUNS
MAX_HISTORY_WAIT_SECONDS = 20
"""The longest long poll (`wait`): API Gateway ends an integration after 29 s, and the api
function's timeout is 29 s; a cold start (a few seconds) and the final read fit in the rest."""
HISTORY_POLL_SECONDS = 1.0
"""How often a long poll reads the run's records: one strongly consistent Query of the run's
partition after `after` (one read unit while nothing is new)."""
HISTORY_MARGIN_SECONDS = 4.0
"""What a long poll leaves of the function's time for answering (and a read under way)."""
MAX_BODY_CHARS = 1024 * 1024
"""The longest request body taken: a run's goal (64 KB, each character possibly a six-character
JSON escape) and input (16 KB) with room to spare."""

# --- the API's models --------------------------------------------------------------------------


class RunList(AnswerModel):
    runs: list[RunListed]
    """Most recently updated first."""
    next: str | None = None
    """More runs follow: ask for them with `after=<next>`."""


# Where a run stands: the Python API's `Run`, under the name the OpenAPI document gives it.
# (No docstring: it would become the schema's description, which the document has none of.)
class RunView(Run):
    @classmethod
    def of_run(cls, run: Run) -> RunView:
        return cls.model_validate(run.model_dump())


class RunHistory(AnswerModel):
    run_id: str
    checkpoints: list[Checkpoint]
    """What `ratchet history --json` lists: each write in words, the tool call and its
    result preview, who decided, the attempt, the tokens."""


class Approve(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    comment: str = Field(default="", max_length=MAX_COMMENT_CHARS)
    answer: dict[str, Any] | None = Field(
        default=None,
        description="The answer, for a run that asked a structured question "
        "(ask_person(answer=...)): checked against the question's schema.",
    )


class Reject(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str = Field(default="", max_length=MAX_COMMENT_CHARS)


class Decided(AnswerModel):
    run_id: str
    step: int
    """The step whose request was decided."""
    decision: Literal["approved", "rejected"]
    by: str
    comment: str
    run_status: RunStatus
    """Where the run stood when the decision was delivered: it resumes on its own (on AWS
    the execution goes on; locally the next free worker takes it)."""


class Cancel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str = Field(default="", max_length=MAX_COMMENT_CHARS)


class Fork(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    from_step: int = Field(ge=0, le=MAX_STEPS)
    """The source's step whose state the fork starts from."""
    run_id: str | None = Field(default=None, pattern=RUN_ID_PATTERN.pattern)
    """The fork's id (default: `<source>-fork-<random>`)."""


class SendEvent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    data: JsonValue = Field(
        default=None,
        description="The event's payload, any JSON value (at most 256 KiB as JSON): checked "
        "against the waiting step's schema, if it has one.",
    )
    event_id: str | None = Field(
        default=None,
        pattern=EVENT_ID_PATTERN,
        description="The event's id, to send it again safely (a retry is taken once and "
        "answered the same); default: a new id.",
    )


class Wake(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    by: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_BY_CHARS // 2,
        description="Who wakes the run, for the record, beside the request's IAM identity.",
    )


class RunSetGoing(AnswerModel):
    """A run retried or forked: where it stands, and what works it now."""

    run_id: str
    status: RunStatus
    step: int
    execution_name: str | None
    """The Step Functions execution started for it (AWS); none locally, where the next
    free worker takes it."""


class StepPrompt(AnswerModel):
    run_id: str
    step: int
    prompt: str
    """Byte for byte what the step's model was asked, rendered from the recorded state."""


RunId = Annotated[
    str,
    Path(
        pattern=RUN_ID_PATTERN.pattern,
        description="1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit",
    ),
]
EventName = Annotated[
    str,
    Path(
        pattern=EVENT_NAME_PATTERN,
        description="1-64 letters, digits, '.', '_', ':' or '-', starting with a letter or digit",
    ),
]


def build_app(services: Callable[[], RunsServices]) -> APIGatewayRestResolver:
    """The runs API: each route below, then how each refusal is answered."""
    # A body is bounded in length and nesting before it is parsed: `json` recurses, and a
    # body nested 60,000 levels deep would end in a RecursionError (a 500).
    app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=_bounded_body)
    routes = RunsRoutes(app, services)
    app.post(
        "/runs",
        responses=openapi_responses(200, 201, 400, 409, 413, 415),
        summary="Start a run",
        operation_id="startRun",
    )(routes.start_run)
    app.get(
        "/runs",
        responses=openapi_responses(200, 400),
        summary="List runs, recent first",
        operation_id="listRuns",
    )(routes.list_runs)
    app.get(
        "/runs/<run_id>",
        responses=openapi_responses(200, 400, 404),
        summary="Where a run stands",
        operation_id="getRun",
    )(routes.get_run)
    app.get(
        "/runs/<run_id>/history",
        responses=openapi_responses(200, 400, 404),
        summary="One row per checkpoint",
        operation_id="getRunHistory",
    )(routes.get_history)
    app.get(
        "/runs/<run_id>/checkpoints/<step>",
        responses=openapi_responses(200, 400, 404, 410),
        summary="The run's state as of a step",
        operation_id="getRunCheckpoint",
    )(routes.get_checkpoint)
    app.post(
        "/runs/<run_id>/approve",
        responses=openapi_responses(200, 400, 403, 404, 409, 410, 413, 415),
        summary="Approve what a run waits for",
        operation_id="approveRun",
    )(routes.approve)
    app.post(
        "/runs/<run_id>/reject",
        responses=openapi_responses(200, 400, 403, 404, 409, 410, 413, 415),
        summary="Reject what a run waits for",
        operation_id="rejectRun",
    )(routes.reject)
    app.post(
        "/runs/<run_id>/retry",
        responses=openapi_responses(200, 400, 403, 404, 409, 415),
        summary="Retry a failed run",
        operation_id="retryRun",
    )(routes.retry)
    app.post(
        "/runs/<run_id>/cancel",
        responses=openapi_responses(200, 400, 403, 404, 409, 413, 415),
        summary="Cancel a running or waiting run",
        operation_id="cancelRun",
    )(routes.cancel)
    app.post(
        "/runs/<run_id>/fork",
        responses=openapi_responses(201, 400, 403, 404, 409, 410, 413, 415),
        summary="Fork a run from one of its steps",
        operation_id="forkRun",
    )(routes.fork)
    app.post(
        "/runs/<run_id>/events/<name>",
        responses=openapi_responses(200, 202, 400, 404, 409, 413, 415, 422, 429),
        summary="Send a run an event",
        operation_id="sendEvent",
    )(routes.send_event)
    app.post(
        "/runs/<run_id>/wake",
        responses=openapi_responses(200, 400, 403, 404, 409, 413, 415),
        summary="Wake a sleeping run",
        operation_id="wakeRun",
    )(routes.wake)
    app.post(
        "/runs/<run_id>/hooks/<name>",
        responses=openapi_responses(200, 400, 403, 404, 409, 415),
        summary="Open a run's webhook for an event",
        operation_id="openHook",
    )(routes.open_hook)
    app.get(
        "/runs/<run_id>/steps/<step>/prompt",
        responses=openapi_responses(200, 400, 404, 410),
        summary="The prompt a step's model saw",
        operation_id="getStepPrompt",
    )(routes.get_step_prompt)

    refusals = RunsRefusals(app, services)
    schedules.register(app, services)
    app.exception_handler(RequestValidationError)(refusals.invalid_request)
    app.exception_handler(RequestUnsupportedContentType)(refusals.not_json)
    app.exception_handler(RunRequestInvalid)(refusals.invalid_run)
    app.exception_handler(JsonOverLimit)(refusals.unbounded_body)
    app.exception_handler(InvalidInput)(refusals.invalid_input)
    app.exception_handler(EventInvalid)(refusals.event_invalid)
    app.exception_handler(WaitError)(refusals.not_taken)
    app.exception_handler(AgentNotFound)(refusals.broken_agent)
    app.exception_handler([NotRetryable, NotCancellable])(refusals.wrong_status)
    app.exception_handler(RunNotFound)(refusals.no_run)
    app.exception_handler(ApprovalError)(refusals.not_decided)
    app.exception_handler(AnswerInvalid)(refusals.answer_invalid)
    app.not_found(refusals.no_route)
    app.exception_handler(Refusal)(refusals.refused)
    app.exception_handler([RunUnreadable, UnsupportedSchema])(refusals.unreadable)
    app.exception_handler(StoreDamaged)(refusals.damaged)
    app.exception_handler([StoreBusy, StoreUnavailable])(refusals.busy)
    return app


class RunsRoutes:
    """The runs API's routes: each reads the request from `app` and works through the
    runtime's services (`build_app` registers them)."""

    def __init__(self, app: APIGatewayRestResolver, services: Callable[[], RunsServices]) -> None:
        self.app = app
        self.services = services

    def start_run(self, request: Annotated[RunRequest, Body()]) -> Response[RunStarted]:
        require_json(self.app)
        started = self.services().start(request, request_id=self.app.lambda_context.aws_request_id)
        return Response(
            status_code=HTTPStatus.CREATED if started.created else HTTPStatus.OK,
            content_type=content_types.APPLICATION_JSON,
            body=started,
        )

    def list_runs(
        self,
        status: Annotated[RunStatus | None, Query(description="Only runs in this status")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = DEFAULT_LIST_LIMIT,
        after: Annotated[
            str | None,
            Query(
                max_length=512,
                description="The `next` of the page before: the runs changed before its last",
            ),
        ] = None,
        key: Annotated[
            ConcurrencyKey | None,
            Query(description="Only the runs started with this concurrency_key (reads every run)"),
        ] = None,
    ) -> RunList:
        # A page from the store's index of runs (on DynamoDB a Query, not a Scan); by key,
        # from every run (the index does not keep a run's key).
        try:
            page = self.services().client.runs_page(
                status=status, limit=limit, after=after, key=key
            )
        except InvalidInput:
            raise Refusal(
                HTTPStatus.BAD_REQUEST,
                "not a page token",
                "after",
                "use the next of a page of runs",
            ) from None
        return RunList(runs=page.runs, next=page.next)

    def get_run(self, run_id: RunId) -> RunView:
        return RunView.of(self.services().client.head(run_id))

    def get_history(
        self,
        run_id: RunId,
        after: Annotated[
            int,
            Query(
                ge=0,
                description="Only the checkpoints of a later version: to follow a run, the "
                "last version read",
            ),
        ] = 0,
        wait: Annotated[
            int,
            Query(
                ge=0,
                le=MAX_HISTORY_WAIT_SECONDS,
                description="A long poll: if nothing is there after `after`, hold the "
                "request up to this many seconds until something is (or the run has ended)",
            ),
        ] = 0,
    ) -> RunHistory:
        wired = self.services()
        checkpoints = wired.client.history(run_id, after=after)
        if not checkpoints and wait and wired.holds_long_polls:
            hold_until_written(
                wired.client.runtime.store,
                run_id,
                after=after,
                seconds=min(wait, self._seconds_left() - HISTORY_MARGIN_SECONDS),
                poll=HISTORY_POLL_SECONDS,
            )
            checkpoints = wired.client.history(run_id, after=after)
        return RunHistory(run_id=run_id, checkpoints=checkpoints)

    def _seconds_left(self) -> float:
        """The time the function has left (Lambda's context says; `ratchet serve`'s has no
        limit)."""
        left = getattr(self.app.lambda_context, "get_remaining_time_in_millis", None)
        return left() / 1000 if left is not None else float(MAX_HISTORY_WAIT_SECONDS * 2)

    def get_checkpoint(self, run_id: RunId, step: Annotated[int, Path(ge=0)]) -> RunState:
        with _rebuilding("step", "the state as of this step"):
            return self.services().client.state_at(run_id, step=step)

    def approve(self, run_id: RunId, body: Annotated[Approve | None, Body()] = None) -> Decided:
        return self._decide(
            run_id,
            approved=True,
            comment=body.comment if body else "",
            answer=body.answer if body else None,
        )

    def reject(self, run_id: RunId, body: Annotated[Reject | None, Body()] = None) -> Decided:
        return self._decide(run_id, approved=False, comment=body.reason if body else "")

    def _decide(
        self, run_id: str, *, approved: bool, comment: str, answer: dict[str, Any] | None = None
    ) -> Decided:
        require_json(self.app)
        wired = self.services()
        by = _caller(self.app, wired)
        verdict = Verdict(approved=approved, by=by, comment=comment, answer=answer)
        view = wired.desk().decide_run(run_id, verdict, channel="api")
        run = view.run
        count_metric(wired, "DecidedThroughApi")
        wired.logger.info(
            "decided through the API",
            extra={"run_id": run_id, "step": view.approval.step, "approved": approved},
        )
        return Decided(
            run_id=run_id,
            step=view.approval.step,
            decision="approved" if approved else "rejected",
            by=verdict.by,
            comment=verdict.comment,
            run_status=run.status if run else RunStatus.WAITING,
        )

    def retry(self, run_id: RunId) -> RunSetGoing:
        require_json(self.app)
        wired = self.services()
        run = wired.client.retry(run_id, by=_caller(self.app, wired))
        execution = wired.launch(run_id)
        count_metric(wired, "RunsRetried")
        wired.logger.info("run retried", extra={"run_id": run_id, "execution": execution})
        return RunSetGoing(
            run_id=run_id, status=run.status, step=run.step, execution_name=execution
        )

    def cancel(self, run_id: RunId, body: Annotated[Cancel | None, Body()] = None) -> RunView:
        require_json(self.app)
        wired = self.services()
        reason = body.reason if body else ""
        cancelled = wired.client.cancel(run_id, reason=reason, by=_caller(self.app, wired))
        count_metric(wired, "RunsCancelled")
        wired.logger.info("run cancelled", extra={"run_id": run_id})
        return RunView.of_run(cancelled)

    def fork(self, run_id: RunId, body: Annotated[Fork, Body()]) -> Response[RunSetGoing]:
        require_json(self.app)
        wired = self.services()
        source = wired.client.get(run_id)
        if body.from_step > source.step:
            raise Refusal(
                HTTPStatus.BAD_REQUEST,
                "the run has not reached this step",
                "from_step",
                "at most the source's completed steps",
            )
        if body.run_id is not None and wired.client.runtime.store.load_head(body.run_id):
            raise Refusal(HTTPStatus.CONFLICT, "a run has this id", "run_id", "choose another")
        with _rebuilding("from_step", "the state as of this step"):
            try:
                run = wired.client.fork(run_id, from_step=body.from_step, run_id=body.run_id)
            except ForkRefused as refused:
                # The agent's own reason (`Agent.fork`): it cannot give the fork its data.
                raise Refusal(
                    HTTPStatus.CONFLICT, "the agent refuses this fork", "from_step", str(refused)
                ) from None
        execution = wired.launch(run.run_id)
        count_metric(wired, "RunsForked")
        wired.logger.info(
            "run forked",
            extra={"run_id": run.run_id, "source": run_id, "from_step": body.from_step},
        )
        return Response(
            status_code=HTTPStatus.CREATED,
            content_type=content_types.APPLICATION_JSON,
            body=RunSetGoing(
                run_id=run.run_id, status=run.status, step=run.step, execution_name=execution
            ),
        )

    def send_event(
        self, run_id: RunId, name: EventName, body: Annotated[SendEvent | None, Body()] = None
    ) -> Response[EventSent]:
        require_json(self.app)
        wired = self.services()
        given = body or SendEvent()
        sent = wired.client.send_event(run_id, name, given.data, event_id=given.event_id)
        count_metric(wired, "DuplicateEvents" if sent.duplicate else "EventsSent")
        queued = sent.status == "queued"
        return Response(
            status_code=HTTPStatus.ACCEPTED if queued else HTTPStatus.OK,
            content_type=content_types.APPLICATION_JSON,
            body=sent,
        )

    def wake(self, run_id: RunId, body: Annotated[Wake | None, Body()] = None) -> RunView:
        require_json(self.app)
        wired = self.services()
        caller = _caller(self.app, wired)
        # The signed identity is always on record; a name given in the body goes beside it.
        by = caller if body is None or body.by is None else f"{body.by} (via {caller})"
        woken = wired.client.wake(run_id, by=by[:MAX_BY_CHARS])
        count_metric(wired, "RunsWoken")
        wired.logger.info("run woken", extra={"run_id": run_id, "step": woken.step})
        return RunView.of_run(woken)

    def open_hook(self, run_id: RunId, name: EventName) -> HookOpened:
        require_json(self.app)
        wired = self.services()
        opened = wired.client.hook(run_id, name)
        count_metric(wired, "HooksOpened")
        return opened

    def get_step_prompt(self, run_id: RunId, step: Annotated[int, Path(ge=1)]) -> StepPrompt:
        with _rebuilding("step", "the prompt"):
            prompt = self.services().client.replay(run_id, step=step)
        return StepPrompt(run_id=run_id, step=step, prompt=prompt)


class RunsRefusals:
    """How the runs API answers what it refuses: JSON naming the field, never quoting the
    input (`build_app` registers each for the errors it names)."""

    def __init__(self, app: APIGatewayRestResolver, services: Callable[[], RunsServices]) -> None:
        self.app = app
        self.services = services

    def refuse(self, status: int, error: str, problems: Sequence[Problem]) -> Response[str]:
        return refuse(self.services(), status, error, problems)

    def invalid_request(self, error: RequestValidationError) -> Response[str]:
        if any(_where(e) == "response" for e in error.errors()):
            # Powertools checks answers against their models too: a mismatch is ours.
            fields = [_problem(e).field for e in error.errors()]
            self.services().logger.error(
                "answer does not match its model", extra={"fields": fields}
            )
            return self.refuse(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error", [])
        if any(_is_body(e) for e in error.errors()):
            # Validation runs before the route: a body that is not JSON (a form, say) was
            # parsed as something else, and its "fields" would quote what was sent.
            try:
                require_json(self.app)
            except Refusal as not_json:
                return self.refuse(not_json.status, not_json.error, not_json.problems)
        problems = [_problem(e) for e in error.errors()]
        where = "request body" if all(_is_body(e) for e in error.errors()) else "request"
        return self.refuse(HTTPStatus.BAD_REQUEST, f"invalid {where}", problems)

    def not_json(self, error: RequestUnsupportedContentType) -> Response[str]:
        problem = Problem(field="Content-Type", message="use application/json")
        return self.refuse(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "the body must be JSON", [problem])

    def invalid_run(self, error: RunRequestInvalid) -> Response[str]:
        problems = [Problem(field=f, message=error.message) for f in error.fields]
        status = HTTPStatus(getattr(error, "http_status", HTTPStatus.BAD_REQUEST))
        return self.refuse(status, str(error), problems)

    def unbounded_body(self, error: JsonOverLimit) -> Response[str]:
        if isinstance(error, JsonTooLarge):
            status, said = HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "the body is too large"
        else:
            status, said = HTTPStatus.BAD_REQUEST, "the body is nested too deep"
        return self.refuse(status, said, [Problem(field=error.field, message=error.reason)])

    def invalid_input(self, error: InvalidInput) -> Response[str]:
        # Not a request check (those raise RunRequestInvalid): its words may quote input.
        self.services().logger.warning("invalid input", extra={"error": str(error)})
        return self.refuse(HTTPStatus.BAD_REQUEST, "invalid request", [])

    def event_invalid(self, error: EventInvalid) -> Response[str]:
        # "data.conclusion: 'maybe' is not one of ..." (the wait's schema refused it): the
        # field is named, the words are not repeated, since they quote what was sent.
        problem = Problem(field=error.field, message="does not match the waiting step's schema")
        return self.refuse(error.http_status, "the wait's schema refuses the payload", [problem])

    def not_taken(self, error: WaitError) -> Response[str]:
        field, message = _WAIT_PROBLEMS.get(type(error), ("run_id", "cannot be taken now"))
        if isinstance(error, PayloadTooLarge):
            message = str(error).removeprefix("data: ")  # sizes only: nothing sent is quoted
        return self.refuse(error.http_status, message, [Problem(field=field, message=message)])

    def broken_agent(self, error: AgentNotFound) -> Response[str]:
        # The name was registered, so the deployment is at fault, not the caller.
        self.services().logger.error(
            "registered agent cannot be loaded", extra={"error": str(error)}
        )
        return self.refuse(
            HTTPStatus.INTERNAL_SERVER_ERROR,
            "the agent is registered but cannot be loaded; the deployment must be fixed",
            [],
        )

    def wrong_status(self, error: NotRetryable | NotCancellable) -> Response[str]:
        message = (
            "only a failed run can be retried"
            if isinstance(error, NotRetryable)
            else "the run has already finished"
        )
        return self.refuse(HTTPStatus.CONFLICT, message, [Problem(field="run_id", message=message)])

    def no_run(self, error: RunNotFound) -> Response[str]:
        problem = Problem(field="run_id", message="no run has this id")
        return self.refuse(HTTPStatus.NOT_FOUND, "no such run", [problem])

    def not_decided(self, error: ApprovalError) -> Response[str]:
        message = _APPROVAL_MESSAGES.get(type(error)) or str(error)
        problem = Problem(field="run_id", message=message)
        return self.refuse(error.http_status, message, [problem])

    def answer_invalid(self, error: AnswerInvalid) -> Response[str]:
        # "ran: must be true or false" (the question's schema refused the answer): a field of
        # the body, named as its other fields are (`answer.ran`; `answer` for the answer as a
        # whole), in words that quote nothing sent (`600` in "must be at most 500, not 600").
        field = "answer" if error.field is None else f"answer.{error.field}"
        problem = Problem(field=field, message=error.reason)
        return self.refuse(error.http_status, "invalid request body", [problem])

    def no_route(self, error: NotFoundError) -> Response[str]:
        problem = Problem(field="(path)", message="see docs/openapi.json for the routes")
        return self.refuse(HTTPStatus.NOT_FOUND, "no such route", [problem])

    def refused(self, error: Refusal) -> Response[str]:
        return self.refuse(error.status, error.error, error.problems)

    def unreadable(self, error: RunUnreadable | UnsupportedSchema) -> Response[str]:
        # The run's stored row is damaged (or from a newer Ratchet): the store's fault, not
        # the caller's, and no retry helps. The words name the run, never quote the row.
        self.services().logger.error("run cannot be read", extra={"error": str(error)})
        problem = Problem(field="run_id", message="the run's stored state cannot be read")
        return self.refuse(HTTPStatus.INTERNAL_SERVER_ERROR, str(error), [problem])

    def damaged(self, error: StoreDamaged) -> Response[str]:
        self.services().logger.error("store damaged", extra={"error": str(error)})
        detail = f"the store is damaged: {error.detail}"
        return self.refuse(HTTPStatus.INTERNAL_SERVER_ERROR, detail, [])

    def busy(self, error: StoreBusy | StoreUnavailable) -> Response[str]:
        self.services().logger.warning("store busy", extra={"error": str(error)})
        return self.refuse(HTTPStatus.SERVICE_UNAVAILABLE, "busy for now; try again", [])


_APPROVAL_MESSAGES: dict[type[ApprovalError], str] = {
    ApprovalClosed: "the run is not waiting for a decision",
    ApprovalNotFound: "the run has no open approval request (yet)",
    ApprovalExpired: "the approval request has expired",
}
"""What the API says for each; `ApprovalDecided` says who decided, and when."""


_WAIT_PROBLEMS: dict[type[WaitError], tuple[str, str]] = {
    RunEnded: ("run_id", "the run has ended: it takes no more events"),
    EventNotAwaited: ("name", "the run's agent waits for no event of this name"),
    MailboxFull: ("run_id", "the run's mailbox is full: it must take some of its events first"),
    PayloadTooLarge: ("data", "the payload is too large"),
    NotSleeping: ("run_id", "the run is not sleeping"),
    WebhooksNotTaken: ("name", "the run waits for this event with a wait that takes no webhook"),
}
"""The field each refusal of an event or a wake names, and what the API says of it."""


@contextmanager
def _rebuilding(field: str, what: str) -> Iterator[None]:
    """Refuse, naming `field`, a read or fork of a step the run has no record of (404), or
    one whose state can no longer be rebuilt because its first records are past retention
    (410)."""
    try:
        yield
    except NoCheckpointAtStep:
        raise Refusal(
            HTTPStatus.NOT_FOUND, "no checkpoint at this step", field, "the run has none"
        ) from None
    except CheckpointsExpired:
        raise Refusal(
            HTTPStatus.GONE,
            "the run's early checkpoints are past their retention",
            field,
            f"{what} can no longer be rebuilt",
        ) from None


def _bounded_body(text: str) -> Any:
    """A request body as JSON, once `ratchet.untrusted.check_text` took it (a refusal names
    the top-level field holding what is nested too deep)."""
    return loads(text, field="", max_chars=MAX_BODY_CHARS)


def _caller(app: APIGatewayRestResolver, services: RunsServices) -> str:
    """The IAM principal that signed the request (API Gateway checked the signature)."""
    identity = app.current_event.request_context.identity
    names = [n for n in (identity.user_arn, identity.caller) if n]
    if not names:
        if services.anonymous_caller is None:
            raise Refusal(
                HTTPStatus.FORBIDDEN,
                "the request has no caller identity",
                "Authorization",
                "sign the request with SigV4",
            )
        names = [services.anonymous_caller]
    return next((n for n in names if len(n) <= MAX_BY_CHARS), names[0][:MAX_BY_CHARS])


_LOCATIONS = ("body", "path", "query", "header")


def _where(error: dict[str, Any]) -> str:
    loc = error.get("loc") or ("",)
    return str(loc[0])


def _is_body(error: dict[str, Any]) -> bool:
    return _where(error) == "body"


def _problem(error: dict[str, Any]) -> Problem:
    """A Powertools validation error as a problem: where and what, never `input`."""
    loc = [str(part) for part in error.get("loc", ())]
    if loc and loc[0] in _LOCATIONS:
        loc = loc[1:]
    if error.get("type") == "json_invalid":
        return Problem(field="(body)", message="the body is not valid JSON")
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return Problem(field=".".join(loc) or "(body)", message=message)


# --- the OpenAPI document ------------------------------------------------------------------------


def openapi_document(routes: APIGatewayRestResolver | None = None) -> dict[str, Any]:
    """The OpenAPI document of the routes, as committed in `docs/openapi.json`."""
    generated = (routes or build_app(_documenting_only)).get_openapi_json_schema(
        title=OPENAPI_TITLE,
        version=OPENAPI_VERSION,
        description=(__doc__ or "").split("\n\n")[0].strip(),
        security_schemes={
            "sigv4": APIKey(
                name="Authorization",
                in_=APIKeyIn.header,
                description="AWS Signature Version 4 (IAM): execute-api:Invoke on the API",
                openapi_extensions={"x-amazon-apigateway-authtype": "awsSigv4"},
            )
        },
        security=[{"sigv4": []}],
    )
    document: dict[str, Any] = json.loads(generated)
    # Powertools documents a 422 for every validated route; this app answers a 400 with
    # `RequestRefused` instead (see `invalid_request`), which each route lists.
    # (A route that answers a 422 itself, a payload its wait's schema refuses, keeps its own.)
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if responses.get("422", {}).get("description") == "Validation Error":
                del responses["422"]
    schemas = document.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return document


def openapi_text() -> str:
    return json.dumps(openapi_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _documenting_only() -> RunsServices:
    raise RuntimeError("this app only documents the routes; it serves no request")


if __name__ == "__main__":
    if sys.argv[1:] != ["--openapi"]:
        sys.exit("usage: python -m ratchet.web.runs --openapi > docs/openapi.json")
    sys.stdout.write(openapi_text())

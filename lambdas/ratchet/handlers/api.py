"""`POST /runs` (API Gateway REST, proxy integration): start a run and its execution.

Idempotent by run id, end to end: the run is created only if it does not exist, and the
execution's name derives from the run id, so a retried or repeated request (say, after a
timeout between the two writes) starts whatever is missing and answers 200 with the run as it
stands. A bad request is a 400 with a JSON error and changes nothing.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict, ValidationError

from ratchet.aws.naming import execution_name
from ratchet.aws.payloads import ExecutionInput
from ratchet.errors import AgentNotFound, InvalidInput
from ratchet.handlers._wiring import (
    anthropic_api_key,
    engine,
    logger,
    metrics,
    runtime,
    settings,
    stepfunctions,
    tracer,
)
from ratchet.runs import RunRequest, new_run
from ratchet.scenarios import load_agent

app = APIGatewayRestResolver()


class RunStarted(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str
    status: str
    step: int
    execution_name: str
    created: bool
    """False when the run existed already: the request changed nothing about it."""


class RequestRefused(BaseModel):
    model_config = ConfigDict(frozen=True)

    error: str
    problems: list[dict[str, str]]
    """Which fields of the body are wrong, and how; empty when the body as a whole is."""


@logger.inject_lambda_context(
    correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True
)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)


@app.post("/runs")
def post_run() -> Response[str]:
    request = RunRequest.model_validate_json(app.current_event.body or "")
    started = start_run(request, app.lambda_context)
    status = HTTPStatus.CREATED if started.created else HTTPStatus.OK
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=started.model_dump_json(),
    )


@app.exception_handler(ValidationError)  # type: ignore[untyped-decorator]
def invalid_body(error: ValidationError) -> Response[str]:
    # The locations and messages only: pydantic's `input` would echo the request back.
    problems = [
        {"field": ".".join(str(p) for p in e["loc"]) or "(body)", "message": e["msg"]}
        for e in error.errors(include_url=False)
    ]
    return _bad_request("invalid request body", problems)


@app.exception_handler([InvalidInput, AgentNotFound])  # type: ignore[untyped-decorator]
def invalid_run(error: InvalidInput | AgentNotFound) -> Response[str]:
    return _bad_request(str(error), [])


def start_run(request: RunRequest, context: LambdaContext) -> RunStarted:
    state = new_run(request, has_anthropic_key=anthropic_api_key() is not None)
    ratchet = runtime()
    created = False
    if ratchet.store.load_head(state.run_id) is None:
        agent = load_agent(state.agent)
        if agent.prepare:
            agent.prepare(ratchet.context(state.run_id, state.options))
        # False if a concurrent request created it first: then that one's run stands.
        created = engine(context).start(state)
    name = _start_execution(state.run_id)
    head = ratchet.store.load_head(state.run_id)
    assert head is not None, "the run exists: it was just created or found"
    metrics.add_metric(
        name="RunsStarted" if created else "RepeatedStarts", unit=MetricUnit.Count, value=1
    )
    logger.info(
        "run started" if created else "run exists; start is a no-op",
        extra={"run_id": head.run_id, "execution": name},
    )
    return RunStarted(
        run_id=head.run_id,
        status=head.status.value,
        step=head.step,
        execution_name=name,
        created=created,
    )


def _start_execution(run_id: str) -> str:
    config = settings()
    if not config.state_machine_arn:
        raise RuntimeError("RATCHET_STATE_MACHINE_ARN is not set: the API cannot start runs")
    name = execution_name(run_id, 0)
    execution = ExecutionInput(
        run_id=run_id,
        generation=0,
        iteration=0,
        approval_timeout_seconds=config.approval_timeout_seconds,
    )
    client = stepfunctions()
    # Same name and input as a running execution: Step Functions returns that execution.
    # A closed one (the run finished or rolled over): ExecutionAlreadyExists. Either way the
    # run already has, or had, its execution.
    try:
        client.start_execution(
            stateMachineArn=config.state_machine_arn,
            name=name,
            input=execution.model_dump_json(),
        )
    except client.exceptions.ExecutionAlreadyExists:
        logger.info("execution exists", extra={"run_id": run_id, "execution": name})
    return name


def _bad_request(message: str, problems: list[dict[str, str]]) -> Response[str]:
    metrics.add_metric(name="StartsRefused", unit=MetricUnit.Count, value=1)
    logger.info("start refused", extra={"error": message})
    body = RequestRefused(error=message, problems=problems).model_dump_json()
    return Response(
        status_code=HTTPStatus.BAD_REQUEST,
        content_type=content_types.APPLICATION_JSON,
        body=body,
    )

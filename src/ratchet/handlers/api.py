"""The runs API's Lambda function: the routes of `ratchet.web.runs`, served with the AWS
services (DynamoDB, the state machine that works each run), behind IAM-signed API Gateway."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.adapters.stepfunctions import execution_name, first_generation
from ratchet.handlers import _wiring
from ratchet.handlers.payloads import ExecutionInput
from ratchet.runs import RunRequest
from ratchet.state import Retried
from ratchet.web.runs import RunsServices, RunStarted, build_app

# --- AWS -----------------------------------------------------------------------------------------


def start_on_aws(request: RunRequest, *, request_id: str) -> RunStarted:
    """Create the run if it is new, and start its execution if it has none."""
    started = _wiring.client(worker_id=f"lambda:{request_id}").submit(request)
    name = _start_execution(started.run.run_id)
    _wiring.metrics.add_metric(
        name="RunsStarted" if started.created else "RepeatedStarts",
        unit=MetricUnit.Count,
        value=1,
    )
    _wiring.logger.info(
        "run started" if started.created else "run exists; start is a no-op",
        extra={"run_id": started.run.run_id, "execution": name},
    )
    return RunStarted.of(started, execution_name=name)


def _start_execution(run_id: str) -> str:
    name = execution_name(run_id, 0)
    # Same name and input as a running execution: Step Functions returns that execution.
    # A closed one (the run finished or rolled over): ExecutionAlreadyExists. Either way the
    # run already has, or had, its execution.
    if not _started(run_id, 0):
        _wiring.logger.info("execution exists", extra={"run_id": run_id, "execution": name})
    return name


def _started(run_id: str, generation: int) -> bool:
    """Start the run's execution of `generation`; False if that name is taken already."""
    config = _wiring.settings()
    if not config.state_machine_arn:
        raise RuntimeError("RATCHET_STATE_MACHINE_ARN is not set: the API cannot start runs")
    execution = ExecutionInput(
        run_id=run_id,
        generation=generation,
        iteration=0,
        approval_timeout_seconds=config.approval_timeout_seconds,
    )
    client = _wiring.stepfunctions()
    try:
        client.start_execution(
            stateMachineArn=config.state_machine_arn,
            name=execution_name(run_id, generation),
            input=execution.model_dump_json(),
        )
    except client.exceptions.ExecutionAlreadyExists:
        return False
    return True


MAX_NAME_PROBES = 100
"""Retry slots tried past the counted one when a name is taken (see `launch_on_aws`)."""


def launch_on_aws(run_id: str) -> str:
    """Start the execution of a run the API just forked (generation 0, as a start) or retried.

    A retried run's executions take the generations set aside for its retry
    (`first_generation`), the retry counted from its `Retried` records, so no name repeats
    one of its earlier executions. Those records expire with the checkpoints while names stay
    taken for 90 days: a name found taken by a closed execution moves on to the next slot."""
    store = _wiring.runtime().store
    retries = sum(isinstance(c.event, Retried) for c in store.list_checkpoints(run_id))
    if retries == 0:
        return _start_execution(run_id)
    for retry in range(retries, retries + MAX_NAME_PROBES):
        generation = first_generation(retry)
        if _started(run_id, generation):
            name = execution_name(run_id, generation)
            _wiring.logger.info(
                "retry execution started", extra={"run_id": run_id, "execution": name}
            )
            return name
    raise RuntimeError(f"no free execution name for run {run_id!r} after {MAX_NAME_PROBES} tries")


def aws_runs_services() -> RunsServices:
    return RunsServices(
        client=_wiring.client(worker_id="lambda:api"),
        desk=_wiring.approval_desk,
        start=start_on_aws,
        launch=launch_on_aws,
        logger=_wiring.logger,
        metrics=_wiring.metrics,
    )


app = build_app(aws_runs_services)


@_wiring.logger.inject_lambda_context(
    correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True
)
@_wiring.tracer.capture_lambda_handler(capture_response=False)
@_wiring.metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # Every invocation publishes at least this one, so a read emits no empty-metrics warning.
    _wiring.metrics.add_metric(name="ApiRequests", unit=MetricUnit.Count, value=1)
    return app.resolve(event, context)

"""The real state machine on moto: `statemachine/agent_run.asl.json`, interpreted by moto's
Step Functions engine, with every Lambda task dispatched in-process to the real handler and
DynamoDB on moto.

Two things stand in for AWS here, each as close to it as this allows; two gaps in moto's port
of the interpreter are filled (`_start_execution_parameters_fix`,
`_send_task_failure_cause_fix`), and the definition is parsed once per process
(`_parse_once`), which is most of what keeps the folder fast:

- Lambda: moto runs functions in Docker, which CI lacks, so `InProcessLambda` answers
  `Invoke` by calling the handler as the Python runtime would, errors included (the
  `x-amz-function-error` header and the runtime's error JSON, whose `errorType` is what the
  state machine's Retry and Catch match).
- Time: the test copy of the definition retries after 1 s instead of the production intervals
  (moto sleeps for real, and 1 s is the least ASL allows).
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import botocore.session
import pytest
from moto import mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.core.config import DefaultConfig
from moto.core.responses import EmptyResult
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_sfn import (  # noqa: E501
    StateTaskServiceSfn,
)
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from moto.stepfunctions.responses import StepFunctionResponse

from ratchet.adapters.dynamodb import create_tables
from ratchet.aws.approvals import ApprovalTokens, StoredApproval
from ratchet.aws.settings import ENVIRONMENT
from ratchet.errors import InjectedFault
from ratchet.handlers import _wiring, api, decide, mark_failed, notify, step
from ratchet.state import RunState

ASL = Path(__file__).resolve().parents[3] / "statemachine" / "agent_run.asl.json"
REGION = "us-east-1"
TABLES = {"checkpoints": "ratchet-checkpoints", "idempotency": "ratchet-idempotency"}
APP_TABLE = "ratchet-app"

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]

FUNCTIONS: dict[str, tuple[str, Handler]] = {
    "StepFunctionArn": ("ratchet-step", step.handler),
    "NotifyFunctionArn": ("ratchet-notify", notify.handler),
    "DecideFunctionArn": ("ratchet-decide", decide.handler),
    "MarkFailedFunctionArn": ("ratchet-mark-failed", mark_failed.handler),
}
"""Substitution variable of the definition -> (function name, handler)."""


@dataclass(frozen=True)
class FakeContext:
    """The fields of Lambda's context object that Powertools and the handlers read."""

    function_name: str
    invoked_function_arn: str
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 1024


class InProcessLambda:
    """Answers moto's Lambda `Invoke` by calling the real handler in this process."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers
        self.invocations: list[tuple[str, dict[str, Any]]] = []

    def invoke(
        self,
        function_name: str,
        qualifier: str | None,
        body: Any,
        headers: Any,
        response_headers: dict[str, str],
    ) -> bytes:
        name = function_name.rsplit(":", 1)[-1]
        event = json.loads(body)
        self.invocations.append((name, event))
        context = FakeContext(name, function_name)
        try:
            result = self.handlers[name](event, context)
        except InjectedFault as crash:
            # InjectedFault stands for the process dying mid-step. Step Functions reports a
            # function that died (killed, out of memory, timed out) as Lambda.Unknown; moto
            # takes the error name from errorType as it is, so the crash is reported under
            # the name Step Functions would give it.
            return _function_error(response_headers, "Lambda.Unknown", f"crashed: {crash}")
        except Exception as error:  # anything a handler raises is the function's error
            return _function_error(response_headers, type(error).__name__, str(error))
        return json.dumps(result).encode()


def _function_error(headers: dict[str, str], error_type: str, message: str) -> bytes:
    headers["x-amz-function-error"] = "Unhandled"
    return json.dumps(
        {
            "errorType": error_type,
            "errorMessage": message,
            "stackTrace": traceback.format_exc().splitlines(),
        }
    ).encode()


def _start_execution_parameters_fix() -> Any:
    """moto 5.2 passes a `states:startExecution` task's parameters to boto3 as the ASL names
    them (`StateMachineArn`), not as the API does (`stateMachineArn`): its port of the
    interpreter left the renaming step out. Put it back for that one integration, with the
    interpreter's own renaming helper and botocore's model of the API."""
    operation = (
        botocore.session.get_session()
        .get_service_model("stepfunctions")
        .operation_model("StartExecution")
    )
    original = StateTaskServiceSfn._normalise_parameters

    def normalise(self: Any, parameters: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        original(self, parameters, *args, **kwargs)
        self._to_boto_request(parameters, operation.input_shape)

    return mock.patch.object(StateTaskServiceSfn, "_normalise_parameters", normalise)


_parse_definition = functools.lru_cache(maxsize=4)(AmazonStateLanguageParser.parse)


def _parse_once() -> Any:
    """moto parses the definition (pure-Python ANTLR, ~1.3 s here) when the state machine is
    created and again for every execution. The parsed program is an immutable tree that each
    execution evaluates against its own environment, so every execution in this process
    shares one parse of the same text."""
    return mock.patch.object(AmazonStateLanguageParser, "parse", staticmethod(_parse_definition))


def _send_task_failure_cause_fix() -> Any:
    """moto 5.2's API layer drops SendTaskFailure's `cause` on its way to the interpreter,
    which supports it; a rejection's who and why travel there. Pass it on."""

    def send_task_failure(self: Any) -> EmptyResult:
        self.stepfunction_backend.send_task_failure(
            self._get_param("taskToken"),
            error=self._get_param("error"),
            cause=self._get_param("cause"),
        )
        return EmptyResult()

    return mock.patch.object(StepFunctionResponse, "send_task_failure", send_task_failure)


def quick_definition(arns: dict[str, str]) -> str:
    """The production definition with the ARNs filled in and every retry after 1 s."""
    definition = json.loads(ASL.read_text())
    for state in definition["States"].values():
        for retrier in state.get("Retry", []):
            if retrier.get("MaxAttempts", 3) > 0:
                retrier.update(IntervalSeconds=1, BackoffRate=1)
    text = json.dumps(definition)
    for variable, arn in arns.items():
        text = text.replace("${" + variable + "}", arn)
    assert "${" not in text, "a substitution variable has no function"
    return text


@dataclass
class Stack:
    """The deployed shape on moto, and the waits a test needs (polled with a deadline)."""

    sfn: Any
    dynamodb: Any
    state_machine_arn: str
    monkeypatch: pytest.MonkeyPatch
    lambdas: InProcessLambda

    def configure(self, **settings: str | int) -> None:
        """Set handler settings (by AwsSettings field) before the first invocation."""
        for name, value in settings.items():
            self.monkeypatch.setenv(ENVIRONMENT[name], str(value))
        _clear_wiring()

    def post_run(self, body: dict[str, Any] | str) -> tuple[int, dict[str, Any]]:
        event = api_event("POST", "/runs", body)
        response = api.handler(event, FakeContext("ratchet-api", "arn:ratchet-api"))
        return response["statusCode"], json.loads(response["body"])

    def head(self, run_id: str) -> RunState:
        state = _wiring.runtime().store.load_head(run_id)
        assert state is not None, f"no run {run_id}"
        return state

    def approvals(self, run_id: str) -> list[StoredApproval]:
        return ApprovalTokens(self.dynamodb, TABLES["checkpoints"]).of_run(run_id)

    def executions(self) -> list[dict[str, Any]]:
        listed = self.sfn.list_executions(stateMachineArn=self.state_machine_arn)["executions"]
        return sorted(listed, key=lambda e: e["startDate"])

    def execution_arn(self, name: str) -> str:
        return self.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"

    def finished(self, name: str, *, timeout: float = 60) -> dict[str, Any]:
        arn = self.execution_arn(name)
        described: dict[str, Any] = {}

        def closed() -> bool:
            nonlocal described
            described = self.sfn.describe_execution(executionArn=arn)
            return bool(described["status"] != "RUNNING")

        wait_until(closed, timeout=timeout, what=f"execution {name} to finish")
        return described

    def history(self, name: str) -> list[dict[str, Any]]:
        events = self.sfn.get_execution_history(executionArn=self.execution_arn(name))
        return list(events["events"])


def wait_until(check: Callable[[], bool], *, timeout: float = 60, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def api_event(method: str, path: str, body: dict[str, Any] | str | None) -> dict[str, Any]:
    """An API Gateway REST proxy event, as the `POST /runs` integration delivers it."""
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "resourcePath": path,
            "httpMethod": method,
            "stage": "prod",
            "path": f"/prod{path}",
        },
        "body": body if isinstance(body, str) or body is None else json.dumps(body),
        "isBase64Encoded": False,
    }


def history_events_per_iteration(events: list[dict[str, Any]]) -> list[int]:
    """Events from entering `Step` to entering it again: one loop iteration each."""
    starts = [
        i
        for i, event in enumerate(events)
        if event["type"] == "TaskStateEntered"
        and event["stateEnteredEventDetails"]["name"] == "Step"
    ]
    return [later - earlier for earlier, later in itertools.pairwise(starts)]


def _placeholder_zip() -> bytes:
    """moto keeps a function's code; these functions' handlers run in this process."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("handler.py", "")
    return buffer.getvalue()


def _clear_wiring() -> None:
    for factory in (
        _wiring.settings,
        _wiring.runtime,
        _wiring.stepfunctions,
        _wiring.anthropic_api_key,
    ):
        factory.cache_clear()


@contextmanager
def deployed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """The stack on moto for the length of the block; settings go through `monkeypatch`."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(_wiring.ANTHROPIC_SECRET_ARN, raising=False)
    monkeypatch.setenv(ENVIRONMENT["checkpoints_table"], TABLES["checkpoints"])
    monkeypatch.setenv(ENVIRONMENT["idempotency_table"], TABLES["idempotency"])
    monkeypatch.setenv(ENVIRONMENT["app_table"], APP_TABLE)
    # Long enough that no approval expires unless a test asks for it.
    monkeypatch.setenv(ENVIRONMENT["approval_timeout_seconds"], "300")
    lambdas = InProcessLambda(dict(FUNCTIONS.values()))
    config: DefaultConfig = {
        "lambda": {"use_docker": False},
        "stepfunctions": {"execute_state_machine": True},
    }
    with (
        mock_aws(config=config),
        mock.patch.object(LambdaSimpleBackend, "invoke", lambdas.invoke),
        _start_execution_parameters_fix(),
        _send_task_failure_cause_fix(),
        _parse_once(),
    ):
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        create_tables(dynamodb, app=APP_TABLE, **TABLES)
        iam = boto3.client("iam")
        role = iam.create_role(RoleName="ratchet", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        aws_lambda = boto3.client("lambda", region_name=REGION)
        arns = {
            variable: aws_lambda.create_function(
                FunctionName=name,
                Runtime="python3.13",
                Role=role,
                Handler="unused",
                Code={"ZipFile": _placeholder_zip()},
            )["FunctionArn"]
            for variable, (name, _) in FUNCTIONS.items()
        }
        sfn = boto3.client("stepfunctions", region_name=REGION)
        machine = sfn.create_state_machine(
            name="ratchet-agent-run", definition=quick_definition(arns), roleArn=role
        )["stateMachineArn"]
        monkeypatch.setenv(ENVIRONMENT["state_machine_arn"], machine)
        _clear_wiring()
        stack = Stack(sfn, dynamodb, machine, monkeypatch, lambdas)
        try:
            yield stack
        finally:
            # An execution left parked (a failed test) would keep its thread waiting.
            for execution in stack.executions():
                if execution["status"] == "RUNNING":
                    sfn.stop_execution(executionArn=execution["executionArn"])
            _clear_wiring()

"""The real state machine on moto: `statemachine/agent_run.asl.json`, interpreted by moto's
Step Functions engine, with every Lambda task dispatched in-process to the real handler and
DynamoDB on moto.

Two things stand in for AWS here, each as close to it as this allows; four gaps in moto's port
of the interpreter are filled (`_start_execution_parameters_fix`,
`_send_task_failure_cause_fix`, `_closed_task_fix`, `_wait_until_the_time_fix`), moto's
DynamoDB is kept to one call at a time (`one_dynamodb_call_at_a_time`, in
`tests.dynamodb_support`), and the definition is parsed once per process (`_parse_once`),
which is most of what keeps the folder fast:

- Lambda: moto runs functions in Docker, which CI lacks, so `InProcessLambda` answers
  `Invoke` by calling the handler as the Python runtime would, errors included (the
  `x-amz-function-error` header and the runtime's error JSON, whose `errorType` is what the
  state machine's Retry and Catch match).
- Time: the test copy of the definition retries after 1 s instead of the production intervals
  (moto sleeps for real, and 1 s is the least ASL allows).
- Crashes: `RATCHET_FAULT` reaches the step function as its environment would (`Stack.fault`);
  a `kill` fault raises `Killed` instead of killing the test run, reported as Lambda reports a
  killed runtime (Runtime.ExitError), and a `raise` fault is reported as a function that died
  (`Stack.report_crashes_as`: Lambda.Unknown by default, Sandbox.Timedout, ...) or as the
  Python exception it is. A `stop` fault holds the invocation that reaches it where it is, as
  a sandbox frozen mid-step, until the test lets it go on (`Stack.stop_at`).

The approvals side is deployed too: the link-signing key in Secrets Manager, an SES domain
identity whose sent mail moto keeps (`Stack.emails`), and the public approval routes, called
as API Gateway's REST proxy integration calls them (`Stack.open`, `Stack.submit`,
`Stack.slack`). Slack itself is `tests.fake_slack`, wired in by `Stack.use_slack`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import html
import io
import itertools
import json
import math
import os
import re
import secrets
import signal
import threading
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock
from urllib.parse import parse_qsl, unquote, urlencode, urljoin, urlsplit

import boto3
import botocore.session
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.core.config import DefaultConfig
from moto.core.exceptions import AWSError
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.core.responses import EmptyResult
from moto.ses.models import ses_backends
from moto.stepfunctions.parser.api import ExecutionStatus
from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
    FailureEventException,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_sfn import (  # noqa: E501
    StateTaskServiceSfn,
)
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.timestamp import Timestamp
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from moto.stepfunctions.responses import StepFunctionResponse

from ratchet import faults
from ratchet.adapters.dynamodb.approvals import AwsApprovals
from ratchet.errors import InjectedFault
from ratchet.handlers import _wiring, api, decide, mark_failed, notify, open_wait, record_wait, step
from ratchet.handlers import approvals as approval_routes
from ratchet.runtime.aws_settings import ENVIRONMENT
from ratchet.state import PersonDecided, RunState, RunStatus
from ratchet.waits import Approval, ApprovalStatus
from tests.dynamodb_support import create_tables, one_dynamodb_call_at_a_time
from tests.fake_slack import FakeSlack, signed_interaction

ASL = Path(__file__).resolve().parents[3] / "statemachine" / "agent_run.asl.json"
REGION = "us-east-1"
TABLES = {"checkpoints": "ratchet-checkpoints", "idempotency": "ratchet-idempotency"}
APP_TABLE = "ratchet-app"
PUBLIC_URL = "https://api.example.test/v1"
"""The API's base URL, stage included, as the stack passes it: where approval links point."""
MAIL_DOMAIN = "example.test"
SENDER = f"ratchet@{MAIL_DOMAIN}"
APPROVER = f"alice@{MAIL_DOMAIN}"
"""Who the deployment asks by default: every run that parks emails this address a link."""
SLACK_CHANNEL = "#approvals"
AGENTS = {
    name: f"tests.integration.aws.agents:{name}"
    for name in (
        "rows",
        "quick",
        "failing",
        "flaky",
        "twice",
        "gated",
        "events",
        "sleeper",
        "bounded",
        "fanout",
        "helper",
        "wires",
    )
}
"""The agents this deployment registers (RATCHET_AGENTS), besides the built-in scenarios."""
MODELS = {"house": "tests.fixtures.house_model:model"}
"""The models of the deployment's own (RATCHET_MODELS), which runs name."""

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]

FUNCTIONS: dict[str, tuple[str, ModuleType]] = {
    "StepFunctionArn": ("ratchet-step", step),
    "NotifyFunctionArn": ("ratchet-notify", notify),
    "DecideFunctionArn": ("ratchet-decide", decide),
    "MarkFailedFunctionArn": ("ratchet-mark-failed", mark_failed),
    "OpenWaitFunctionArn": ("ratchet-open-wait", open_wait),
    "RecordWaitFunctionArn": ("ratchet-record-wait", record_wait),
}
"""Substitution variable of the definition -> (function name, handler module). Each module's
`handler` is looked up when the stack is deployed: a test that reloads the handlers (to
decorate them under other Powertools settings) deploys the reloaded ones."""


FUNCTION_TIMEOUT_SECONDS = 900.0
"""The step function's timeout in the stack (`ratchet/cdk/functions.py`): the longest step time
limit and the step margin."""


@dataclass(frozen=True)
class FakeContext:
    """The fields of Lambda's context object that Powertools and the handlers read. The time
    left counts down from the function's timeout by the real clock, unless `seconds_left` says
    otherwise (a test's clock)."""

    function_name: str
    invoked_function_arn: str
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 1024
    seconds_left: Callable[[], float] | None = None
    deadline: float = field(default_factory=lambda: time.monotonic() + FUNCTION_TIMEOUT_SECONDS)

    def get_remaining_time_in_millis(self) -> int:
        left = self.seconds_left() if self.seconds_left else self.deadline - time.monotonic()
        return max(0, int(left * 1000))


class Killed(BaseException):
    """`RATCHET_FAULT=kill:...` in this process: the function's process "dies" here instead of
    the test's. A BaseException, so that no `except Exception` in the code under test sees it,
    as none would see a SIGKILL."""


class _FaultsOs:
    """`os` as `ratchet.faults` sees it under the harness: its SIGKILL of its own process
    raises `Killed` instead of ending the test run, and its SIGSTOP holds the invocation that
    sent it (`on_stop`, set by `Stack.stop_at`) instead of stopping the test run."""

    def __init__(self) -> None:
        self.on_stop: Callable[[], None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def kill(self, pid: int, sig: int) -> None:
        if pid == os.getpid() and sig == signal.SIGKILL:
            raise Killed("killed by RATCHET_FAULT")
        if pid == os.getpid() and sig == signal.SIGSTOP:
            assert self.on_stop is not None, "a stop fault is set through Stack.stop_at"
            self.on_stop()
            return
        os.kill(pid, sig)


CRASHES = ("Lambda.Unknown", "Runtime.ExitError", "Sandbox.Timedout")
"""How Step Functions names a function that died: timed out or out of memory (Lambda.Unknown,
Sandbox.Timedout), its runtime process killed or exited (Runtime.ExitError)."""


class InProcessLambda:
    """Answers moto's Lambda `Invoke` by calling the real handler in this process."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers
        self.invocations: list[tuple[str, dict[str, Any]]] = []
        self.returned: list[tuple[str, Any]] = []
        """Each invocation that returned (not raised), by function name, with its result."""
        self.clocks: dict[str, Callable[[], Callable[[], float]]] = {}
        """By function name: what makes each invocation's clock of the time it has left
        (`FakeContext.seconds_left`); none: the real clock from the function's timeout."""
        self.crash_error: str | None = "Lambda.Unknown"
        """The name an `InjectedFault` is reported under: one of `CRASHES`, or None for the
        Python exception it is (errorType `InjectedFault`, as the Python runtime reports an
        exception that escapes the handler)."""

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
        clock = self.clocks.get(name)
        context = FakeContext(name, function_name, seconds_left=clock() if clock else None)
        try:
            result = self.handlers[name](event, context)
        except Killed as killed:
            # Lambda reports a runtime process that was killed as Runtime.ExitError ("Runtime
            # exited with error: signal: killed").
            return _function_error(response_headers, "Runtime.ExitError", f"crashed: {killed}")
        except InjectedFault as crash:
            if self.crash_error is None:
                return _function_error(response_headers, type(crash).__name__, str(crash))
            # InjectedFault stands for the process dying mid-step (unless told otherwise).
            # Step Functions reports a function that died (killed, out of memory, timed out)
            # under a name of its own; moto takes the error name from errorType as it is, so
            # the crash is reported under the name Step Functions would give it.
            return _function_error(response_headers, self.crash_error, f"crashed: {crash}")
        except Exception as error:  # anything a handler raises is the function's error
            return _function_error(response_headers, type(error).__name__, str(error))
        self.returned.append((name, result))
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


def _closed_task_fix() -> Any:
    """AWS takes an answer only while a task waits for its token, and refuses any other with
    TaskTimedOut ("the task associated with the token has already been closed"): a second
    answer, or one after the task timed out or its execution stopped. moto 5.2 hands answers
    to the task's callback for as long as the callback exists, waiting or not (its wait even
    outlives the task's timeout). Refuse them as AWS does: a token is taken once, and only
    while its task, by the execution's history, has been scheduled and has not ended."""
    answered: set[str] = set()
    lock = threading.Lock()

    def once(answer: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def only_while_waiting(self: Any) -> Any:
            token = self._get_param("taskToken")
            with lock:
                if token in answered or not _awaited(self.stepfunction_backend, token):
                    raise AWSError(
                        "Task Timed Out: 'Provided task does not exist anymore'", "TaskTimedOut"
                    )
                result = answer(self)
                answered.add(token)
            return result

        return only_while_waiting

    return mock.patch.multiple(
        StepFunctionResponse,
        send_task_success=once(StepFunctionResponse.send_task_success),
        send_task_failure=once(StepFunctionResponse.send_task_failure),
    )


def _wait_until_the_time_fix() -> Any:
    """A `Wait` state with a timestamp ends at that time or after it. moto 5.2 counts the
    seconds to it from the local clock (not UTC) and rounds them down, so its Wait may end up
    to a second before the time (and hours off, on a machine that is not on UTC). Count them
    from UTC and round up."""

    def wait_seconds(self: Timestamp, env: Any) -> int:
        self.string.eval(env=env)
        text: str = env.stack.pop()
        until = self._from_timestamp_string(timestamp=text)
        if until is None:
            raise FailureEventException(self._create_failure_event(env, text))
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        return math.ceil((until - now).total_seconds())

    return mock.patch.object(Timestamp, "_get_wait_seconds", wait_seconds)


def _awaited(backend: Any, token: str) -> bool:
    for execution in backend._get_executions(ExecutionStatus.RUNNING):
        events = execution.to_history_output()["events"]
        scheduled = [
            i
            for i, event in enumerate(events)
            if event["type"] == "TaskScheduled" and token in json.dumps(event)
        ]
        if scheduled:
            after = events[scheduled[-1] + 1 :]
            return not any(e["type"] in _TASK_ENDS for e in after)
    return False


_TASK_ENDS = {"TaskSucceeded", "TaskFailed", "TaskTimedOut"}


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


@dataclass(frozen=True)
class Page:
    """What a browser gets back from an approval route."""

    url: str
    status: int
    headers: Mapping[str, str]
    body: str

    @property
    def title(self) -> str:
        found = re.search(r"<title>(.*?) · Ratchet</title>", self.body)
        return html.unescape(found.group(1)) if found else ""

    @property
    def text(self) -> str:
        """The words a person reads: tags dropped, entities decoded, blanks collapsed."""
        body = re.sub(r"<(style|title)>.*?</\1>", " ", self.body, flags=re.DOTALL)
        return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())

    @property
    def form_action(self) -> str:
        """Where the page's form posts, resolved against the page's own URL as a browser
        resolves it."""
        (action,) = re.findall(r"<form method='post' action='([^']*)'", self.body)
        return urljoin(self.url, html.unescape(action))


@dataclass(frozen=True)
class Email:
    """A message moto's SES accepted (it keeps the HTML part)."""

    sender: str
    to: list[str]
    subject: str
    body: str

    @property
    def link(self) -> str:
        (href,) = re.findall(r"href='([^']+)'", self.body)
        return html.unescape(href)


@dataclass
class Stack:
    """The deployed shape on moto, and the waits a test needs (polled with a deadline)."""

    sfn: Any
    dynamodb: Any
    state_machine_arn: str
    monkeypatch: pytest.MonkeyPatch
    lambdas: InProcessLambda
    link_key: str
    """The approval link signing key, as the stack's secret holds it."""
    produced: list[str] = field(default_factory=list)
    """Every URL, header and body the approval routes answered with, in order."""
    fake_slack: FakeSlack | None = None
    slack_signing_secret: str | None = None
    held: list[Held] = field(default_factory=list)
    faults_os: _FaultsOs = field(default_factory=_FaultsOs)
    """What `ratchet.faults` kills and stops with (`stop_at` sets what a stop does)."""

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

    # --- approvals ---------------------------------------------------------------------------

    def book(self) -> AwsApprovals:
        """The functions' approval book (with their payload codec, if they seal)."""
        return _wiring.approvals()

    def approvals(self, run_id: str) -> list[Approval]:
        return self.book().of_run(run_id)

    def approval_items(self, run_id: str) -> list[dict[str, Any]]:
        """The run's approval items as DynamoDB holds them (the token included, if kept)."""
        return list(
            self.dynamodb.query(
                TableName=TABLES["checkpoints"],
                KeyConditionExpression="run_id = :r AND begins_with(sk, :p)",
                ExpressionAttributeValues={":r": {"S": run_id}, ":p": {"S": "APPROVAL#"}},
                ConsistentRead=True,
            )["Items"]
        )

    def parked(self, run_id: str, *, timeout: float = 60) -> Approval:
        """Wait until the run waits for a person with one pending request, and the request
        went out (the approver's email); return the request."""
        wait_until(
            lambda: (
                self.head(run_id).status is RunStatus.WAITING
                and any(a.status is ApprovalStatus.PENDING for a in self.approvals(run_id))
                and bool(self.emails_about(run_id))
            ),
            timeout=timeout,
            what=f"{run_id} to park and ask for approval",
        )
        (approval,) = [a for a in self.approvals(run_id) if a.status is ApprovalStatus.PENDING]
        assert approval.step == self.head(run_id).step
        return approval

    def decisions(self, run_id: str) -> list[tuple[bool, str, str]]:
        """What the run recorded of each decision: (approved, by, comment)."""
        checkpoints = _wiring.runtime().store.list_checkpoints(run_id)
        return [
            (c.event.approved, c.event.by, c.event.comment)
            for c in checkpoints
            if isinstance(c.event, PersonDecided)
        ]

    def assert_settled(self, run_id: str) -> None:
        """Every request of the run is decided one way or another, and no token is kept."""
        items = self.approval_items(run_id)
        assert items, f"{run_id} has no approval request"
        assert [i for i in items if i["status"]["S"] == "pending"] == [], "still pending"
        assert [i for i in items if "task_token" in i] == [], "a task token is still kept"

    def token(self, run_id: str) -> str:
        """The parked execution's task token, read from the table as only a function with
        the table's permissions could (a person never sees it)."""
        (item,) = [i for i in self.approval_items(run_id) if "task_token" in i]
        return str(item["task_token"]["S"])

    def tokens(self, *run_ids: str) -> list[str]:
        """Every task token the state machine handed out so far (for these runs): to notify
        (a person's approval) and to open_wait (an event wait)."""
        return [
            e["task_token"]
            for name, e in self.lambdas.invocations
            if name in ("ratchet-notify", "ratchet-open-wait")
            and (not run_ids or e["run_id"] in run_ids)
        ]

    def items(self) -> dict[str, list[dict[str, Any]]]:
        """Every item of every table, to show that something changed nothing."""
        tables = [*TABLES.values(), APP_TABLE]
        return {
            table: sorted(
                self.dynamodb.scan(TableName=table, ConsistentRead=True)["Items"],
                key=lambda item: json.dumps(item, sort_keys=True),
            )
            for table in tables
        }

    def emails(self) -> list[Email]:
        sent = ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages
        return [
            Email(m.source, [a for v in m.destinations.values() for a in v], m.subject, m.body)
            for m in list(sent)
        ]

    def emails_about(self, run_id: str) -> list[Email]:
        return [e for e in self.emails() if _query(e.link).get("run") == run_id]

    def link(self, run_id: str, recipient: str = APPROVER) -> str:
        """The approval link that `recipient` got by email for the run's request."""
        (email,) = [e for e in self.emails_about(run_id) if e.to == [recipient]]
        return email.link

    def open(self, url: str) -> Page:
        """GET the link, as a browser (or a mail scanner) does."""
        return self.request("GET", url)

    def submit(self, url: str, decision: str, comment: str = "") -> Page:
        """POST the page's form."""
        form = urlencode({"decision": decision, "comment": comment})
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        return self.request("POST", url, form, headers)

    def request(
        self,
        method: str,
        url: str,
        body: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Page:
        response = self._route(route_event(method, url, body, headers=headers))
        return Page(url, response["statusCode"], _headers(response), response.get("body") or "")

    # --- Slack -------------------------------------------------------------------------------

    def use_slack(self, slack: FakeSlack) -> None:
        """Wire Slack in as a deployer would: both secrets in Secrets Manager, the API URL
        (here the fake's), and a default channel; trust the fake's certificate."""
        secrets_manager = boto3.client("secretsmanager", region_name=REGION)
        signing = secrets.token_hex(16)
        signing_arn = secrets_manager.create_secret(
            Name="ratchet/slack-signing-secret", SecretString=signing
        )["ARN"]
        token_arn = secrets_manager.create_secret(
            Name="ratchet/slack-bot-token", SecretString=slack.bot_token
        )["ARN"]
        self.monkeypatch.setenv("SSL_CERT_FILE", str(slack.trust_file))
        self.fake_slack, self.slack_signing_secret = slack, signing
        self.configure(
            slack_signing_secret_arn=signing_arn,
            slack_bot_token_secret_arn=token_arn,
            slack_api_url=slack.api_url,
            notify_slack_channel=SLACK_CHANNEL,
        )

    def slack_message(self, run_id: str) -> dict[str, Any]:
        """The message Slack was asked to post about the run's request (`chat.postMessage`:
        sent after the emails, so waited for)."""
        assert self.fake_slack is not None, "use_slack first"
        slack = self.fake_slack

        def about_the_run() -> list[dict[str, Any]]:
            return [
                m
                for m in slack.posted_messages()
                if f"`{run_id}`" in m["blocks"][0]["text"]["text"]
            ]

        wait_until(lambda: bool(about_the_run()), what=f"the Slack message about {run_id}")
        (message,) = about_the_run()
        return message

    def slack(
        self,
        payload: dict[str, Any],
        *,
        timestamp: int | None = None,
        signing_secret: str | None = None,
    ) -> int:
        """Deliver an interaction as Slack does (signed with the app's signing secret unless
        told otherwise); the HTTP status the endpoint answered."""
        secret = signing_secret or self.slack_signing_secret
        assert secret is not None, "use_slack first"
        body, headers = signed_interaction(payload, secret, timestamp=timestamp)
        return self.slack_raw(body, headers)

    def slack_raw(self, body: str, headers: dict[str, str]) -> int:
        response = self._route(route_event("POST", SLACK_INTERACTIONS_URL, body, headers=headers))
        return int(response["statusCode"])

    def _route(self, event: dict[str, Any]) -> dict[str, Any]:
        response: dict[str, Any] = approval_routes.handler(
            event, FakeContext("ratchet-approvals", "arn:approvals")
        )
        self.produced += [
            event["path"],
            json.dumps(event["queryStringParameters"]),
            json.dumps(response.get("headers")),
            json.dumps(response.get("multiValueHeaders")),
            response.get("body") or "",
        ]
        return response

    def everything_produced(self) -> list[str]:
        """What a person, a log reader or a mail scanner could see: every page and answer,
        every email, every request Slack received."""
        emails = [f"{e.subject}\n{e.body}" for e in self.emails()]
        slack = [json.dumps(r.body) for r in self.fake_slack.received()] if self.fake_slack else []
        return [*self.produced, *emails, *slack]

    # --- executions --------------------------------------------------------------------------

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

    def stop(self, *names: str) -> None:
        """Stop executions as an operator would, and wait until they are closed. moto's
        interpreter notices a stop only when the task it waits on returns, so a parked task
        is woken with its token (the stopped execution takes no further state)."""
        runs = set()
        for name in names:
            arn = self.execution_arn(name)
            runs.add(json.loads(self.sfn.describe_execution(executionArn=arn)["input"])["run_id"])
            self.sfn.stop_execution(executionArn=arn)
        for token in self.tokens(*runs):
            with contextlib.suppress(ClientError):
                self.sfn.send_task_failure(taskToken=token, error="ExecutionStopped")
        wait_until(
            lambda: all(not self.is_running(name) for name in names),
            timeout=10,
            what=f"{', '.join(names)} to stop",
        )

    def is_running(self, name: str) -> bool:
        described = self.sfn.describe_execution(executionArn=self.execution_arn(name))
        return bool(described["status"] == "RUNNING")

    def report_crashes_as(self, error: str | None) -> None:
        """Report an `InjectedFault` as Step Functions names a function that died (one of
        `CRASHES`), or with None as the Python exception it is."""
        assert error is None or error in CRASHES, error
        self.lambdas.crash_error = error

    def fault(self, spec: str, *, times: int = 1) -> None:
        """Set `RATCHET_FAULT` in the step function's environment, as a test deployment would,
        until the function has failed `times` times: then the next invocation is a container
        without it (a fault fires every time in the process that has it)."""
        self.monkeypatch.setenv(_wiring.FAULT, spec)
        _wiring.faults.cache_clear()
        original = self.lambdas.handlers["ratchet-step"]
        failures = itertools.count(1)

        def faulty(event: dict[str, Any], context: Any) -> dict[str, Any]:
            try:
                return original(event, context)
            except BaseException:
                if next(failures) >= times:
                    self.monkeypatch.delenv(_wiring.FAULT, raising=False)
                    _wiring.faults.cache_clear()
                raise

        self.monkeypatch.setitem(self.lambdas.handlers, "ratchet-step", faulty)

    def stop_at(self, spec: str) -> Held:
        """Set a `stop` fault (`stop:<point>@<step>`) in the step function's environment:
        the first invocation to reach it stands still there, as a frozen sandbox would, until
        the test `release`s it, and the fault is gone for every later invocation."""
        held = Held()
        self.held.append(held)
        self.monkeypatch.setenv(_wiring.FAULT, spec)
        _wiring.faults.cache_clear()

        def stop() -> None:
            self.monkeypatch.delenv(_wiring.FAULT, raising=False)
            _wiring.faults.cache_clear()
            held.entered.set()
            assert held.released.wait(timeout=60), "the test never let the step go on"

        self.faults_os.on_stop = stop
        return held

    def hold(self, function: str, *, only: Callable[[dict[str, Any]], bool] | None = None) -> Held:
        """Hold every invocation of `function` (`ratchet-decide`, ...), or with `only` those
        whose event it accepts, until `release`."""
        held = Held()
        self.held.append(held)
        original = self.lambdas.handlers[function]

        def holding(event: dict[str, Any], context: Any) -> dict[str, Any]:
            if only is not None and not only(event):
                return original(event, context)
            held.entered.set()
            assert held.released.wait(timeout=60), "the test never released the function"
            return original(event, context)

        self.monkeypatch.setitem(self.lambdas.handlers, function, holding)
        return held


@dataclass(frozen=True)
class Held:
    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def wait_entered(self) -> None:
        assert self.entered.wait(timeout=60), "the held function was never invoked"

    def release(self) -> None:
        self.released.set()


SLACK_INTERACTIONS_URL = f"{PUBLIC_URL}/slack/interactions"


def wait_until(check: Callable[[], bool], *, timeout: float = 60, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def api_event(
    method: str,
    path: str,
    body: dict[str, Any] | str | None,
    *,
    headers: dict[str, str] | None = None,
    query: dict[str, list[str]] | None = None,
    resource: str | None = None,
    stage: str = "prod",
) -> dict[str, Any]:
    """An API Gateway REST proxy event, as a proxy integration delivers it: `query` holds
    every value of each parameter; `queryStringParameters` keeps the last, as API Gateway
    does."""
    resource = resource or path
    names = re.findall(r"\{(\w+)\}", resource)
    values = re.fullmatch(re.sub(r"\\\{\w+\\\}", "([^/]+)", re.escape(resource)), path)
    assert values is not None, f"{path} is not a path of {resource}"
    headers = {"Content-Type": "application/json"} if headers is None else headers
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        "queryStringParameters": {k: v[-1] for k, v in query.items()} if query else None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": dict(zip(names, values.groups(), strict=True)) or None,
        "stageVariables": None,
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "resourcePath": resource,
            "httpMethod": method,
            "stage": stage,
            "path": f"/{stage}{path}",
            "identity": {"sourceIp": "198.51.100.7", "userAgent": "Mozilla/5.0"},
        },
        "body": body if isinstance(body, str) or body is None else json.dumps(body),
        "isBase64Encoded": False,
    }


APPROVAL_ROUTES = ("/approvals/{approval_id}", "/slack/interactions")


def route_event(
    method: str, url: str, body: str | None, *, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """The event API Gateway makes of a request for `url`, a URL under `PUBLIC_URL`."""
    parts, base = urlsplit(url), urlsplit(PUBLIC_URL)
    assert (parts.scheme, parts.netloc) == (base.scheme, base.netloc), url
    assert parts.path.startswith(base.path + "/"), url
    path = unquote(parts.path.removeprefix(base.path))
    query: dict[str, list[str]] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        query.setdefault(name, []).append(value)
    resource = next(
        (r for r in APPROVAL_ROUTES if re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", r), path)), path
    )
    return api_event(
        method,
        path,
        body,
        headers=headers or {},
        query=query,
        resource=resource,
        stage=base.path.strip("/"),
    )


def _query(url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query))


def _headers(response: Mapping[str, Any]) -> dict[str, str]:
    headers = dict(response.get("headers") or {})
    for name, values in (response.get("multiValueHeaders") or {}).items():
        headers[name] = ", ".join(values)
    return headers


def entered_states(history: list[dict[str, Any]]) -> list[str]:
    return [
        e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e
    ]


def assert_no_token_in(texts: list[str], tokens: list[str]) -> None:
    assert tokens, "no task token was handed out: nothing to look for"
    for token in tokens:
        leaked = [text for text in texts if token in text]
        assert not leaked, f"a task token appears in {len(leaked)} of what the test produced"


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
    """Forget what the handlers built from the settings: the next invocation reads them anew."""
    for factory in (
        _wiring.settings,
        _wiring.agents,
        _wiring.runtime,
        _wiring.stepfunctions,
        _wiring.anthropic_api_key,
        _wiring._secret,
        _wiring.approval_desk,
        _wiring.faults,
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
    for variable in ENVIRONMENT.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(ENVIRONMENT["checkpoints_table"], TABLES["checkpoints"])
    monkeypatch.setenv(ENVIRONMENT["idempotency_table"], TABLES["idempotency"])
    monkeypatch.setenv(ENVIRONMENT["app_table"], APP_TABLE)
    # Long enough that no approval expires unless a test asks for it.
    monkeypatch.setenv(ENVIRONMENT["approval_timeout_seconds"], "300")
    monkeypatch.setenv(ENVIRONMENT["public_url"], PUBLIC_URL)
    monkeypatch.setenv(ENVIRONMENT["email_sender"], SENDER)
    monkeypatch.setenv(ENVIRONMENT["notify_emails"], APPROVER)
    monkeypatch.setenv(ENVIRONMENT["agents"], json.dumps(AGENTS))
    monkeypatch.setenv(ENVIRONMENT["models"], json.dumps(MODELS))
    lambdas = InProcessLambda({name: module.handler for name, module in FUNCTIONS.values()})
    config: DefaultConfig = {
        "lambda": {"use_docker": False},
        "stepfunctions": {"execute_state_machine": True},
    }
    with (
        mock_aws(config=config),
        mock.patch.object(LambdaSimpleBackend, "invoke", lambdas.invoke),
        _start_execution_parameters_fix(),
        _send_task_failure_cause_fix(),
        _closed_task_fix(),
        _wait_until_the_time_fix(),
        one_dynamodb_call_at_a_time(),
        _parse_once(),
        mock.patch.object(faults, "os", faults_os := _FaultsOs()),
    ):
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        create_tables(dynamodb, app=APP_TABLE, **TABLES)
        link_key = secrets.token_hex(32)
        secret = boto3.client("secretsmanager", region_name=REGION).create_secret(
            Name="ratchet/approval-link-key", SecretString=link_key
        )
        monkeypatch.setenv(ENVIRONMENT["link_key_secret_arn"], secret["ARN"])
        # A verified domain: mail from any address of it is accepted (and kept by moto).
        boto3.client("sesv2", region_name=REGION).create_email_identity(EmailIdentity=MAIL_DOMAIN)
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
        stack = Stack(sfn, dynamodb, machine, monkeypatch, lambdas, link_key, faults_os=faults_os)
        try:
            yield stack
        finally:
            # An execution left parked would keep its thread waiting past the test, to call
            # AWS for real when its task times out.
            for held in stack.held:
                held.release()
            running = [e["name"] for e in stack.executions() if e["status"] == "RUNNING"]
            if running:
                with contextlib.suppress(AssertionError):
                    stack.stop(*running)
            _clear_wiring()

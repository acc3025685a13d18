"""Webhooks on AWS: the hooks function (`ratchet.handlers.hooks.handler`) called as API
Gateway's REST proxy integration calls it, on moto (DynamoDB, S3, Secrets Manager, Step
Functions), with its settings read from the environment as the stack sets them. The run is
parked and worked in process (`AwsRuntime.work`); a delivery that settles its wait answers the
token the parked execution's wait task kept (the runtime's nudge)."""

from __future__ import annotations

import importlib
import io
import json
import logging
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ratchet.agents import AgentRegistry
from ratchet.handlers import _wiring
from ratchet.handlers import api as api_function
from ratchet.handlers import hooks as hooks_function
from ratchet.ports import OpenedHook
from ratchet.runtime.aws_settings import ENVIRONMENT
from ratchet.runtime.hooks import aws_hooks
from ratchet.state import MAX_EVENT_BYTES, RunOptions, RunState, RunStatus, WaitSettled
from ratchet.waiting.hooks import generic_signature, github_signature
from tests.dynamodb_support import REGION, SETTINGS, create_tables, scan
from tests.hooks_agent import AGENT, agent
from tests.integration.aws.harness import FakeContext, api_event

PUBLIC_URL = "https://api.example.test/v1"
BUCKET = "ratchet-blobs-hooks"
PASSED = {"conclusion": "success", "url": "https://ci.example/runs/7"}
DELIVERY = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAfake-task-token-of-the-parked-wait"


@dataclass
class Deployed:
    dynamodb: Any
    monkeypatch: pytest.MonkeyPatch

    def start(self, run_id: str = "run-1", **params: object) -> str:
        options = RunOptions(model="scripted", params=params)
        state = RunState(run_id=run_id, agent=AGENT, goal=agent.goal, options=options)
        assert _wiring.runtime().engine(worker_id="api", logger=_wiring.logger).start(state)
        return run_id

    def work(self, run_id: str) -> RunState:
        _wiring.runtime().work(run_id, worker_id="step", logger=_wiring.logger)
        return self.head(run_id)

    def head(self, run_id: str) -> RunState:
        state = _wiring.runtime().store.load_head(run_id)
        assert state is not None
        return state

    def park(self, run_id: str = "run-1", **params: object) -> OpenedHook:
        """A run parked on its `ci-finished` wait, its wait task's token kept (as AwaitEvent's
        open_wait keeps it), and its hook."""
        self.start(run_id, **params)
        parked = self.work(run_id)
        assert parked.status is RunStatus.WAITING
        _wiring.runtime().wait_tokens().keep(run_id, parked.step, TOKEN, at=parked.updated_at)
        hooks = aws_hooks(_wiring.runtime(), key=_wiring.hook_key(), agents=AgentRegistry())
        return hooks.open(run_id, "ci-finished")

    def open_through_api(self, run_id: str, name: str) -> tuple[int, Any]:
        """`POST /runs/{run_id}/hooks/{name}` to the api function, IAM-signed as API Gateway
        passes it on."""
        event = api_event(
            "POST",
            f"/runs/{run_id}/hooks/{name}",
            None,
            resource="/runs/{run_id}/hooks/{name}",
            stage="v1",
        )
        event["requestContext"]["identity"]["userArn"] = "arn:aws:iam::123456789012:user/ci"
        answer = api_function.handler(event, FakeContext("ratchet-api", "arn:ratchet-api"))
        return answer["statusCode"], json.loads(answer["body"])

    def items(self) -> list[dict[str, Any]]:
        return scan(self.dynamodb, SETTINGS.checkpoints_table)

    def settled(self, run_id: str) -> list[WaitSettled]:
        return [
            c.event
            for c in _wiring.runtime().store.list_checkpoints(run_id)
            if isinstance(c.event, WaitSettled)
        ]

    def deliver(self, hook: OpenedHook | str, body: bytes, headers: dict[str, str]) -> Any:
        hook_id = hook.hook.hook_id if isinstance(hook, OpenedHook) else hook
        event = api_event(
            "POST",
            f"/hooks/{hook_id}",
            body.decode("utf-8"),
            headers=headers,
            resource="/hooks/{hook_id}",
            stage="v1",
        )
        answer = hooks_function.handler(event, FakeContext("ratchet-hooks", "arn:ratchet-hooks"))
        return answer["statusCode"], json.loads(answer["body"])


def github(
    secret: str, payload: Any = PASSED, delivery: str = DELIVERY
) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload, indent=2).encode()
    return body, {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/044aadd",
        "X-GitHub-Event": "workflow_run",
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": github_signature(secret, body),
    }


def _clear_wiring() -> None:
    for factory in (
        _wiring.settings,
        _wiring.agents,
        _wiring.runtime,
        _wiring.stepfunctions,
        _wiring._secret,
    ):
        factory.cache_clear()


@pytest.fixture
def deployed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployed]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    for variable in ENVIRONMENT.values():
        monkeypatch.delenv(variable, raising=False)
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        create_tables(
            dynamodb,
            checkpoints=SETTINGS.checkpoints_table,
            idempotency=SETTINGS.idempotency_table,
            app=SETTINGS.app_table,
        )
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        key = boto3.client("secretsmanager", region_name=REGION).create_secret(
            Name="ratchet/hook-key", SecretString=secrets.token_urlsafe(48)
        )
        for setting, value in {
            "checkpoints_table": SETTINGS.checkpoints_table,
            "idempotency_table": SETTINGS.idempotency_table,
            "app_table": SETTINGS.app_table,
            "blob_bucket": BUCKET,
            "hook_key_secret_arn": key["ARN"],
            "public_url": PUBLIC_URL,
        }.items():
            monkeypatch.setenv(ENVIRONMENT[setting], value)
        _clear_wiring()
        try:
            yield Deployed(dynamodb, monkeypatch)
        finally:
            _clear_wiring()


def test_a_github_delivery_resumes_the_parked_run_and_wakes_its_execution(deployed):
    hook = deployed.park()
    assert hook.url == f"{PUBLIC_URL}/hooks/{hook.hook.hook_id}"

    status, answer = deployed.deliver(hook, *github(hook.secret))

    assert (status, answer["status"], answer["event_id"], answer["duplicate"]) == (
        200,
        "delivered",
        DELIVERY,
        False,
    )
    # The nudge answered the parked wait task's token and dropped it.
    assert _wiring.runtime().wait_tokens().task_token("run-1", 1) is None
    assert deployed.head("run-1").status is RunStatus.RUNNING
    done = deployed.work("run-1")
    assert done.status is RunStatus.DONE
    [settled] = deployed.settled("run-1")
    assert (settled.event_id, settled.payload) == (DELIVERY, PASSED)
    event = _wiring.runtime().mailbox().get("run-1", DELIVERY)
    assert event is not None
    assert (event.source, event.consumed_step) == ("webhook", 1)


def test_a_large_delivery_keeps_its_payload_in_the_blob_store(deployed):
    hook = deployed.park()
    big = {**PASSED, "log": "x" * (64 * 1024)}
    status, answer = deployed.deliver(hook, *github(hook.secret, big))
    assert (status, answer["status"]) == (200, "delivered")
    [settled] = deployed.settled("run-1")
    assert settled.blob is not None
    assert json.loads(_wiring.runtime().blobs.get(settled.blob)) == big


def test_a_redelivery_is_a_duplicate_and_writes_nothing(deployed):
    hook = deployed.park()
    body, headers = github(hook.secret)
    _, first = deployed.deliver(hook, body, headers)
    before = deployed.items()
    status, again = deployed.deliver(hook, body, headers)
    assert (status, again) == (200, {**first, "duplicate": True})
    assert deployed.items() == before


def _refusals(hook: OpenedHook, now: int) -> dict[str, tuple[bytes, dict[str, str], str]]:
    body, headers = github(hook.secret)
    stale = json.dumps(PASSED).encode()
    return {
        "forged": (body, {**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64}, "401"),
        "unsigned": (body, {k: v for k, v in headers.items() if "Signature" not in k}, "401"),
        "stale": (
            stale,
            {
                "Content-Type": "application/json",
                "X-Delivery-Id": "d-2",
                "X-Signature-Timestamp": str(now - 600),
                "X-Signature-256": generic_signature(hook.secret, now - 600, stale),
            },
            "401",
        ),
        "no delivery id": (body, {k: v for k, v in headers.items() if "Delivery" not in k}, "400"),
        "form-encoded": (
            body,
            {**headers, "Content-Type": "application/x-www-form-urlencoded"},
            "415",
        ),
        "oversized": (body, {**headers, "Content-Length": str(MAX_EVENT_BYTES + 1)}, "413"),
        "not JSON": (
            b"{",
            {**headers, "X-Hub-Signature-256": github_signature(hook.secret, b"{")},
            "400",
        ),
    }


@pytest.mark.parametrize(
    "case",
    ["forged", "unsigned", "stale", "no delivery id", "form-encoded", "oversized", "not JSON"],
)
def test_a_refused_delivery_writes_nothing_and_leaves_the_execution_parked(deployed, case):
    hook = deployed.park()
    now = int(deployed.head("run-1").updated_at.timestamp())
    body, headers, expected = _refusals(hook, now)[case]
    before = deployed.items()
    status, answer = deployed.deliver(hook, body, headers)
    assert str(status) == expected, answer
    assert answer["problems"][0]["field"]
    assert deployed.items() == before
    assert _wiring.runtime().wait_tokens().task_token("run-1", 1) == TOKEN


def test_an_unknown_hook_is_the_same_404_as_a_malformed_id(deployed):
    hook = deployed.park()
    body, headers = github(hook.secret)
    before = deployed.items()
    unknown = deployed.deliver("f" * 32, body, headers)
    malformed = deployed.deliver("not-a-hook", body, headers)
    assert (
        unknown
        == malformed
        == (
            404,
            {
                "error": "no such hook",
                "problems": [{"field": "hook_id", "message": "no such hook"}],
            },
        )
    )
    assert deployed.items() == before


def test_a_wait_that_takes_no_webhook_refuses_and_a_run_that_ended_refuses(deployed):
    trusted = deployed.start("run-2", trusted=True)
    hooks = aws_hooks(_wiring.runtime(), key=_wiring.hook_key(), agents=AgentRegistry())
    early = hooks.open(trusted, "ci-finished")
    deployed.work(trusted)
    before = deployed.items()
    assert deployed.deliver(early, *github(early.secret))[0] == 403
    assert deployed.items() == before

    hook = deployed.park()
    deployed.deliver(hook, *github(hook.secret))
    deployed.work("run-1")
    before = deployed.items()
    status, answer = deployed.deliver(hook, *github(hook.secret, delivery="later"))
    assert status == 409
    assert "takes no more events" in answer["error"]
    assert deployed.items() == before


class _Stdout(io.TextIOBase):
    """Whatever `sys.stdout` is at the moment of writing (pytest swaps it at every phase)."""

    def write(self, text: str) -> int:
        return sys.stdout.write(text)


def test_the_function_logs_no_secret_signature_or_payload_even_told_to_log_events(
    deployed, capfd, request
):
    # Powertools reads the variable when it decorates a handler: the module is imported anew
    # under it, and again without it afterwards.
    deployed.monkeypatch.setenv("POWERTOOLS_LOGGER_LOG_EVENT", "true")
    importlib.reload(hooks_function)
    request.addfinalizer(lambda: importlib.reload(hooks_function))
    # Powertools' handler keeps the stream it found when the handlers were imported.
    handler = _wiring.logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    deployed.monkeypatch.setattr(handler, "stream", _Stdout())
    hook = deployed.park()
    marker = "payload-marker-aws-7d1e"
    payload = {**PASSED, "url": f"https://ci.example/{marker}"}
    body, headers = github(hook.secret, payload)
    capfd.readouterr()
    assert deployed.deliver(hook, body, headers)[0] == 200
    assert (
        deployed.deliver(hook, body, {**headers, "X-Hub-Signature-256": "sha256=" + "1" * 64})[0]
        == 401
    )
    out, err = capfd.readouterr()
    logged = out + err
    assert "webhook delivery taken" in logged
    for secret in (hook.secret, headers["X-Hub-Signature-256"].removeprefix("sha256="), marker):
        assert secret not in logged


def test_the_api_opens_the_runs_hook_and_its_secret_signs_a_delivery(deployed, capfd):
    handler = _wiring.logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    deployed.monkeypatch.setattr(handler, "stream", _Stdout())
    deployed.start()
    parked = deployed.work("run-1")
    _wiring.runtime().wait_tokens().keep("run-1", parked.step, TOKEN, at=parked.updated_at)
    capfd.readouterr()
    status, opened = deployed.open_through_api("run-1", "ci-finished")
    made = aws_hooks(_wiring.runtime(), key=_wiring.hook_key(), agents=AgentRegistry())
    expected = made.open("run-1", "ci-finished")
    assert (status, opened) == (
        200,
        {
            "run_id": "run-1",
            "name": "ci-finished",
            "hook_id": expected.hook.hook_id,
            "url": f"{PUBLIC_URL}/hooks/{expected.hook.hook_id}",
            "secret": expected.secret,
        },
    )
    out, err = capfd.readouterr()
    assert expected.hook.hook_id in out + err
    assert expected.secret not in out + err

    assert deployed.deliver(expected, *github(opened["secret"]))[0] == 200
    assert deployed.head("run-1").status is RunStatus.RUNNING


def test_the_api_refuses_a_hook_for_no_run_or_an_undeclared_name_and_writes_nothing(deployed):
    # The deployment registers the hooks agent, so the API knows the events it declares.
    deployed.monkeypatch.setenv(ENVIRONMENT["agents"], json.dumps({"hooks": AGENT}))
    _clear_wiring()
    deployed.start()
    before = deployed.items()
    for run_id, name, expected in [
        ("nope", "ci-finished", (404, "run_id")),
        ("run-1", "deploy", (404, "name")),
    ]:
        status, refused = deployed.open_through_api(run_id, name)
        assert (status, refused["problems"][0]["field"]) == expected
    assert deployed.items() == before

"""Cancelling a run parked on AWS through the runs API: the run ends cancelled with its
checkpoints, its approval is closed with the task token gone, and its execution is stopped
(StopExecution, sent for exactly the run's execution). moto's interpreter does not end a task
parked on waitForTaskToken when its execution is stopped: the execution shows RUNNING until
the task returns, so the test wakes it, as the harness does elsewhere."""

from __future__ import annotations

import contextlib
import json

from botocore.exceptions import ClientError

from ratchet.handlers import api
from ratchet.state import RunStatus
from ratchet.waits import ApprovalStatus
from tests.integration.aws.harness import FakeContext, Stack, api_event, wait_until

CALLER = "arn:aws:iam::123456789012:role/ops"


def test_cancel_of_a_waiting_run_closes_the_approval_and_ends_it_cancelled(stack: Stack):
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": "c-1"})
    assert status == 201, started
    execution = started["execution_name"]
    stack.parked("c-1")
    before = _store_records(stack)

    from ratchet.handlers import _wiring

    stopped: list[tuple[str, str]] = []
    _wiring.stepfunctions().meta.events.register(
        "before-parameter-build.states.StopExecution",
        lambda params, **_: stopped.append((params["executionArn"], params["error"])),
    )
    event = api_event(
        "POST", "/runs/c-1/cancel", {"reason": "wrong table"}, resource="/runs/{run_id}/cancel"
    )
    event["requestContext"]["identity"].update(userArn=CALLER)
    response = api.handler(event, FakeContext("ratchet-api", "arn:ratchet-api"))

    assert response["statusCode"] == 200, response["body"]
    assert json.loads(response["body"])["status"] == "cancelled"
    head = stack.head("c-1")
    assert head.status is RunStatus.CANCELLED
    assert head.summary == f"Cancelled by {CALLER}: wrong table"
    (approval,) = stack.approvals("c-1")
    assert approval.status is ApprovalStatus.CLOSED
    stack.assert_settled("c-1")
    assert _store_records(stack)[: len(before)] == before
    assert stopped == [(stack.execution_arn(execution), "Cancelled")]
    # moto notices a stop only when the parked task returns: wake it, as the harness does.
    for token in stack.tokens("c-1"):
        with contextlib.suppress(ClientError):
            stack.sfn.send_task_failure(taskToken=token, error="ExecutionStopped")
    wait_until(lambda: not stack.is_running(execution), timeout=10, what="the stop")
    assert stack.head("c-1").status is RunStatus.CANCELLED


def _store_records(stack: Stack) -> list[str]:
    from ratchet.handlers import _wiring

    return [c.model_dump_json() for c in _wiring.runtime().store.list_checkpoints("c-1")]

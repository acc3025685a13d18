"""At-most-once tools with the state machine executing on moto: the step Lambda killed at each
point of a step that calls one (`Runtime.ExitError`, retried by the state machine) never makes
the call twice. Where the call may have run, the retried step parks for a person (an approval
email, as any request) asking whether it did; the answer through the runs API resumes the
execution: "it ran" ends the run with what the person said, "it did not" makes the call once
more. Every point ends with the wire sent exactly once and the run done."""

from __future__ import annotations

import json

import pytest

from ratchet.faults import FaultPoint
from ratchet.handlers import api
from ratchet.state import RunStatus
from tests.integration.aws.agents import BANK
from tests.integration.aws.harness import FakeContext, Stack, api_event

POINTS = [
    FaultPoint.AFTER_DECISION,
    FaultPoint.AFTER_CALL_STARTED,
    FaultPoint.AFTER_TOOL,
    FaultPoint.BEFORE_COMMIT,
    FaultPoint.AFTER_COMMIT,
]
MAY_HAVE_RUN = {FaultPoint.AFTER_CALL_STARTED, FaultPoint.AFTER_TOOL, FaultPoint.BEFORE_COMMIT}


def _approve(run_id: str, answer: dict[str, object]) -> int:
    event = api_event("POST", f"/runs/{run_id}/approve", {"answer": answer})
    event["requestContext"]["identity"].update(userArn="arn:aws:iam::123456789012:role/ops")
    response = api.handler(event, FakeContext("ratchet-api", "arn:ratchet-api"))
    assert response["statusCode"] == 200, response["body"]
    return int(json.loads(response["body"])["step"])


@pytest.mark.parametrize("point", POINTS)
def test_a_killed_step_never_sends_the_wire_twice_and_no_run_is_stranded(stack: Stack, point):
    run_id = f"pay-{point.value}"
    stack.fault(f"kill:{point.value}@1")
    status, started = stack.post_run({"agent": "wires", "run_id": run_id})
    assert status == 201, started

    if point in MAY_HAVE_RUN:
        approval = stack.parked(run_id)
        assert approval.prompt.startswith("send_wire may or may not have run at step 1")
        # The person checks the bank and says what they saw.
        ran = BANK.sent_by(run_id) == 1
        _approve(run_id, {"ran": ran, "result": "ref 42" if ran else ""})

    assert stack.finished(started["execution_name"], timeout=120)["status"] == "SUCCEEDED"
    head = stack.head(run_id)
    assert head.status is RunStatus.DONE
    assert BANK.sent_by(run_id) == 1

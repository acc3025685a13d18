"""At-most-once tools with the state machine executing on moto: the step Lambda killed at each
point of a step that calls one (`Runtime.ExitError`, retried by the state machine) never makes
the call twice. Where the call may have run, the retried step parks for a person (an approval
email, as any request) asking whether it did; the answer through the runs API resumes the
execution: "it ran" ends the run with what the person said, "it did not" makes the call once
more. Every point ends with the wire sent exactly once and the run done.

The killed step's call may be running still, for all a retry in another sandbox can tell, until
its deadline (a sandbox still in it then is ended by the step function's timeout): the retried
step waits that long (the execution's `Queued` state, no attempt used) before it asks."""

from __future__ import annotations

import json

import pytest

from ratchet.faults import FaultPoint
from ratchet.handlers import _wiring, api, step
from ratchet.ports import CallStart, LedgerStatus
from ratchet.state import RunStatus, StepCompleted
from tests.integration.aws.agents import BANK, SLOW_PORTAL, WIRE_STEP_SECONDS
from tests.integration.aws.harness import (
    AGENTS,
    FakeContext,
    Killed,
    Stack,
    api_event,
    entered_states,
    wait_until,
)

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
    stack.configure(queue_retry_seconds=1)
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


def test_the_retried_step_asks_no_sooner_than_the_calls_deadline(stack: Stack):
    # Given the step Lambda killed right after the wire's call was recorded as started
    stack.configure(queue_retry_seconds=1)
    run_id = "pay-deadline"
    key = f"{run_id}/step-1"
    stack.fault(f"kill:{FaultPoint.AFTER_CALL_STARTED.value}@1")
    status, started = stack.post_run({"agent": "wires", "run_id": run_id})
    assert status == 201, started
    start = _call_start(key)
    assert start.seconds == WIRE_STEP_SECONDS

    # When the state machine retries the step until the run asks a person
    stack.parked(run_id)

    # Then it asked no sooner than the call's deadline, counted from the call's start
    ((asked_at, asking),) = [
        (c.created_at, c.event)
        for c in _wiring.runtime().store.list_checkpoints(run_id)
        if isinstance(c.event, StepCompleted) and c.event.wait is not None
    ]
    assert asked_at is not None
    waited = (asked_at - start.at).total_seconds()
    queued = entered_states(stack.history(started["execution_name"])).count("Queued")
    print(f"asked {waited:.2f} s after the call started ({start.seconds:g} s), queued {queued}x")
    assert asked_at >= start.deadline
    # Waiting used no attempt: the killed one, and the one that asked
    assert asking.attempt == 2

    # And the person, who sees no wire at the bank, has it sent once
    assert BANK.sent_by(run_id) == 0
    _approve(run_id, {"ran": False})
    assert stack.finished(started["execution_name"], timeout=120)["status"] == "SUCCEEDED"
    assert BANK.sent_by(run_id) == 1


def test_a_sandbox_that_gives_up_the_call_at_its_deadline_ends(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    # Lambda freezes a sandbox between invocations, and thaws it for a later one: a call the
    # step gave up at its deadline would go on then, past the deadline the retry waited for,
    # and after the person said it did not run. Ending the sandbox ends the call.
    stack.configure(
        queue_retry_seconds=1,
        agents=json.dumps({**AGENTS, "slow_wires": "tests.integration.aws.agents:slow_wires"}),
    )
    run_id = "pay-slowly"
    ended: list[tuple[int, str | None]] = []

    def end_sandbox() -> None:
        head = stack.head(run_id)
        ended.append((head.attempts, head.error))
        raise Killed("the step handler ended its sandbox")

    monkeypatch.setattr(step, "end_sandbox", end_sandbox)

    # Given a wire's call that outlasts the step's time limit
    status, started = stack.post_run({"agent": "slow_wires", "run_id": run_id})
    assert status == 201, started
    SLOW_PORTAL.entered.wait(timeout=60)

    # When the step gives it up at its deadline
    wait_until(lambda: bool(ended), timeout=60, what="the step to give the call up")

    # Then that sandbox ends, once the failed attempt is recorded
    ((attempts, error),) = ended
    assert attempts == 1
    assert error is not None
    assert "timed out after 1 s (in tool send_wire)" in error

    # (This process cannot end: the call goes on here, and the run asks once it has ended.)
    SLOW_PORTAL.release.set()
    stack.parked(run_id)
    _approve(run_id, {"ran": BANK.sent_by(run_id) == 1})
    assert stack.finished(started["execution_name"], timeout=120)["status"] == "SUCCEEDED"
    assert BANK.sent_by(run_id) == 1


def _call_start(key: str) -> CallStart:
    """The call's start as the ledger keeps it (until the step that asks completes the key)."""
    found: list[CallStart] = []

    def recorded() -> bool:
        entry = _wiring.runtime().ledger.get(key)
        if entry is not None and entry.status is LedgerStatus.CALLED and entry.call is not None:
            found.append(entry.call)
        return bool(found)

    wait_until(recorded, timeout=60, what=f"the call under {key} to start")
    return found[0]

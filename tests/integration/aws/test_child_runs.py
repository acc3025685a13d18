"""Child runs with the state machine executing on moto: a parent's step starts each child in an
execution of its own (named after the child's id), parks on `AwaitEvent` and is woken by the
last child's end; its result lists every child's outcome, a failed one as failed. A step killed
after starting its children and before its commit is retried and starts none twice.
Cancelling the parent cancels the children it waits for and stops their executions."""

from __future__ import annotations

import time

from ratchet.adapters.stepfunctions import execution_name
from ratchet.handlers import _wiring, api
from ratchet.state import RunStatus, WaitSettled, child_run_id
from tests.integration.aws.agents import WORLD
from tests.integration.aws.harness import AGENTS, FakeContext, Stack, api_event, entered_states


def _start(stack: Stack, run_id: str, **params: object) -> str:
    status, started = stack.post_run({"agent": "fanout", "run_id": run_id, "input": params})
    assert status == 201, started
    return str(started["execution_name"])


def _settled(run_id: str) -> WaitSettled:
    """The settling of the run's children wait, as the deployed store holds it."""
    store = _wiring.runtime().store
    (settled,) = [
        c.event for c in store.list_checkpoints(run_id) if isinstance(c.event, WaitSettled)
    ]
    return settled


def test_a_parent_of_ten_children_ends_done_with_their_ten_results(stack: Stack):
    name = _start(stack, "fan", children=10)

    assert stack.finished(name, timeout=120)["status"] == "SUCCEEDED"
    parent = stack.head("fan")
    assert parent.status is RunStatus.DONE
    children = [child_run_id("fan", 1, i) for i in range(10)]
    outcomes = _settled("fan").children
    assert outcomes is not None
    assert [o.run_id for o in outcomes] == children
    assert [o.status for o in outcomes] == [RunStatus.DONE] * 10
    assert parent.summary is not None
    assert parent.summary.startswith("finished after: All 10 child runs ended: 10 done.")
    assert "AwaitEvent" in entered_states(stack.history(name))
    executions = {e["name"]: e for e in stack.executions()}
    for child in children:
        head = stack.head(child)
        assert head.parent == "fan"
        assert head.agent == AGENTS["helper"]
        assert executions[execution_name(child)]["status"] == "SUCCEEDED"
        assert WORLD.deliveries_of(child) == {f"{child}/step-1": 1}


def test_a_failing_child_is_reported_failed(stack: Stack):
    name = _start(stack, "fan-f", children=3, failing=[2])

    assert stack.finished(name, timeout=120)["status"] == "SUCCEEDED"
    outcomes = _settled("fan-f").children
    assert outcomes is not None
    assert [o.status for o in outcomes] == [RunStatus.DONE, RunStatus.DONE, RunStatus.FAILED]
    assert outcomes[2].error is not None
    assert "cannot write its row" in outcomes[2].error
    assert "2 done, 1 failed" in (stack.head("fan-f").summary or "")


def test_a_step_killed_after_starting_its_children_starts_none_twice(stack: Stack):
    stack.fault("kill:after_children_started@1")
    name = _start(stack, "fan-k", children=4)

    assert stack.finished(name, timeout=120)["status"] == "SUCCEEDED"
    parent = stack.head("fan-k")
    assert parent.status is RunStatus.DONE
    assert parent.step == 1  # the killed attempt committed nothing; its retry did
    children = [child_run_id("fan-k", 1, i) for i in range(4)]
    names = [e["name"] for e in stack.executions()]
    assert sorted(n for n in names if n.startswith("fan-k_step-")) == sorted(
        execution_name(c) for c in children
    )  # one execution each (a name starts once)
    for child in children:
        assert WORLD.deliveries_of(child) == {f"{child}/step-1": 1}
        assert stack.head(child).status is RunStatus.DONE


def test_cancelling_the_parent_cancels_its_children_and_stops_their_executions(stack: Stack):
    name = _start(stack, "fan-c", children=2, child="events")
    children = [child_run_id("fan-c", 1, i) for i in range(2)]
    deadline = time.monotonic() + 60
    parked = [name, *(execution_name(c) for c in children)]
    while not all(_waiting(stack, run) for run in ["fan-c", *children]) or not all(
        "AwaitEvent" in entered_states(stack.history(execution)) for execution in parked
    ):
        assert time.monotonic() < deadline, "the runs never parked"
        time.sleep(0.05)

    stopped: list[str] = []
    _wiring.stepfunctions().meta.events.register(
        "before-parameter-build.states.StopExecution",
        lambda params, **_: stopped.append(params["executionArn"].rsplit(":", 1)[-1]),
    )
    event = api_event(
        "POST", "/runs/fan-c/cancel", {"reason": "not needed"}, resource="/runs/{run_id}/cancel"
    )
    event["requestContext"]["identity"].update(userArn="arn:aws:iam::123456789012:role/ops")
    response = api.handler(event, FakeContext("ratchet-api", "arn:ratchet-api"))

    assert response["statusCode"] == 200, response["body"]
    assert stack.head("fan-c").status is RunStatus.CANCELLED
    for child in children:
        head = stack.head(child)
        assert head.status is RunStatus.CANCELLED
        assert "its parent run fan-c was cancelled" in (head.summary or "")
    # moto leaves a task parked on its token running when its execution is stopped
    # (tests/integration/aws/test_cancel.py): what shows the stop is the call, one per run.
    assert sorted(stopped) == sorted(parked)


def _waiting(stack: Stack, run_id: str) -> bool:
    try:
        return stack.head(run_id).status is RunStatus.WAITING
    except AssertionError:  # not created yet
        return False

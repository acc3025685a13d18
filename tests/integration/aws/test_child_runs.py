"""Child runs with the state machine executing on moto: a parent's step starts each child in an
execution of its own (named after the child's id), parks on `AwaitEvent` and is woken by the
last child's end; its result lists every child's outcome, a failed one as failed. A step killed
after starting its children and before its commit is retried and starts none twice.
Cancelling the parent cancels the children it waits for and stops their executions; and
cancelled while its step stands still inside the fan-out (before any child is created, or after
all are and before the commit), it leaves no child to run to done."""

from __future__ import annotations

import time
from collections import Counter

import pytest

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
    # Parked: each run's AwaitEvent task has kept its token and found the run still waiting.
    # (Cancelled before that look, an execution goes on by itself, finds its run cancelled and
    # ends, with nothing left to stop.)
    while not all(_parked(stack, run) for run in ["fan-c", *children]):
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


def _parked(stack: Stack, run_id: str) -> bool:
    """The run's open-wait function returned, its wait not settled: the execution waits on
    its token."""
    return any(
        name == "ratchet-open-wait" and result["run_id"] == run_id and not result["settled"]
        for name, result in list(stack.lambdas.returned)
    )


@pytest.mark.parametrize(
    ("point", "created"),
    [
        pytest.param("after_tool", 0, id="before-any-child-is-created"),
        pytest.param("after_children_started", 3, id="after-all-3-before-the-commit"),
    ],
)
def test_a_parent_cancelled_inside_its_fan_out_step_leaves_no_child_running(
    stack: Stack, point: str, created: int
):
    # Given the parent's step standing still inside its fan-out (a frozen sandbox), and every
    # step of its children held, so none can end before the cancel
    children = [child_run_id("fan-x", 1, i) for i in range(3)]
    held = stack.hold("ratchet-step", only=lambda event: event["run_id"] in children)
    frozen = stack.stop_at(f"stop:{point}@1")
    name = _start(stack, "fan-x", children=3)
    frozen.wait_entered()
    assert stack.head("fan-x").step == 0  # the fan-out step is under way, not committed
    stopped: list[str] = []
    _wiring.stepfunctions().meta.events.register(
        "before-parameter-build.states.StopExecution",
        lambda params, **_: stopped.append(params["executionArn"].rsplit(":", 1)[-1]),
    )

    # When the parent is cancelled through the API, then its step and the children go on
    event = api_event(
        "POST", "/runs/fan-x/cancel", {"reason": "not needed"}, resource="/runs/{run_id}/cancel"
    )
    event["requestContext"]["identity"].update(userArn="arn:aws:iam::123456789012:role/ops")
    response = api.handler(event, FakeContext("ratchet-api", "arn:ratchet-api"))
    assert response["statusCode"] == 200, response["body"]
    frozen.release()
    held.release()
    stack.finished(name, timeout=120)
    existing = [c for c in children if _exists(stack, c)]
    for child in existing:
        stack.finished(execution_name(child), timeout=120)

    # Then every child that was created ended cancelled, its execution stopped, and none ran
    # to done
    ended = Counter(stack.head(c).status.value for c in existing)
    print(f"cancel at {point}: {dict(ended)} of 3 children")
    assert stack.head("fan-x").status is RunStatus.CANCELLED
    assert ended[RunStatus.DONE.value] == 0
    assert ended == ({RunStatus.CANCELLED.value: created} if created else {})
    assert sorted(stopped) == sorted([name, *(execution_name(c) for c in existing)])
    for child in existing:
        assert WORLD.deliveries_of(child) == {}  # no child's tool ran


def _exists(stack: Stack, run_id: str) -> bool:
    return _wiring.runtime().store.load_head(run_id) is not None

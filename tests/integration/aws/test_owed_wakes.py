"""A waker that dies between settling a wait and answering the parked execution (issue 32,
item 1), with the state machine executing on moto: the event desk, the children desk, a wake
from a sleep and the approval desk, each killed at `after_wait_settled`. The run is settled,
its execution parked; then a later actor (a sender's retry, a child's retried step) or the
sweep (every minute, for marks older than its grace) answers it, and the run ends as if no one
had died: the event taken once, the decision recorded once, nothing left owed.

The sweep is invoked here as its EventBridge rule invokes it, with the grace at 1 s instead of
60 s (the module's constant), so that a test need not wait a minute. Each test prints how long
the run took to go on after its waker died."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from ratchet.adapters.dynamodb.wakes import AwsOwedWakes
from ratchet.adapters.stepfunctions import execution_name
from ratchet.faults import FaultPlan
from ratchet.handlers import _wiring, sweep
from ratchet.state import RunStatus, WaitSettled, child_run_id
from ratchet.waiting import wakes
from ratchet.waits import ApprovalStatus
from tests.integration.aws.harness import (
    APPROVER,
    TABLES,
    FakeContext,
    Killed,
    Stack,
    entered_states,
    wait_until,
)
from tests.integration.aws.test_waits import (
    EVENTS,
    PASSED,
    SLEEPER,
    _asleep,
    _assert_done_with_the_event_once,
    _finished,
    _kept_token,
    _parked_on_event,
    _sender,
    _start,
)

KILL = "kill:after_wait_settled@{}"


def _dying_engine(step: int) -> Any:
    runtime = _wiring.runtime()
    return runtime.engine(
        worker_id="lambda:dies", logger=_wiring.logger, faults=FaultPlan.parse(KILL.format(step))
    )


def _owed() -> list[Any]:
    """Every mark of the table, whatever its age."""
    marks = AwsOwedWakes(_wiring.runtime().dynamodb, TABLES["checkpoints"])
    return list(marks.older_than(_far_future(), limit=1000))


def _far_future() -> Any:
    from datetime import UTC, datetime

    return datetime(2999, 1, 1, tzinfo=UTC)


def _sweep() -> dict[str, Any]:
    """The sweep, invoked as its rule invokes it."""
    result: dict[str, Any] = sweep.handler(
        {"source": "aws.events"}, FakeContext("ratchet-sweep", "arn:sweep")
    )
    return result


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wakes, "WAKE_GRACE_SECONDS", 1)


@pytest.fixture
def parked(stack: Stack) -> Callable[[str], None]:
    """Waits until the run is parked on its event and open_wait has returned: its own look
    at the mailbox is over, so an event sent from then on is the test's sender's to settle."""
    returned: set[str] = set()
    original = stack.lambdas.handlers["ratchet-open-wait"]

    def recording(event: dict[str, Any], context: Any) -> dict[str, Any]:
        result = original(event, context)
        returned.add(event["run_id"])
        return result

    stack.monkeypatch.setitem(stack.lambdas.handlers, "ratchet-open-wait", recording)

    def wait(run_id: str) -> None:
        _parked_on_event(stack, run_id)
        wait_until(lambda: run_id in returned, what=f"open_wait of {run_id} to return")

    return wait


def _sent_by_a_sender_that_dies(stack: Stack, run_id: str) -> float:
    """Send the run its event through a desk whose process dies right after the settling
    write, before it answers the parked execution: when it died."""
    desk = _wiring.runtime().event_desk(_dying_engine(1))
    with pytest.raises(Killed):
        desk.send(run_id, "ci-finished", PASSED, event_id="d-1")
    return time.monotonic()


def _parked_and_settled(stack: Stack, run_id: str, execution: str) -> None:
    """The state a dead waker leaves: the run settled (running), the execution still parked
    on its token, the wake marked owed."""
    head = stack.head(run_id)
    assert head.status is RunStatus.RUNNING, head
    assert _kept_token(run_id) is not None, "nobody answered the parked execution"
    assert stack.is_running(execution)
    assert [(m.run_id, m.how) for m in _owed()] == [(run_id, "event")]


def test_a_senders_retry_wakes_the_execution_its_first_attempt_settled_and_left(
    stack: Stack, parked: Callable[[str], None]
):
    execution = _start(stack, "retry", EVENTS)
    parked("retry")
    died = _sent_by_a_sender_that_dies(stack, "retry")
    _parked_and_settled(stack, "retry", execution)

    again = _sender().send("retry", "ci-finished", PASSED, event_id="d-1")

    assert (again.status, again.duplicate) == ("delivered", True)
    _assert_done_with_the_event_once(stack, "retry", execution)
    print(f"\nkilled sender -> retry -> run done: {time.monotonic() - died:.2f} s")
    assert _owed() == []


def test_the_sweep_wakes_the_execution_of_an_event_whose_sender_died(
    stack: Stack, short_grace: None, parked: Callable[[str], None]
):
    execution = _start(stack, "swept", EVENTS)
    parked("swept")
    died = _sent_by_a_sender_that_dies(stack, "swept")
    _parked_and_settled(stack, "swept", execution)

    swept: list[dict[str, Any]] = []

    def woken() -> bool:
        swept.append(_sweep())  # as the rule invokes it, every minute
        return not stack.is_running(execution)

    wait_until(woken, timeout=30, what="the sweep to wake the run")

    _assert_done_with_the_event_once(stack, "swept", execution)
    took = time.monotonic() - died
    print(f"\nkilled sender -> sweep (grace 1 s) -> run done: {took:.2f} s")
    assert sum(s["answered"] for s in swept) == 1
    assert _owed() == []
    assert _sweep() == {"answered": 0, "settled": 0, "nothing_owed": 0, "failed": 0}


def test_a_mark_younger_than_the_grace_is_left_to_its_live_waker(
    stack: Stack, parked: Callable[[str], None]
):
    execution = _start(stack, "young", EVENTS)
    parked("young")
    _sent_by_a_sender_that_dies(stack, "young")

    assert _sweep()["answered"] == 0  # the mark is seconds old, the grace a minute

    assert stack.is_running(execution)
    assert _kept_token("young") is not None


def test_a_waker_that_died_before_settling_leaves_a_mark_the_sweep_settles(
    stack: Stack, short_grace: None, parked: Callable[[str], None]
):
    # The sender kept the event and marked the wake, then died before its settling write:
    # the sweep delivers the event in the mailbox, as the waker would have.
    execution = _start(stack, "unsettled", EVENTS)
    parked("unsettled")
    runtime = _wiring.runtime()
    mailbox_kept = runtime.engine(
        worker_id="lambda:dies",
        logger=_wiring.logger,
        faults=FaultPlan.parse("kill:after_event_accepted@1"),
    )
    with pytest.raises(Killed):
        runtime.event_desk(mailbox_kept).send("unsettled", "ci-finished", PASSED, event_id="d-1")
    runtime.nudge().owe("unsettled", 1, "event")
    assert stack.head("unsettled").status is RunStatus.WAITING

    wait_until(
        lambda: bool(_sweep()["settled"] or not stack.is_running(execution)),
        timeout=30,
        what="the sweep to settle the run",
    )

    _assert_done_with_the_event_once(stack, "unsettled", execution)
    assert _owed() == []


def test_a_childs_retried_step_wakes_its_parent_left_parked(
    stack: Stack, parked: Callable[[str], None]
):
    # Two children that wait for an event each, so the parent parks first. The last child's
    # step settles its parent's wait, then its Lambda dies before the answer; Step Functions
    # retries the step, which finds its run done and tells its parent again.
    name = _start_fanout(stack, "fan-w", children=2, child="events")
    children = [child_run_id("fan-w", 1, i) for i in range(2)]
    wait_until(lambda: _kept_token("fan-w") is not None, what="the parent to park")
    for child in children:
        parked(child)
    stack.fault(KILL.format(1))
    runtime = _wiring.runtime()
    sender = runtime.event_desk(runtime.engine(worker_id="api", logger=_wiring.logger))

    for child in children:
        sender.send(child, "ci-finished", PASSED, event_id="d-1")
        stack.finished(execution_name(child))
    assert stack.finished(name, timeout=60)["status"] == "SUCCEEDED"

    steps = [e for e in stack.lambdas.invocations if e[0] == "ratchet-step"]
    last_child = [event for function, event in steps if event["run_id"] == children[1]]
    assert len(last_child) == 3, "its step parked, died after settling the parent, was retried"
    parent = stack.head("fan-w")
    assert parent.status is RunStatus.DONE
    settled = [
        c.event for c in runtime.store.list_checkpoints("fan-w") if isinstance(c.event, WaitSettled)
    ]
    assert [s.how for s in settled] == ["children"]
    assert _owed() == []


def _start_fanout(stack: Stack, run_id: str, **params: object) -> str:
    status, started = stack.post_run({"agent": "fanout", "run_id": run_id, "input": params})
    assert status == 201, started
    return str(started["execution_name"])


def test_the_sweep_restarts_a_sleeper_whose_waker_died(stack: Stack, short_grace: None):
    execution = _start(stack, "nap", SLEEPER, seconds=3600)
    _asleep(stack, "nap", execution)
    desk = _wiring.runtime().event_desk(_dying_engine(1))

    with pytest.raises(Killed):
        desk.wake("nap", by="ops")
    died = time.monotonic()
    assert stack.head("nap").status is RunStatus.RUNNING
    assert stack.is_running(execution), "still asleep: nothing restarted it"

    wait_until(
        lambda: bool(_sweep()["answered"] or stack.head("nap").status is RunStatus.DONE),
        timeout=30,
        what="the sweep to restart the sleeper",
    )

    successor = [e["name"] for e in stack.executions() if e["name"] != execution][-1]
    assert _finished(stack, successor)["status"] == "SUCCEEDED"
    assert stack.head("nap").status is RunStatus.DONE
    print(f"\nkilled waker -> sweep (grace 1 s) -> sleeper done: {time.monotonic() - died:.2f} s")
    assert _owed() == []


def test_the_sweep_delivers_a_decision_whose_decider_died(
    stack: Stack, short_grace: None, monkeypatch: pytest.MonkeyPatch
):
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": "gate"})
    assert status == 201, started
    execution = str(started["execution_name"])
    approval = stack.parked("gate")
    page = stack.open(stack.link("gate"))

    # The approvals function dies after the request is settled, before it answers the task.
    monkeypatch.setenv(_wiring.FAULT, KILL.format(approval.step))
    _wiring.faults.cache_clear()
    _wiring.approval_desk.cache_clear()
    with pytest.raises(Killed):
        stack.submit(page.form_action, "approve", "go ahead")
    monkeypatch.delenv(_wiring.FAULT)
    _wiring.faults.cache_clear()
    _wiring.approval_desk.cache_clear()
    died = time.monotonic()

    (decided,) = stack.approvals("gate")
    assert decided.status is ApprovalStatus.APPROVED
    assert stack.head("gate").status is RunStatus.WAITING
    assert "task_token" in stack.approval_items("gate")[0], "the execution is still parked"
    assert [m.how for m in _owed()] == ["decided"]
    again = stack.open(stack.link("gate"))
    assert f"approved by {APPROVER}" in again.text  # nobody can decide it again

    wait_until(
        lambda: bool(_sweep()["answered"] or not stack.is_running(execution)),
        timeout=30,
        what="the sweep to deliver the decision",
    )

    assert stack.finished(execution)["status"] == "SUCCEEDED"
    took = time.monotonic() - died
    print(f"\nkilled decider -> sweep (grace 1 s) -> run done: {took:.2f} s")
    assert stack.decisions("gate") == [(True, APPROVER, "go ahead")]
    assert "RecordDecision" in entered_states(stack.history(execution))
    stack.assert_settled("gate")
    assert _owed() == []


# --- a wait's own function dying -----------------------------------------------------------------


def _dies_once_after(stack: Stack, function: str) -> list[str]:
    """The function's first invocation does its work, then its process dies before it
    answers (Lambda reports Runtime.ExitError); the runs it died for."""
    died: list[str] = []
    original = stack.lambdas.handlers[function]

    def dying(event: dict[str, Any], context: Any) -> dict[str, Any]:
        result = original(event, context)
        if not died:
            died.append(event["run_id"])
            raise Killed(f"{function} killed after its work")
        return result

    stack.monkeypatch.setitem(stack.lambdas.handlers, function, dying)
    return died


def test_a_park_whose_function_dies_is_opened_again_and_the_run_waits_on(stack: Stack):
    died = _dies_once_after(stack, "ratchet-open-wait")
    execution = _start(stack, "park-dies", EVENTS)
    wait_until(lambda: died == ["park-dies"], what="open_wait to die")
    _parked_on_event(stack, "park-dies")

    sent = _sender().send("park-dies", "ci-finished", PASSED, event_id="d-1")

    assert sent.status == "delivered"
    _assert_done_with_the_event_once(stack, "park-dies", execution)
    assert entered_states(stack.history(execution)).count("MarkFailed") == 0


def test_a_decision_whose_recording_function_dies_is_recorded_once_not_lost(stack: Stack):
    died = _dies_once_after(stack, "ratchet-decide")
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": "rec"})
    assert status == 201, started
    execution = str(started["execution_name"])
    stack.parked("rec")
    page = stack.open(stack.link("rec"))

    stack.submit(page.form_action, "approve", "go ahead")

    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert died == ["rec"]
    assert stack.head("rec").status is RunStatus.DONE
    assert stack.decisions("rec") == [(True, APPROVER, "go ahead")]

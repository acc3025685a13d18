"""Waits for an event or a time on AWS: the state machine executing on moto parks the run
(`AwaitEvent` on a task token, `Sleep` in a Wait state), the event desk settles it and wakes
the execution, and `RecordWait` settles what comes due. Each order of arrival ends with the
run done, the payload in the waiting step's result exactly once and the mailbox empty; a run
that sleeps invokes no Lambda until it is due; a wait longer than a chunk parks again, and an
old execution hands it to its successor.

Events are sent through the desk the API function builds (`_wiring.event_desk`), as a
sender's request reaches it; the chunk and the rollover age are set short where a test needs a
wait to outlast them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from ratchet.adapters.stepfunctions import execution_name
from ratchet.errors import NotSleeping, RunEnded
from ratchet.handlers import _wiring, api, payloads
from ratchet.state import RunStatus, WaitSettled
from ratchet.waiting.desk import EventDesk
from tests.integration.aws.harness import FakeContext, Stack, api_event, entered_states, wait_until

PASSED = {"conclusion": "success", "url": "https://ci.example/1"}
EVENTS = "events"
SLEEPER = "sleeper"


def _sender() -> EventDesk:
    """The desk of the API function, as a sender's request reaches it."""
    context: Any = FakeContext("ratchet-api", "arn:ratchet-api")
    return _wiring.event_desk(context)


def _start(stack: Stack, run_id: str, agent: str, **params: object) -> str:
    status, started = stack.post_run(
        {"agent": agent, "run_id": run_id, **({"input": params} if params else {})}
    )
    assert status == 201, started
    return str(started["execution_name"])


def _finished(stack: Stack, execution: str, *, timeout: float = 30) -> dict[str, Any]:
    """The execution once it has started (a successor, started by another) and finished."""
    names = lambda: [e["name"] for e in stack.executions()]  # noqa: E731
    wait_until(lambda: execution in names(), timeout=timeout, what=f"{execution} to start")
    return stack.finished(execution, timeout=timeout)


def _settled(run_id: str) -> list[WaitSettled]:
    return [
        c.event
        for c in _wiring.runtime().store.list_checkpoints(run_id)
        if isinstance(c.event, WaitSettled)
    ]


def _pending(run_id: str) -> list[str]:
    return [e.event_id for e in _wiring.runtime().mailbox().of_run(run_id) if e.is_pending]


def _kept_token(run_id: str, step: int = 1) -> str | None:
    return _wiring.runtime().wait_tokens().task_token(run_id, step)


def _waiting_for(stack: Stack, run_id: str, kind: str) -> bool:
    head = stack.head(run_id)
    return (
        head.status is RunStatus.WAITING and head.waiting is not None and head.waiting.kind == kind
    )


def _parked_on_event(stack: Stack, run_id: str) -> None:
    """Wait until the run waits for its event and the parked execution's token is kept."""
    wait_until(
        lambda: _waiting_for(stack, run_id, "event") and _kept_token(run_id) is not None,
        timeout=30,
        what=f"{run_id} to park on its event",
    )


def _entered(stack: Stack, execution: str, state: str) -> int:
    return entered_states(stack.history(execution)).count(state)


def _asleep(stack: Stack, run_id: str, execution: str) -> None:
    wait_until(
        lambda: _waiting_for(stack, run_id, "timer") and _entered(stack, execution, "Sleep") > 0,
        timeout=30,
        what=f"{run_id} to sleep",
    )


def _assert_done_with_the_event_once(stack: Stack, run_id: str, execution: str) -> None:
    described = stack.finished(execution, timeout=30)
    assert described["status"] == "SUCCEEDED", described
    head = stack.head(run_id)
    assert head.status is RunStatus.DONE, head
    settled = _settled(run_id)
    assert [(s.how, s.payload) for s in settled] == [("event", PASSED)]
    assert (head.summary or "").count('"conclusion": "success"') == 1
    assert _pending(run_id) == []
    assert _kept_token(run_id) is None, "the token is dropped once answered"


def _invocations(stack: Stack, function: str, run_id: str) -> list[dict[str, Any]]:
    return [
        e for name, e in stack.lambdas.invocations if name == function and e["run_id"] == run_id
    ]


@dataclass
class Calls:
    """Every Lambda invocation, with when it began and what it returned."""

    seen: list[tuple[str, float, dict[str, Any], Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, function: str) -> list[tuple[float, dict[str, Any], Any]]:
        with self.lock:
            return [(t, e, r) for name, t, e, r in self.seen if name == function]


@pytest.fixture
def calls(stack: Stack) -> Calls:
    recorded = Calls()
    for name, original in list(stack.lambdas.handlers.items()):

        def timed(
            event: dict[str, Any],
            context: Any,
            name: str = name,
            original: Callable[[dict[str, Any], Any], dict[str, Any]] = original,
        ) -> dict[str, Any]:
            began = time.time()
            result = original(event, context)
            with recorded.lock:
                recorded.seen.append((name, began, event, result))
            return result

        stack.monkeypatch.setitem(stack.lambdas.handlers, name, timed)
    return recorded


# --- the three orders of arrival ----------------------------------------------------------------


def test_an_event_sent_before_the_wait_is_taken_when_the_execution_parks(stack: Stack):
    held = stack.hold("ratchet-step")
    execution = _start(stack, "before", EVENTS)
    held.wait_entered()

    sent = _sender().send("before", "ci-finished", PASSED, event_id="d-1")
    assert (sent.status, sent.duplicate) == ("queued", False)
    held.release()

    _assert_done_with_the_event_once(stack, "before", execution)
    taken = _wiring.runtime().mailbox().get("before", "d-1")
    assert taken is not None
    assert taken.consumed_step == 1
    # open_wait took it from the mailbox and let the execution go on at once.
    assert _entered(stack, execution, "AwaitEvent") == 1
    assert _entered(stack, execution, "RecordWait") == 0


def test_an_event_sent_during_the_wait_wakes_the_parked_execution(stack: Stack):
    execution = _start(stack, "during", EVENTS)
    _parked_on_event(stack, "during")

    sent = _sender().send("during", "ci-finished", PASSED, event_id="d-1")

    assert sent.answer() == {
        "run_id": "during",
        "name": "ci-finished",
        "event_id": "d-1",
        "status": "delivered",
        "step": 1,
        "duplicate": False,
        "refused": None,
    }
    _assert_done_with_the_event_once(stack, "during", execution)
    history = stack.history(execution)
    assert entered_states(history).count("RecordWait") == 0
    assert [e["type"] for e in history if e["type"].startswith("Task") and "Succeeded" in e["type"]]
    # The step parked once and went on once.
    assert len(_invocations(stack, "ratchet-step", "during")) == 2
    assert len(_invocations(stack, "ratchet-open-wait", "during")) == 1


def test_an_event_after_the_timeout_finds_the_run_gone_on_without_it(stack: Stack):
    execution = _start(stack, "late", EVENTS, timeout=2)

    described = stack.finished(execution, timeout=30)

    assert described["status"] == "SUCCEEDED"
    head = stack.head("late")
    assert head.status is RunStatus.DONE
    assert [s.how for s in _settled("late")] == ["timeout"]
    assert "No 'ci-finished' event within 2 s." in (head.summary or "")
    assert entered_states(stack.history(execution)).count("RecordWait") == 1
    with pytest.raises(RunEnded, match="done: it takes no more events"):
        _sender().send("late", "ci-finished", PASSED, event_id="late")
    assert _pending("late") == []
    assert _kept_token("late") is None


def test_an_event_delivered_before_the_execution_kept_its_token_still_wakes_it(stack: Stack):
    """The sender settles the wait between the step's commit and open_wait's keeping of the
    token: its nudge finds no token. open_wait, looking at the run after keeping the token,
    answers it itself; without that the execution would stay parked with the run settled."""
    held = stack.hold("ratchet-open-wait")
    execution = _start(stack, "between", EVENTS)
    held.wait_entered()
    assert _waiting_for(stack, "between", "event")
    assert _kept_token("between") is None

    sent = _sender().send("between", "ci-finished", PASSED, event_id="d-1")
    assert sent.status == "delivered"
    held.release()

    _assert_done_with_the_event_once(stack, "between", execution)


# --- racing the timeout: one outcome ------------------------------------------------------------


def test_an_event_landing_while_the_timeout_is_recorded_wins_and_the_timeout_records_nothing(
    stack: Stack, calls: Calls
):
    held = stack.hold("ratchet-record-wait")
    execution = _start(stack, "race-event", EVENTS, timeout=2)
    held.wait_entered()  # the task timed out; RecordWait has not looked yet

    sent = _sender().send("race-event", "ci-finished", PASSED, event_id="racer")
    assert sent.status == "delivered"
    held.release()

    _assert_done_with_the_event_once(stack, "race-event", execution)
    assert [r["recorded"] for _, _, r in calls.of("ratchet-record-wait")] == [False]


def test_a_timeout_recorded_first_wins_and_the_event_stays_in_the_mailbox(stack: Stack):
    execution = _start(stack, "race-timeout", EVENTS, timeout=2)
    _parked_on_event(stack, "race-timeout")
    held = stack.hold("ratchet-step")  # the step after RecordWait settled the timeout
    held.wait_entered()
    assert [s.how for s in _settled("race-timeout")] == ["timeout"]

    sent = _sender().send("race-timeout", "ci-finished", PASSED, event_id="racer")
    assert sent.status == "queued"
    held.release()

    assert stack.finished(execution, timeout=30)["status"] == "SUCCEEDED"
    assert stack.head("race-timeout").status is RunStatus.DONE
    assert [s.how for s in _settled("race-timeout")] == ["timeout"]
    assert _pending("race-timeout") == ["racer"]


# --- timers -------------------------------------------------------------------------------------


def test_a_sleeping_run_invokes_no_lambda_until_it_is_due_then_steps_once(
    stack: Stack, calls: Calls
):
    execution = _start(stack, "nap", SLEEPER, seconds=3)
    _asleep(stack, "nap", execution)
    until = stack.head("nap").waiting.request.until  # type: ignore[union-attr]
    assert until is not None

    described = stack.finished(execution, timeout=30)

    assert described["status"] == "SUCCEEDED"
    head = stack.head("nap")
    assert head.status is RunStatus.DONE
    assert [s.how for s in _settled("nap")] == ["due"]
    assert "Slept until" in (head.summary or "")
    history = stack.history(execution)
    (slept,) = [e for e in history if e["type"] == "WaitStateEntered"]
    (woke,) = [e for e in history if e["type"] == "WaitStateExited"]
    asleep_from, asleep_to = slept["timestamp"].timestamp(), woke["timestamp"].timestamp()
    assert asleep_to >= until.timestamp()
    during = [(n, t) for n, t, _, _ in calls.seen if asleep_from < t < asleep_to]
    steps_after = [t for t, _, _ in calls.of("ratchet-step") if t >= asleep_to]
    print(
        f"Lambda invocations while the run slept {asleep_to - asleep_from:.1f} s: "
        f"{len(during)}; step invocations after: {len(steps_after)}"
    )
    assert during == []
    assert len(steps_after) == 1
    assert [r["recorded"] for _, _, r in calls.of("ratchet-record-wait")] == [True]
    # Before the sleep: the step that slept, and nothing else.
    assert [n for n, t, _, _ in calls.seen if t <= asleep_from] == ["ratchet-step"]


def test_a_sleeping_run_woken_early_goes_on_at_once_in_a_successor_execution(stack: Stack):
    execution = _start(stack, "woken", SLEEPER, seconds=3600)
    _asleep(stack, "woken", execution)
    started = time.monotonic()

    woken = _sender().wake("woken", by="dana")

    assert woken.status is RunStatus.RUNNING
    successor = execution_name("woken", 1)
    assert _finished(stack, successor)["status"] == "SUCCEEDED"
    assert time.monotonic() - started < 30
    assert stack.finished(execution, timeout=10)["status"] == "ABORTED"
    head = stack.head("woken")
    assert head.status is RunStatus.DONE
    (settled,) = _settled("woken")
    assert (settled.how, settled.by) == ("woken", "dana")
    assert "Woken early by dana" in (head.summary or "")
    with pytest.raises(NotSleeping):
        _sender().wake("woken", by="dana")


def test_a_run_waiting_for_an_event_cannot_be_woken(stack: Stack):
    _start(stack, "not-asleep", EVENTS)
    _parked_on_event(stack, "not-asleep")
    with pytest.raises(NotSleeping, match="waits for an event, not a time"):
        _sender().wake("not-asleep", by="dana")
    assert _waiting_for(stack, "not-asleep", "event")


def test_a_sleeping_run_cancelled_ends_cancelled_with_its_execution_stopped(stack: Stack):
    execution = _start(stack, "cancelled", SLEEPER, seconds=3600)
    _asleep(stack, "cancelled", execution)
    event = api_event(
        "POST", "/runs/cancelled/cancel", {"reason": "not needed"}, resource="/runs/{run_id}/cancel"
    )
    event["requestContext"]["identity"].update(userArn="arn:aws:iam::123456789012:role/ops")

    response = api.handler(event, FakeContext("ratchet-api", "arn:ratchet-api"))

    assert response["statusCode"] == 200, response["body"]
    assert json.loads(response["body"])["status"] == "cancelled"
    assert stack.finished(execution, timeout=10)["status"] == "ABORTED"
    assert stack.head("cancelled").status is RunStatus.CANCELLED
    assert _settled("cancelled") == []


# --- waits longer than a chunk, executions older than their year -----------------------------


@pytest.fixture
def short_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parks of 2 s, and executions that roll over before parking once 5 s old: a sleep of
    8 s parks at least twice in its first execution (a park may last 3 s: the wake time and
    the Wait are each rounded up to the second), then rolls over before it is due."""
    monkeypatch.setattr(payloads, "WAIT_CHUNK_SECONDS", 2)
    monkeypatch.setattr(payloads, "PARK_ROLLOVER_AGE", timedelta(seconds=5))


def test_a_sleep_longer_than_a_chunk_parks_again_and_rolls_over_when_old(
    stack: Stack, calls: Calls, short_chunks: None
):
    first = _start(stack, "long-nap", SLEEPER, seconds=8)
    _asleep(stack, "long-nap", first)
    until = stack.head("long-nap").waiting.request.until  # type: ignore[union-attr]
    assert until is not None
    successor = execution_name("long-nap", 1)

    assert _finished(stack, successor, timeout=40)["status"] == "SUCCEEDED"

    assert stack.finished(first)["status"] == "SUCCEEDED"
    assert stack.head("long-nap").status is RunStatus.DONE
    checkpoints = _wiring.runtime().store.list_checkpoints("long-nap")
    (settled,) = [c for c in checkpoints if isinstance(c.event, WaitSettled)]
    assert settled.event.how == "due"  # type: ignore[union-attr]
    assert settled.created_at >= until, "settled before it was due"
    # The first execution parked in chunks and, once old, handed the wait to its successor,
    # which slept out the rest.
    first_states = entered_states(stack.history(first))
    assert first_states.count("Sleep") >= 2
    assert first_states[-2:] == ["Rollover", "RolledOver"]
    assert entered_states(stack.history(successor)).count("Sleep") == 1
    recorded = [r["recorded"] for _, _, r in calls.of("ratchet-record-wait")]
    print(f"RecordWait over an 8 s sleep in 2 s chunks: {recorded}")
    assert recorded[-1] is True
    assert recorded.count(True) == 1
    assert len(recorded) >= 3


def test_an_event_wait_longer_than_a_chunk_parks_again_and_takes_the_event_there(
    stack: Stack, calls: Calls, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(payloads, "WAIT_CHUNK_SECONDS", 2)
    execution = _start(stack, "long-wait", EVENTS, timeout=60)
    wait_until(
        lambda: len(calls.of("ratchet-open-wait")) >= 2,
        timeout=30,
        what="the wait to park a second time",
    )
    _parked_on_event(stack, "long-wait")

    sent = _sender().send("long-wait", "ci-finished", PASSED, event_id="d-1")

    assert sent.status == "delivered"
    _assert_done_with_the_event_once(stack, "long-wait", execution)
    recorded = [r["recorded"] for _, _, r in calls.of("ratchet-record-wait")]
    assert recorded, "no chunk ran out"
    assert not any(recorded), "a chunk that ended early settled something"
    tokens = [e["task_token"] for _, e, _ in calls.of("ratchet-open-wait")]
    assert len(set(tokens)) == len(tokens), "each park has a token of its own"


def test_the_token_of_a_park_that_ran_out_answers_nothing(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    """A chunk that ran out ended its task: its token is refused (TaskTimedOut), and the run
    waits on, parked with its new token."""
    monkeypatch.setattr(payloads, "WAIT_CHUNK_SECONDS", 2)
    _start(stack, "old-token", EVENTS, timeout=60)
    wait_until(lambda: len(stack.tokens("old-token")) >= 2, timeout=30, what="a second park")
    old = stack.tokens("old-token")[0]

    with pytest.raises(ClientError, match="TaskTimedOut"):
        stack.sfn.send_task_success(taskToken=old, output="{}")

    assert _settled("old-token") == []
    assert _waiting_for(stack, "old-token", "event")
    wait_until(lambda: _kept_token("old-token") is not None, timeout=10, what="the new token")
    assert _kept_token("old-token") != old

"""The loop's decisions that the step Lambda makes for the state machine."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from ratchet.adapters.stepfunctions import execution_name
from ratchet.engine import Outcome, StepOutcome
from ratchet.handlers import payloads
from ratchet.handlers.payloads import (
    MAX_REASON_CHARS,
    PARK_ROLLOVER_AGE,
    WAIT_CHUNK_SECONDS,
    DecideRequest,
    NotifyRequest,
    NotifyResult,
    OpenWaitRequest,
    StepRequest,
    StepResult,
    TaskFailure,
)
from ratchet.state import (
    ApprovalRequest,
    EventWait,
    RunState,
    RunStatus,
    TimerWait,
    Waiting,
    WaitRequest,
)

NOW = datetime(2030, 5, 1, 12, 0, 0, 250_000, tzinfo=UTC)
CHUNK = timedelta(seconds=WAIT_CHUNK_SECONDS)


def _waiting(request: WaitRequest) -> RunState:
    return RunState(
        run_id="run-1",
        agent="a",
        goal="g",
        status=RunStatus.WAITING,
        step=17,
        version=40,
        waiting=Waiting(step=17, request=request, since=NOW),
    )


def _after(
    outcome: Outcome,
    *,
    iteration: int,
    rollover_after: int = 3,
    head: RunState | None = None,
    started_at: datetime | None = None,
) -> StepResult:
    request = StepRequest(run_id="run-1", generation=4, iteration=iteration, started_at=started_at)
    if outcome is Outcome.WAITING and head is None:
        head = _waiting(ApprovalRequest(prompt="ok?"))
    taken = StepOutcome(outcome, "run-1", step=17, version=40, head=head)
    return StepResult.after(request, taken, rollover_after=rollover_after, now=NOW)


def test_a_step_below_the_limit_continues_in_this_execution():
    result = _after(Outcome.CONTINUE, iteration=1)

    assert (result.outcome, result.iteration, result.next_execution) == ("continue", 2, None)
    assert (result.step, result.version, result.generation) == (17, 40, 4)


def test_the_step_that_reaches_the_limit_hands_the_run_to_the_next_generation():
    result = _after(Outcome.CONTINUE, iteration=2)

    assert (result.outcome, result.iteration) == ("rollover", 3)
    assert result.next_execution == execution_name("run-1", 5)


@pytest.mark.parametrize("outcome", [Outcome.WAITING, Outcome.DONE, Outcome.FAILED])
def test_only_a_continuing_run_rolls_over(outcome: Outcome):
    result = _after(outcome, iteration=10)

    assert (result.outcome, result.next_execution) == (outcome.value, None)


def test_a_lambda_failure_reads_as_its_error_and_message():
    cause = json.dumps(
        {"errorType": "KeyError", "errorMessage": "'batch'", "stackTrace": ["  File ..."]}
    )

    assert _caught("KeyError", cause).reason() == "KeyError: 'batch'"
    assert _caught("States.Timeout").reason() == "States.Timeout"
    assert _caught("X", "plain words").reason() == "X: plain words"
    assert len(_caught("X", "y" * 10_000).reason()) == MAX_REASON_CHARS


def _caught(error: str, cause: str | None = None) -> TaskFailure:
    """As a Catch puts it at its ResultPath."""
    return TaskFailure.model_validate({"Error": error, **({"Cause": cause} if cause else {})})


def test_the_task_token_stays_out_of_the_notify_requests_repr():
    request = NotifyRequest(run_id="run-1", task_token="AQCEAAAAKgAAAAMAAAAAAAAAAf-secret")

    assert "secret" not in repr(request)
    assert "secret" not in str(request)
    assert "secret" not in str(NotifyResult(approval_id="a" * 22).model_dump())


@pytest.mark.parametrize(
    "answer",
    [{"by": "a"}, {"Error": "Rejected", "Cause": "no"}, [], "text", 42, None, {"by": ""}],
    ids=repr,
)
def test_record_decision_takes_the_answer_in_whatever_shape_it_arrived(answer: object):
    request = DecideRequest.model_validate(
        {"run_id": "run-1", "verdict": "approved", "answer": answer}
    )

    assert request.answer == answer


def test_record_decision_refuses_a_verdict_the_state_machine_does_not_name():
    with pytest.raises(ValueError, match="verdict"):
        DecideRequest.model_validate({"run_id": "run-1", "verdict": "maybe"})


# --- how a waiting run parks --------------------------------------------------------------------


def _plan(request: WaitRequest, *, started_at: datetime | None = None) -> dict[str, object]:
    result = _after(Outcome.WAITING, iteration=1, head=_waiting(request), started_at=started_at)
    assert result.outcome == "waiting"
    dumped = result.model_dump(mode="json")["wait"]
    assert isinstance(dumped, dict)
    return dumped


def test_a_person_parks_as_before_with_nothing_to_time():
    assert _plan(ApprovalRequest(prompt="ok?")) == {
        "kind": "person",
        "wake_at": None,
        "timeout_seconds": None,
    }


def test_a_timer_sleeps_until_its_time_rounded_up_to_the_second_in_utc_with_a_z():
    until = NOW + timedelta(hours=2)
    assert _plan(TimerWait(seconds=7200, until=until)) == {
        "kind": "timer",
        "wake_at": "2030-05-01T14:00:01Z",
        "timeout_seconds": None,
    }


def test_a_timer_further_than_a_chunk_sleeps_one_chunk():
    assert WAIT_CHUNK_SECONDS == 7 * 24 * 3600
    assert _plan(TimerWait(until=NOW + CHUNK * 3))["wake_at"] == "2030-05-08T12:00:01Z"


def test_a_timer_already_due_sleeps_no_time():
    assert _plan(TimerWait(until=NOW - timedelta(seconds=5)))["wake_at"] == "2030-05-01T11:59:56Z"


def test_an_event_wait_times_out_with_its_own_timeout_or_a_chunk_whichever_comes_first():
    soon = EventWait(name="ci", timeout_seconds=90, expires_at=NOW + timedelta(seconds=89.5))
    later = EventWait(name="ci", timeout_seconds=3 * WAIT_CHUNK_SECONDS, expires_at=NOW + CHUNK * 3)
    never = EventWait(name="ci")
    past = EventWait(name="ci", timeout_seconds=1, expires_at=NOW - timedelta(hours=1))

    assert _plan(soon) == {"kind": "event", "wake_at": None, "timeout_seconds": 90}
    assert _plan(later)["timeout_seconds"] == WAIT_CHUNK_SECONDS
    assert _plan(never)["timeout_seconds"] == WAIT_CHUNK_SECONDS
    assert _plan(past)["timeout_seconds"] == 1


def test_a_chunk_is_short_enough_that_an_old_execution_rolls_over_well_inside_its_year():
    assert timedelta(days=1) <= CHUNK <= timedelta(days=14)
    assert timedelta(days=365) > PARK_ROLLOVER_AGE + 2 * CHUNK


@pytest.mark.parametrize(
    "request_",
    [TimerWait(until=NOW + timedelta(days=40)), EventWait(name="ci")],
    ids=["timer", "event"],
)
def test_an_old_execution_rolls_over_instead_of_parking(request_: WaitRequest):
    head = _waiting(request_)
    old = _after(Outcome.WAITING, iteration=1, head=head, started_at=NOW - PARK_ROLLOVER_AGE)
    young = _after(
        Outcome.WAITING,
        iteration=1,
        head=head,
        started_at=NOW - PARK_ROLLOVER_AGE + timedelta(seconds=1),
    )

    assert (old.outcome, old.next_execution, old.wait) == (
        "rollover",
        execution_name("run-1", 5),
        None,
    )
    assert (young.outcome, young.next_execution) == ("waiting", None)


def test_an_old_execution_waiting_for_a_person_parks_as_before():
    result = _after(Outcome.WAITING, iteration=1, started_at=NOW - timedelta(days=360))

    assert (result.outcome, result.next_execution) == ("waiting", None)


def test_the_execution_start_reads_as_step_functions_and_moto_write_it():
    for text in ("2030-05-01T12:00:00.250Z", "2030-05-01T12:00:00.250000+00:00"):
        assert StepRequest(run_id="r", started_at=text).started_at == NOW
    naive = StepRequest(run_id="r", started_at="2030-05-01T12:00:00.250")
    assert naive.started_at == NOW


def test_the_chunk_is_read_at_each_step(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(payloads, "WAIT_CHUNK_SECONDS", 2)
    assert _plan(EventWait(name="ci"))["timeout_seconds"] == 2


def test_the_task_token_stays_out_of_the_open_wait_requests_repr():
    request = OpenWaitRequest(run_id="run-1", step=3, task_token="AQCEAAAAKgAAAAMAAAAA-secret")

    assert "secret" not in repr(request)
    assert "secret" not in str(request)

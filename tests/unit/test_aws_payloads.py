"""The loop's decisions that the step Lambda makes for the state machine."""

from __future__ import annotations

import json

import pytest

from ratchet.adapters.stepfunctions import execution_name
from ratchet.engine import Outcome, StepOutcome
from ratchet.handlers.payloads import (
    MAX_REASON_CHARS,
    DecideRequest,
    NotifyRequest,
    NotifyResult,
    StepRequest,
    StepResult,
    TaskFailure,
)


def _after(outcome: Outcome, *, iteration: int, rollover_after: int = 3) -> StepResult:
    request = StepRequest(run_id="run-1", generation=4, iteration=iteration)
    taken = StepOutcome(outcome, "run-1", step=17, version=40)
    return StepResult.after(request, taken, rollover_after=rollover_after)


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

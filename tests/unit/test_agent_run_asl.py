"""`statemachine/agent_run.asl.json` read as data: well formed, no dead states, every error name
it matches is one something can raise, and every path it reads is a field the handlers know."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from ratchet import errors
from ratchet.adapters.stepfunctions import REJECTED_ERROR, ExecutionInput, VerdictKind
from ratchet.handlers.payloads import (
    DecideRequest,
    DecideResult,
    LoopOutcome,
    MarkFailedRequest,
    NotifyRequest,
    OpenWaitRequest,
    RecordWaitRequest,
    RecordWaitResult,
    StepRequest,
    StepResult,
    WaitPlan,
)
from ratchet.state import MAX_ATTEMPTS

ASL = Path(__file__).resolve().parents[2] / "statemachine" / "agent_run.asl.json"
DEFINITION: dict[str, Any] = json.loads(ASL.read_text())
STATES: dict[str, dict[str, Any]] = DEFINITION["States"]

SUBSTITUTIONS = {
    "StepFunctionArn",
    "NotifyFunctionArn",
    "DecideFunctionArn",
    "MarkFailedFunctionArn",
    "OpenWaitFunctionArn",
    "RecordWaitFunctionArn",
}
"""Exactly what the CDK stack fills in."""

SERVICE_ERROR_PREFIXES = ("States.", "Lambda.", "StepFunctions.", "Runtime.", "Sandbox.")
RATCHET_ERRORS = {
    name
    for name, value in vars(errors).items()
    if inspect.isclass(value) and issubclass(value, Exception)
}


def _targets(state: dict[str, Any]) -> Iterator[str]:
    if "Next" in state:
        yield state["Next"]
    if "Default" in state:
        yield state["Default"]
    for choice in state.get("Choices", []):
        yield choice["Next"]
    for catcher in state.get("Catch", []):
        yield catcher["Next"]


def _error_names() -> Iterator[tuple[str, str]]:
    for name, state in STATES.items():
        for clause in [*state.get("Retry", []), *state.get("Catch", [])]:
            for error in clause["ErrorEquals"]:
                yield name, error


def _payload(state: str) -> dict[str, Any]:
    payload: dict[str, Any] = STATES[state]["Parameters"]["Payload"]
    return payload


def _fields(template: dict[str, Any]) -> set[str]:
    return {key.removesuffix(".$") for key in template}


def test_the_definition_is_standard_jsonpath_with_every_state_reachable_and_every_target_real():
    assert DEFINITION["StartAt"] in STATES
    assert DEFINITION.get("QueryLanguage", "JSONPath") == "JSONPath"
    reached, frontier = set(), [DEFINITION["StartAt"]]
    while frontier:
        name = frontier.pop()
        if name in reached:
            continue
        reached.add(name)
        targets = list(_targets(STATES[name]))
        assert set(targets) <= set(STATES), f"{name} goes to a state that does not exist"
        frontier.extend(targets)
    assert reached == set(STATES), f"unreachable: {sorted(set(STATES) - reached)}"
    for name, state in STATES.items():
        ends = state["Type"] in ("Succeed", "Fail") or state.get("End") is True
        assert ends != ("Next" in state or state["Type"] == "Choice"), name


def test_the_substitution_variables_are_exactly_the_function_arns_the_stack_fills_in():
    assert set(re.findall(r"\$\{(\w+)\}", ASL.read_text())) == SUBSTITUTIONS


@pytest.mark.parametrize(("state", "error"), sorted(set(_error_names())))
def test_every_error_name_matched_is_one_that_can_be_raised(state: str, error: str):
    assert (
        error in RATCHET_ERRORS
        or error.startswith(SERVICE_ERROR_PREFIXES)
        or error == REJECTED_ERROR
    ), f"{state} matches {error!r}, which nothing raises: a renamed class in ratchet.errors?"


def _retrier(state: str, error: str) -> dict[str, Any] | None:
    """The retrier Step Functions picks for `error`: the first whose names include it, where
    States.ALL names every error."""
    for retrier in STATES[state].get("Retry", []):
        if error in retrier["ErrorEquals"] or retrier["ErrorEquals"] == ["States.ALL"]:
            return dict(retrier)
    return None


CRASHES = ("Lambda.Unknown", "Runtime.ExitError", "Sandbox.Timedout")
"""How Lambda reports an invocation that died: its own timeout or memory (Lambda.Unknown,
Sandbox.Timedout), the runtime process killed or exited (Runtime.ExitError)."""
TERMINAL = {"StaleVersion", "Superseded"}
"""The Step errors that are answers, not failures: another execution owns the run."""
NOT_THE_RUNS = {"AgentUnloadable"}
"""The Step errors that are the deployment's, not the run's: the bundle cannot load its agent."""


@pytest.mark.parametrize(
    "error",
    [
        *sorted(RATCHET_ERRORS - TERMINAL - NOT_THE_RUNS),
        *CRASHES,
        "ClientError",
        "EndpointConnectionError",
        "KeyError",
        "Lambda.SdkClientException",
    ],
)
def test_the_step_retries_every_error_but_the_terminal_ones_long_enough_for_three_strikes(
    error: str,
):
    retrier = _retrier("Step", error)

    assert retrier is not None, f"{error} is not retried"
    # The engine counts an attempt before its work and fails the run at the third, so the
    # state machine must give it at least the two retries that take it there.
    assert retrier["MaxAttempts"] >= MAX_ATTEMPTS - 1, error
    assert retrier["IntervalSeconds"] >= 1
    assert retrier["BackoffRate"] >= 1


def test_a_step_that_keeps_failing_stops_within_a_bounded_number_of_retries():
    for retrier in STATES["Step"]["Retry"]:
        assert retrier["MaxAttempts"] <= 6, retrier["ErrorEquals"]
        if retrier["MaxAttempts"]:
            assert retrier.get("JitterStrategy") == "FULL", retrier["ErrorEquals"]


@pytest.mark.parametrize("error", sorted(TERMINAL))
def test_a_step_that_lost_the_run_to_another_execution_is_never_retried(error: str):
    retrier = _retrier("Step", error)
    assert retrier is not None, "left to States.ALL"
    assert retrier["MaxAttempts"] == 0, "retried"
    catcher = _catcher("Step", error)
    assert STATES[catcher["Next"]]["Type"] == "Succeed", "a superseded execution fails no run"


def test_a_bundle_that_cannot_load_the_agent_ends_the_execution_leaving_the_run_unfailed():
    retrier = _retrier("Step", "AgentUnloadable")
    assert retrier is not None, "left to States.ALL"
    assert retrier["MaxAttempts"] == 0, "retried: the same bundle cannot load it either"
    ending = STATES[_catcher("Step", "AgentUnloadable")["Next"]]
    assert (ending["Type"], ending["Error"]) == ("Fail", "AgentUnloadable"), "the run is failed"
    assert ending["CausePath"] == "$.error.Cause", "the cause must name the agent and why"


def test_states_all_is_the_last_retrier_and_alone_in_it():
    retriers = STATES["Step"]["Retry"]
    alls = [i for i, r in enumerate(retriers) if "States.ALL" in r["ErrorEquals"]]
    assert alls == [len(retriers) - 1]
    assert retriers[-1]["ErrorEquals"] == ["States.ALL"]


def test_a_crash_three_times_over_reaches_mark_failed_with_its_name():
    """The engine cannot record why an invocation died; after the engine's three attempts,
    MarkFailed records the crash's name instead of a later invocation's "the worker died"."""
    for crash in CRASHES:
        assert _retrier("Step", crash) == _retrier("Step", "Lambda.Unknown")
        assert _retrier("Step", crash)["MaxAttempts"] == MAX_ATTEMPTS - 1  # type: ignore[index]
    assert STATES["Step"]["Catch"][-1]["ErrorEquals"] == ["States.ALL"]
    assert STATES["Step"]["Catch"][-1]["Next"] == "MarkFailed"
    assert "TimeoutSeconds" not in STATES["Step"]


def _model_fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


@pytest.mark.parametrize(
    ("state", "model"),
    [
        ("Step", StepRequest),
        ("AwaitApproval", NotifyRequest),
        ("RecordDecision", DecideRequest),
        ("MarkFailed", MarkFailedRequest),
        ("AwaitEvent", OpenWaitRequest),
        ("RecordWait", RecordWaitRequest),
    ],
)
def test_each_task_sends_exactly_the_fields_its_handler_reads(state: str, model: type[BaseModel]):
    assert _fields(_payload(state)) == _model_fields(model)


def test_the_loop_reads_only_fields_the_step_returns_and_rolls_over_with_a_full_input():
    selected = STATES["Step"]["ResultSelector"]
    assert {path.removeprefix("$.Payload.") for path in selected.values()} <= _model_fields(
        StepResult
    )
    assert _fields(STATES["Rollover"]["Parameters"]["Input"]) == _model_fields(ExecutionInput)
    begin = _fields(STATES["Begin"]["Parameters"]) - {"loop"}
    assert begin | {"iteration"} == _model_fields(ExecutionInput)
    outcomes = {_rule(c)["$.loop.outcome"] for c in STATES["Route"]["Choices"]}
    assert outcomes == set(get_args(LoopOutcome))


def _rule(choice: dict[str, Any]) -> dict[str, str]:
    """A Choice rule as {variable: the string it equals}, an `And` of them flattened."""
    rules = choice.get("And", [choice])
    assert all(set(r) - {"Next"} == {"Variable", "StringEquals"} for r in rules), choice
    return {r["Variable"]: r["StringEquals"] for r in rules}


VERDICT_STATES = {
    "Approved": "approved",
    "ApprovalRejected": "rejected",
    "ApprovalExpired": "expired",
}
"""How the parked task ended -> the verdict its Pass state names for RecordDecision."""


def _catcher(state: str, error: str) -> dict[str, Any]:
    catchers: list[dict[str, Any]] = STATES[state]["Catch"]
    (catcher,) = [c for c in catchers if error in c["ErrorEquals"]]
    return catcher


def test_every_way_the_parked_task_ends_reaches_record_decision_with_its_verdict():
    await_approval = STATES["AwaitApproval"]
    ends = {
        "answered": await_approval["Next"],
        "timed out": _catcher("AwaitApproval", "States.Timeout")["Next"],
        "rejected": _catcher("AwaitApproval", REJECTED_ERROR)["Next"],
    }

    assert ends == {
        "answered": "Approved",
        "timed out": "ApprovalExpired",
        "rejected": "ApprovalRejected",
    }
    for name, verdict in VERDICT_STATES.items():
        state = STATES[name]
        assert (state["Type"], state["Result"], state["Next"]) == (
            "Pass",
            verdict,
            "RecordDecision",
        )
        assert state["ResultPath"] == "$.verdict"
    assert set(VERDICT_STATES.values()) == set(get_args(VerdictKind))
    assert set(get_args(VerdictKind)) == set(
        get_args(DecideRequest.model_fields["verdict"].annotation)
    )


def test_the_answer_reaches_record_decision_as_it_arrived():
    """Whatever a person's channel sent (or the timeout's error) lands at $.decision whole: no
    ResultSelector or OutputPath may pick fields out of it, or an answer lacking them would
    fail the state instead of becoming a decision."""
    await_approval = STATES["AwaitApproval"]
    assert "ResultSelector" not in await_approval
    assert "OutputPath" not in await_approval
    assert await_approval["ResultPath"] == "$.decision"
    for error in ("States.Timeout", REJECTED_ERROR):
        assert _catcher("AwaitApproval", error)["ResultPath"] == "$.decision"
    for name in VERDICT_STATES:
        assert not {"Parameters", "InputPath"} & set(STATES[name]), name
    payload = _payload("RecordDecision")
    assert (payload["verdict.$"], payload["answer.$"]) == ("$.verdict", "$.decision")


def test_only_an_unexpected_failure_of_the_parked_task_fails_the_run():
    catchers = STATES["AwaitApproval"]["Catch"]

    assert catchers[-1] == {
        "ErrorEquals": ["States.ALL"],
        "ResultPath": "$.error",
        "Next": "MarkFailed",
    }
    retried = {e for r in STATES["AwaitApproval"].get("Retry", []) for e in r["ErrorEquals"]}
    # A timeout or a rejection is an answer, not a failure to try again.
    assert not retried & {"States.ALL", "States.Timeout", "States.TaskFailed", REJECTED_ERROR}


def test_the_stored_request_expires_with_the_parked_task():
    await_approval = STATES["AwaitApproval"]

    assert await_approval["TimeoutSecondsPath"] == "$.approval_timeout_seconds"
    assert _payload("AwaitApproval")["timeout_seconds.$"] == await_approval["TimeoutSecondsPath"]
    assert _payload("AwaitApproval")["task_token.$"] == "$$.Task.Token"
    assert _payload("RecordDecision")["approval_timeout_seconds.$"] == "$.approval_timeout_seconds"


def test_record_decision_hands_only_its_small_result_to_the_next_step():
    record = STATES["RecordDecision"]

    assert record["ResultPath"] == "$.decision"
    assert {p.removeprefix("$.Payload.") for p in record["ResultSelector"].values()} <= set(
        DecideResult.model_fields
    )
    assert record["Next"] == "Step"


def test_a_second_execution_for_a_parked_run_ends_as_superseded():
    superseded = _catcher("Step", "Superseded")

    assert STATES[superseded["Next"]]["Type"] == "Succeed"
    assert (_retrier("Step", "Superseded") or {}).get("MaxAttempts") == 0


def test_a_busy_store_is_retried_and_never_reaches_the_catch_all():
    busy = [r for r in STATES["Step"]["Retry"] if "StoreBusy" in r["ErrorEquals"]]

    assert len(busy) == 1
    assert busy[0]["MaxAttempts"] >= MAX_ATTEMPTS


# --- waits for an event or a time ---------------------------------------------------------------


def test_a_waiting_run_parks_by_its_waits_kind_and_a_person_as_before():
    rules = [(_rule(c), c["Next"]) for c in STATES["Route"]["Choices"]]
    waiting = [(r, then) for r, then in rules if r["$.loop.outcome"] == "waiting"]

    assert waiting == [
        ({"$.loop.outcome": "waiting", "$.loop.wait.kind": "event"}, "AwaitEvent"),
        ({"$.loop.outcome": "waiting", "$.loop.wait.kind": "timer"}, "Sleep"),
        ({"$.loop.outcome": "waiting"}, "AwaitApproval"),
    ]
    assert set(get_args(WaitPlan.model_fields["kind"].annotation)) == {"person", "event", "timer"}
    # $.loop.wait is null unless the run waits: no rule reads it before every other
    # outcome has had its own.
    first_reading = next(i for i, (r, _) in enumerate(rules) if "$.loop.wait.kind" in r)
    assert {r["$.loop.outcome"] for r, _ in rules[:first_reading]} == set(get_args(LoopOutcome)) - {
        "waiting"
    }
    assert STATES["Step"]["ResultSelector"]["wait.$"] == "$.Payload.wait"


def test_an_event_wait_parks_on_a_task_token_for_at_most_the_plans_timeout():
    await_event = STATES["AwaitEvent"]

    assert await_event["Resource"] == "arn:aws:states:::lambda:invoke.waitForTaskToken"
    assert _payload("AwaitEvent")["task_token.$"] == "$$.Task.Token"
    assert _payload("AwaitEvent")["step.$"] == "$.loop.step"
    assert await_event["TimeoutSecondsPath"] == "$.loop.wait.timeout_seconds"
    assert "timeout_seconds" in WaitPlan.model_fields
    # The answer carries nothing the run needs (its head does): it is not kept.
    assert await_event["ResultPath"] is None
    assert await_event["Next"] == "Step"
    timeout = _catcher("AwaitEvent", "States.Timeout")
    assert (timeout["Next"], timeout["ResultPath"]) == ("RecordWait", None)
    retried = {e for r in await_event["Retry"] for e in r["ErrorEquals"]}
    assert not retried & {"States.ALL", "States.Timeout", "States.TaskFailed"}
    assert await_event["Catch"][-1] == {
        "ErrorEquals": ["States.ALL"],
        "ResultPath": "$.error",
        "Next": "MarkFailed",
    }


def test_a_timer_sleeps_in_a_wait_state_until_the_plans_time_then_records_it():
    sleep = STATES["Sleep"]

    assert sleep["Type"] == "Wait"
    assert sleep["TimestampPath"] == "$.loop.wait.wake_at"
    assert "wake_at" in WaitPlan.model_fields
    assert sleep["Next"] == "RecordWait"


def test_record_wait_settles_what_the_park_was_for_then_steps_again():
    record = STATES["RecordWait"]

    assert _payload("RecordWait") == {
        "run_id.$": "$.run_id",
        "step.$": "$.loop.step",
        "kind.$": "$.loop.wait.kind",
    }
    assert record["ResultPath"] is None
    assert record["Next"] == "Step"
    assert record["Catch"][-1]["Next"] == "MarkFailed"
    assert "recorded" in RecordWaitResult.model_fields


def test_the_step_knows_when_its_execution_started():
    assert _payload("Step")["started_at.$"] == "$$.Execution.StartTime"


@pytest.mark.parametrize("state", ["AwaitEvent", "RecordWait", "RecordDecision"])
@pytest.mark.parametrize("crash", CRASHES)
def test_a_wait_function_that_dies_is_run_again_not_failing_the_run(state: str, crash: str):
    # Each does only what is safe to do twice (keep a token, settle once, answer a settled
    # wait); the Catch that follows marks the run failed.
    retrier = _retrier(state, crash)

    assert retrier is not None, f"{state} fails the run when its function dies ({crash})"
    assert retrier["ErrorEquals"] != ["States.ALL"]
    assert retrier["MaxAttempts"] >= 2

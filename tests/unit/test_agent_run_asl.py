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
from ratchet.aws.approvals import REJECTED_ERROR, ApprovalAnswer
from ratchet.aws.payloads import (
    DecideRequest,
    ExecutionInput,
    LoopOutcome,
    MarkFailedRequest,
    NotifyRequest,
    StepRequest,
    StepResult,
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
}
"""Exactly what the CDK stack fills in."""

SERVICE_ERROR_PREFIXES = ("States.", "Lambda.", "StepFunctions.")
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


def test_the_step_retries_every_failed_attempt_up_to_the_engines_limit():
    retriers = {e: r for r in STATES["Step"]["Retry"] for e in r["ErrorEquals"]}
    attempt_errors = {
        name
        for name in RATCHET_ERRORS
        if issubclass(getattr(errors, name), errors.StepAttemptFailed)
    }
    assert attempt_errors <= set(retriers), "a StepAttemptFailed subclass is not retried"
    for name in [*attempt_errors, "Lambda.Unknown"]:
        assert retriers[name]["MaxAttempts"] == MAX_ATTEMPTS - 1, name
    assert "StaleVersion" not in retriers, "a stale step belongs to another execution"
    stale = next(c for c in STATES["Step"]["Catch"] if "StaleVersion" in c["ErrorEquals"])
    assert STATES[stale["Next"]]["Type"] == "Succeed", "a superseded execution fails no run"
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
    outcomes = {c["StringEquals"] for c in STATES["Route"]["Choices"]}
    assert outcomes == set(get_args(LoopOutcome))


def test_an_approval_answer_carries_what_the_decision_reads():
    selected = STATES["AwaitApproval"]["ResultSelector"]
    assert {p.removeprefix("$.") for k, p in selected.items() if k.endswith(".$")} == set(
        ApprovalAnswer.model_fields
    )


def test_a_busy_store_is_retried_and_never_reaches_the_catch_all():
    busy = [r for r in STATES["Step"]["Retry"] if "StoreBusy" in r["ErrorEquals"]]

    assert len(busy) == 1
    assert busy[0]["MaxAttempts"] >= MAX_ATTEMPTS

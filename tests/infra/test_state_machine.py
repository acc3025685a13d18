"""The agent-run state machine: the ASL file as written, its placeholders filled with the right
functions, logged in full, traced, and allowed to call exactly what it calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ratchet.cdk.workflow import (
    LAMBDA_INVOKE_WAIT,
    PLACEHOLDER_FUNCTIONS,
    START_EXECUTION,
    AslDefinition,
    UnsupportedDefinition,
)
from tests.infra.queries import as_list, function_id, statements_of_role
from tests.infra.synth import ASL, Synthesized, synthesize


def _state_machine(synth: Synthesized) -> tuple[str, dict[str, Any]]:
    ((logical_id, resource),) = synth.of_type("AWS::StepFunctions::StateMachine").items()
    return logical_id, resource["Properties"]


def _states(node: Any) -> list[dict[str, Any]]:
    """Every state of a definition, nested ones (Parallel, Map) included."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for value in node.get("States", {}).values():
            found.append(value)
        for value in node.values():
            found.extend(_states(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_states(item))
    return found


def test_state_machine_is_standard_logs_every_event_without_payloads_and_is_traced(
    synthesized: Synthesized,
) -> None:
    _, props = _state_machine(synthesized)

    assert props["StateMachineType"] == "STANDARD"
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is False
    (destination,) = props["LoggingConfiguration"]["Destinations"]
    group = destination["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    assert synthesized.resources[group]["Type"] == "AWS::Logs::LogGroup"
    assert props["TracingConfiguration"] == {"Enabled": True}


def test_definition_is_the_asl_file_verbatim(synthesized: Synthesized) -> None:
    _, props = _state_machine(synthesized)
    assert props["DefinitionString"] == ASL.read_text(encoding="utf-8")


def test_every_placeholder_is_filled_with_its_function(synthesized: Synthesized) -> None:
    _, props = _state_machine(synthesized)
    placeholders = AslDefinition.load(ASL).placeholders

    assert set(props["DefinitionSubstitutions"]) == placeholders
    for placeholder in placeholders:
        function = function_id(synthesized, PLACEHOLDER_FUNCTIONS[placeholder])
        assert props["DefinitionSubstitutions"][placeholder] == {"Fn::GetAtt": [function, "Arn"]}


def test_approvals_and_events_wait_for_a_task_token_handed_to_their_function() -> None:
    document = json.loads(ASL.read_text(encoding="utf-8"))
    waits = [s for s in _states(document) if s.get("Resource") == LAMBDA_INVOKE_WAIT]

    assert sorted(state["Parameters"]["FunctionName"] for state in waits) == [
        "${NotifyFunctionArn}",
        "${OpenWaitFunctionArn}",
    ]
    for state in waits:
        assert "$$.Task.Token" in json.dumps(state["Parameters"]["Payload"])


def test_role_may_invoke_exactly_the_functions_the_definition_calls(
    synthesized: Synthesized,
) -> None:
    _, props = _state_machine(synthesized)
    role = props["RoleArn"]["Fn::GetAtt"][0]
    invoke = [
        s for s in statements_of_role(synthesized, role) if "lambda:InvokeFunction" in s["Action"]
    ]

    (statement,) = invoke
    called = {
        function_id(synthesized, PLACEHOLDER_FUNCTIONS[p])
        for p in AslDefinition.load(ASL).placeholders
    }
    assert {r["Fn::GetAtt"][0] for r in as_list(statement["Resource"])} == called
    assert all(r["Fn::GetAtt"][1] == "Arn" for r in as_list(statement["Resource"]))


def test_role_may_start_only_its_own_successor(synthesized: Synthesized) -> None:
    _, props = _state_machine(synthesized)
    role = props["RoleArn"]["Fn::GetAtt"][0]
    starts = [
        s for s in statements_of_role(synthesized, role) if s["Action"] == "states:StartExecution"
    ]

    if not AslDefinition.load(ASL).starts_executions:
        assert starts == []
        return
    (statement,) = starts
    arn_parts = statement["Resource"]["Fn::Join"][1]
    assert arn_parts[-1] == f":stateMachine:{props['StateMachineName']}"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent_run.asl.json"
    path.write_text(text, encoding="utf-8")
    return path


def _with_rollover(tmp_path: Path) -> Path:
    """A small definition that rolls over both ways: a Lambda, then startExecution."""

    def invoke(placeholder: str, then: str) -> dict[str, Any]:
        return {
            "Type": "Task",
            "Resource": "arn:aws:states:::lambda:invoke",
            "Parameters": {
                "FunctionName": f"${{{placeholder}}}",
                "Payload": {"run_id.$": "$.run_id"},
            },
            "Next": then,
        }

    document = {
        "StartAt": "Step",
        "States": {
            "Step": invoke("StepFunctionArn", "AwaitApproval"),
            "AwaitApproval": {
                **invoke("NotifyFunctionArn", "Rollover"),
                "Resource": LAMBDA_INVOKE_WAIT,
            },
            "Rollover": invoke("RolloverFunctionArn", "StartSuccessor"),
            "StartSuccessor": {
                "Type": "Task",
                "Resource": START_EXECUTION,
                "Parameters": {
                    "StateMachineArn.$": "$$.StateMachine.Id",
                    "Input": {"run_id.$": "$.run_id"},
                },
                "End": True,
            },
        },
    }
    return _write(tmp_path, json.dumps(document, indent=2))


def test_rollover_gets_a_function_and_the_right_to_start_the_successor(tmp_path: Path) -> None:
    synth = synthesize(asl_path=_with_rollover(tmp_path))
    _, props = _state_machine(synth)
    own_arn = {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                ":states:",
                {"Ref": "AWS::Region"},
                ":",
                {"Ref": "AWS::AccountId"},
                f":stateMachine:{props['StateMachineName']}",
            ],
        ]
    }

    rollover = synth.resources[function_id(synth, "rollover")]["Properties"]
    assert rollover["Environment"]["Variables"]["RATCHET_STATE_MACHINE_ARN"] == own_arn
    rollover_role = rollover["Role"]["Fn::GetAtt"][0]
    machine_role = props["RoleArn"]["Fn::GetAtt"][0]
    for role in (rollover_role, machine_role):
        starts = [
            s for s in statements_of_role(synth, role) if s["Action"] == "states:StartExecution"
        ]
        assert [s["Resource"] for s in starts] == [own_arn]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "${Mystery}"}}}',
            "Mystery",
        ),
        ("{not json", "not valid JSON"),
        (
            '{"StartAt": "A", "States": {"A": {"Type": "Task", '
            '"Resource": "arn:aws:states:::sqs:sendMessage", "End": true}}}',
            "sqs:sendMessage",
        ),
    ],
)
def test_a_definition_the_stack_cannot_serve_fails_with_what_is_wrong(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(UnsupportedDefinition, match=message):
        AslDefinition.load(_write(tmp_path, text))


def test_a_missing_definition_says_which_file(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedDefinition, match="does not exist"):
        AslDefinition.load(tmp_path / "agent_run.asl.json")

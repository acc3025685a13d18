"""Least privilege: each function touches only its tables, nothing gets `*` but the actions that
have no resource-level permissions, and no role carries a managed policy but API Gateway's
account-wide logging role."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ratchet.adapters.dynamodb.items import RUNS_INDEX, WAKES_INDEX
from ratchet.cdk.stack import TABLES_USED
from tests.infra.queries import (
    as_list,
    function_id,
    function_names,
    statements_of_function,
    tables_by_role,
)
from tests.infra.synth import SynthesizedTemplate, UserApp

NO_RESOURCE_LEVEL = {
    # X-Ray: tracing from Lambda and Step Functions.
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    # CloudWatch Logs vended delivery, which Step Functions logging uses.
    "logs:CreateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:DescribeLogGroups",
    "logs:DescribeResourcePolicies",
    "logs:GetLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:UpdateLogDelivery",
    # Finding the table's stream, for the status-events function's event source mapping.
    "dynamodb:ListStreams",
}
"""Actions that IAM can only grant on `*`; each grant is acknowledged in cdk-nag with why."""


@pytest.fixture(params=["synthesized", "user_app"])
def template(request: pytest.FixtureRequest) -> SynthesizedTemplate:
    """Every test holds for the repository's stack and for a user's app that instantiates the
    construct (outside the repository, with a project of its own)."""
    held = request.getfixturevalue(request.param)
    return held.synthesized if isinstance(held, UserApp) else held


def _all_statements(synth: SynthesizedTemplate) -> list[dict[str, Any]]:
    return [
        statement
        for policy in synth.of_type("AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_only_actions_without_resource_level_permissions_get_a_wildcard_resource(
    template: SynthesizedTemplate,
) -> None:
    for statement in _all_statements(template):
        if "*" in as_list(statement["Resource"]):
            assert set(as_list(statement["Action"])) <= NO_RESOURCE_LEVEL, statement


def test_no_action_is_a_wildcard(template: SynthesizedTemplate) -> None:
    for statement in _all_statements(template):
        assert not [a for a in as_list(statement["Action"]) if "*" in a], statement


def test_every_statement_allows(template: SynthesizedTemplate) -> None:
    assert {s["Effect"] for s in _all_statements(template)} == {"Allow"}


def test_no_role_has_a_managed_policy_but_api_gateways_logging_role(
    template: SynthesizedTemplate,
) -> None:
    ((_, account),) = template.of_type("AWS::ApiGateway::Account").items()
    logging_role = account["Properties"]["CloudWatchRoleArn"]["Fn::GetAtt"][0]
    for logical_id, role in template.of_type("AWS::IAM::Role").items():
        if logical_id == logging_role:
            # The policy AWS documents for it; API Gateway alone may assume the role.
            (managed,) = role["Properties"]["ManagedPolicyArns"]
            assert managed["Fn::Join"][1][-1].endswith("/AmazonAPIGatewayPushToCloudWatchLogs")
            continue
        assert "ManagedPolicyArns" not in role["Properties"], logical_id


def _dynamodb_tables(statements: list[dict[str, Any]]) -> set[str]:
    """The tables the statements reach: `<id>` for a table, `<id>/index/<name>` for an index."""
    tables: set[str] = set()
    for statement in statements:
        if any(a.startswith("dynamodb:") for a in as_list(statement["Action"])):
            for resource in as_list(statement["Resource"]):
                if resource == "*":  # dynamodb:ListStreams, which names no table
                    continue
                if "Fn::GetAtt" in resource:
                    table, attribute = resource["Fn::GetAtt"]
                    tables.add(table + ("/stream" if attribute == "StreamArn" else ""))
                else:  # {"Fn::Join": ["", [{"Fn::GetAtt": [id, "Arn"]}, "/index/<name>"]]}
                    table, suffix = resource["Fn::Join"][1]
                    tables.add(table["Fn::GetAtt"][0] + suffix)
    return tables


def test_each_function_reaches_only_its_tables(template: SynthesizedTemplate) -> None:
    ids = tables_by_role(template)
    for name in function_names(template):
        statements = statements_of_function(template, name)
        expected = {ids[role] for role in TABLES_USED[name]}
        # A page of runs queries the runs index, the sweep the wakes index, and nothing else
        # reads either (or may).
        index = {"api": RUNS_INDEX.name, "sweep": WAKES_INDEX.name}.get(name)
        if index is not None:
            expected.add(f"{ids['checkpoints']}/index/{index}")
            (index_statement,) = [s for s in statements if "/index/" in json.dumps(s["Resource"])]
            assert as_list(index_statement["Action"]) == ["dynamodb:Query"]
        # Only the status-events function reads the checkpoints table's stream.
        if name == "status_events":
            expected.add(f"{ids['checkpoints']}/stream")
        assert _dynamodb_tables(statements) == expected, name


BLOB_ACTIONS = {
    "step": ["s3:GetObject", "s3:PutObject"],
    "open_wait": ["s3:GetObject"],
    "hooks": ["s3:GetObject", "s3:PutObject"],
    "sweep": ["s3:GetObject"],
}
"""The step stores and reads blobs; open_wait and the sweep read an event's large payload to
check it; the hooks function stores a delivery's large payload (and reads it back to check
it)."""


def test_only_the_functions_that_keep_blobs_reach_them_and_only_under_the_prefix(
    template: SynthesizedTemplate,
) -> None:
    for name in function_names(template):
        s3 = [
            s
            for s in statements_of_function(template, name)
            if any(a.startswith("s3:") for a in as_list(s["Action"]))
        ]
        if name not in BLOB_ACTIONS:
            assert s3 == []
            continue
        (statement,) = s3
        assert sorted(as_list(statement["Action"])) == BLOB_ACTIONS[name]
        bucket_arn, suffix = statement["Resource"]["Fn::Join"][1]
        assert suffix == "/blobs/*"
        assert template.resources[bucket_arn["Fn::GetAtt"][0]]["Type"] == "AWS::S3::Bucket"


def test_only_the_api_the_sweep_and_the_step_start_executions_of_this_state_machine(
    template: SynthesizedTemplate,
) -> None:
    """The API starts runs (and restarts a sleeper it wakes), the sweep restarts a sleeper
    whose waker died; the step starts child runs (`start_runs`), on this machine by its name
    (its ARN would make the machine and the step depend on each other)."""
    (machine,) = template.of_type("AWS::StepFunctions::StateMachine")
    for function in function_names(template) - {"rollover", "step"}:
        starts = [
            s
            for s in statements_of_function(template, function)
            if "states:StartExecution" in as_list(s["Action"])
        ]
        if function in ("api", "sweep"):
            assert [s["Resource"] for s in starts] == [{"Ref": machine}]
        else:
            assert starts == []


def test_the_step_may_start_children_and_it_and_mark_failed_wake_a_parent(
    template: SynthesizedTemplate,
) -> None:
    """A step starts its child runs' executions; a child's end (the step's commit, or
    mark_failed's) wakes its parked parent: StartExecution (the step) and SendTaskSuccess on
    this machine by its name, nothing else of Step Functions."""
    (machine,) = template.of_type("AWS::StepFunctions::StateMachine")
    name = template.resources[machine]["Properties"]["StateMachineName"]
    wanted = {
        "step": {"states:StartExecution", "states:SendTaskSuccess"},
        "mark_failed": {"states:SendTaskSuccess"},
    }
    for function, actions in wanted.items():
        granted = _states_actions(template, function)
        assert {a for given, _ in granted for a in given} == actions, function
        for _, resource in granted:
            assert resource["Fn::Join"][1][-1] == f":stateMachine:{name}"


def test_functions_may_write_only_their_own_log_group(template: SynthesizedTemplate) -> None:
    for name in function_names(template):
        function = template.resources[function_id(template, name)]["Properties"]
        own_group = function["LoggingConfig"]["LogGroup"]["Ref"]
        logs = [
            s
            for s in statements_of_function(template, name)
            if any(a.startswith("logs:") for a in as_list(s["Action"]))
        ]
        assert [s["Resource"] for s in logs] == [{"Fn::GetAtt": [own_group, "Arn"]}]


def _states_actions(synth: SynthesizedTemplate, name: str) -> list[tuple[list[str], Any]]:
    return [
        (sorted(as_list(s["Action"])), s["Resource"])
        for s in statements_of_function(synth, name)
        if any(a.startswith("states:") for a in as_list(s["Action"]))
    ]


def test_the_wait_functions_touch_the_run_items_one_by_one_and_only_open_wait_answers_a_task(
    template: SynthesizedTemplate,
) -> None:
    """open_wait keeps a token and answers its own task; record_wait only settles a wait. Both
    read and write the checkpoints table item by item: no scan, batch or delete."""
    (machine,) = template.of_type("AWS::StepFunctions::StateMachine")
    name = template.resources[machine]["Properties"]["StateMachineName"]
    for function in ("open_wait", "record_wait"):
        dynamodb = [
            sorted(as_list(s["Action"]))
            for s in statements_of_function(template, function)
            if any(a.startswith("dynamodb:") for a in as_list(s["Action"]))
        ]
        assert dynamodb == [
            ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"]
        ], function
    ((actions, resource),) = _states_actions(template, "open_wait")
    assert actions == ["states:SendTaskSuccess"]
    assert resource["Fn::Join"][1][-1] == f":stateMachine:{name}"
    assert _states_actions(template, "record_wait") == []


def test_the_hooks_function_may_do_exactly_what_a_delivery_needs(
    template: SynthesizedTemplate,
) -> None:
    """A public function (anyone may call it): the checkpoints table item by item (the hook
    item, the run's head and mailbox, one commit; no scan, batch or delete), blobs under the
    prefix, the hook key and no other secret, and SendTaskSuccess on this state machine."""
    statements = statements_of_function(template, "hooks")
    actions = {a for s in statements for a in as_list(s["Action"])}
    assert actions - {a for a in actions if a.startswith(("logs:", "xray:"))} == {
        "dynamodb:GetItem",
        "dynamodb:Query",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "s3:GetObject",
        "s3:PutObject",
        "secretsmanager:GetSecretValue",
        "secretsmanager:DescribeSecret",
        "states:SendTaskSuccess",
    }
    secrets = [s["Resource"] for s in statements if "secretsmanager:GetSecretValue" in s["Action"]]
    keys = template.of_type("AWS::SecretsManager::Secret")
    (hook_key,) = [k for k in keys if "WebhooksHookKey" in k]
    assert secrets == [{"Ref": hook_key}]
    (machine,) = template.of_type("AWS::StepFunctions::StateMachine")
    name = template.resources[machine]["Properties"]["StateMachineName"]
    ((states, resource),) = _states_actions(template, "hooks")
    assert states == ["states:SendTaskSuccess"]
    assert resource["Fn::Join"][1][-1] == f":stateMachine:{name}"

"""A project's schedules on AWS (`ratchet/cdk/schedules.py`): one EventBridge Scheduler schedule per
entry, its rule in Scheduler's form and zone, invoking the schedule function with the fire's
name and time, on a role that may invoke that function and nothing else; the function may
start runs as the API does and no more; cdk-nag and cfn-lint find nothing; a project without
schedules deploys none of it; and each mistake fails the synth in one line naming its key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import lint  # type: ignore[import-untyped]
from cfnlint.config import ManualArgs  # type: ignore[import-untyped]

from ratchet.cdk import contract
from ratchet.cdk.schedules import FUNCTION_RETRIES, RETRY_WITHIN, SCHEDULER_RETRIES
from ratchet.handlers.schedule import SCHEDULED_TIME, ScheduledFire
from ratchet.runtime.aws_settings import ENVIRONMENT
from tests.infra.queries import (
    as_list,
    environment,
    function_id,
    function_names,
    statements_of_function,
    statements_of_role,
    tables_by_role,
)
from tests.infra.synth import ANTHROPIC_SECRET, Synthesized, synthesize
from tests.infra.test_lint import IGNORED_CFN_LINT

SCHEDULES = """
[[tool.ratchet.schedules]]
name = "nightly"
agent = "acme"
cron = "30 2 * * 1-5"
timezone = "Europe/Berlin"
input = { account = "eu" }

[[tool.ratchet.schedules]]
name = "poll"
agent = "acme.agents:agent"
every = "15m"
"""


def write_project(folder: Path, schedules: str) -> Path:
    """A project with a package `acme`, its agent registered as `acme`, and `schedules`."""
    (folder / "src" / "acme").mkdir(parents=True)
    (folder / "src" / "acme" / "__init__.py").write_text("")
    (folder / "src" / "acme" / "agents.py").write_text("agent = None\n")
    (folder / "pyproject.toml").write_text(
        '[tool.ratchet]\nagents = { acme = "acme.agents:agent" }\nsource = "src"\n' + schedules
    )
    return folder


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    project = write_project(
        tmp_path_factory.mktemp("project"), 'models = { house = "acme.agents:model" }\n' + SCHEDULES
    )
    return synthesize(
        context={"ratchet:project": str(project), "ratchet:anthropicSecretArn": ANTHROPIC_SECRET}
    )


def _schedules(synth: Synthesized) -> dict[str, dict[str, Any]]:
    """Each schedule's properties, by the name in its target's input."""
    found = synth.of_type("AWS::Scheduler::Schedule").values()
    by_name = {}
    for schedule in found:
        properties = schedule["Properties"]
        by_name[json.loads(properties["Target"]["Input"])["schedule"]] = properties
    return by_name


def _scheduler_role(synth: Synthesized) -> str:
    (role,) = [
        logical_id
        for logical_id, role in synth.of_type("AWS::IAM::Role").items()
        if "scheduler.amazonaws.com" in json.dumps(role["Properties"]["AssumeRolePolicyDocument"])
    ]
    return role


def test_each_entry_is_one_schedule_in_the_schedulers_form_invoking_the_function(scheduled):
    schedules = _schedules(scheduled)
    function = {"Fn::GetAtt": [function_id(scheduled, "schedule"), "Arn"]}
    role = {"Fn::GetAtt": [_scheduler_role(scheduled), "Arn"]}

    assert sorted(schedules) == ["nightly", "poll"]
    nightly, poll = schedules["nightly"], schedules["poll"]
    assert nightly["ScheduleExpression"] == "cron(30 2 ? * MON-FRI *)"
    assert nightly["ScheduleExpressionTimezone"] == "Europe/Berlin"
    assert poll["ScheduleExpression"] == "rate(15 minutes)"
    assert "ScheduleExpressionTimezone" not in poll  # a rate counts from its creation
    for properties in (nightly, poll):
        assert properties["FlexibleTimeWindow"] == {"Mode": "OFF"}
        assert properties["State"] == "ENABLED"
        target = properties["Target"]
        assert (target["Arn"], target["RoleArn"]) == (function, role)
        assert target["RetryPolicy"] == {
            "MaximumEventAgeInSeconds": RETRY_WITHIN.to_seconds(),
            "MaximumRetryAttempts": SCHEDULER_RETRIES,
        }
    assert json.loads(nightly["Target"]["Input"]) == {
        "schedule": "nightly",
        "agent": "acme",
        "input": {"account": "eu"},
        "scheduled_time": SCHEDULED_TIME,
    }


def test_the_target_input_is_what_the_function_parses_once_scheduler_fills_in_the_time(
    scheduled,
):
    assert contract.SCHEDULED_TIME == SCHEDULED_TIME
    for properties in _schedules(scheduled).values():
        delivered = properties["Target"]["Input"].replace(SCHEDULED_TIME, "2026-12-02T01:30:00Z")
        fire = ScheduledFire.model_validate_json(delivered)
        assert fire.scheduled_time.isoformat() == "2026-12-02T01:30:00+00:00"


def test_the_schedulers_role_may_invoke_the_schedule_function_and_nothing_else(scheduled):
    role_id = _scheduler_role(scheduled)
    trust = scheduled.resources[role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]

    assert trust == [
        {
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}},
            "Effect": "Allow",
            "Principal": {"Service": "scheduler.amazonaws.com"},
        }
    ]
    assert statements_of_role(scheduled, role_id) == [
        {
            "Action": "lambda:InvokeFunction",
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [function_id(scheduled, "schedule"), "Arn"]},
        }
    ]
    managed = scheduled.resources[role_id]["Properties"].get("ManagedPolicyArns")
    assert managed is None


def test_the_schedule_function_may_start_runs_as_the_api_does_and_no_more(scheduled):
    (machine,) = scheduled.of_type("AWS::StepFunctions::StateMachine")
    tables = tables_by_role(scheduled)
    granted: dict[str, list[Any]] = {}
    for statement in statements_of_function(scheduled, "schedule"):
        for action in as_list(statement["Action"]):
            granted.setdefault(action.split(":")[0], []).append(statement["Resource"])

    assert set(granted) == {"dynamodb", "states", "secretsmanager", "logs", "xray"}
    assert granted["states"] == [{"Ref": machine}]  # StartExecution only
    starts = [
        s
        for s in statements_of_function(scheduled, "schedule")
        if "states:" in json.dumps(s["Action"])
    ]
    assert [as_list(s["Action"]) for s in starts] == [["states:StartExecution"]]
    reached = {
        json.dumps(resource, sort_keys=True)
        for resource in granted["dynamodb"]
        for resource in as_list(resource)
    }
    assert reached == {
        json.dumps({"Fn::GetAtt": [tables[t], "Arn"]}, sort_keys=True)
        for t in ("checkpoints", "idempotency", "app")
    }


def test_the_schedule_function_reads_the_settings_a_start_needs(scheduled):
    settings = {
        "checkpoints_table",
        "idempotency_table",
        "app_table",
        "blob_bucket",
        "rollover_after",
        "approval_timeout_seconds",
        "checkpoint_retention_days",
        "state_machine_arn",
        "agents",
        "models",
        "bedrock_models",
    }
    given = set(environment(scheduled, "schedule"))

    assert given - {n for n in given if n.startswith("POWERTOOLS_")} == {
        *(ENVIRONMENT[s] for s in settings),
        contract.ANTHROPIC_SECRET_ARN,  # a run defaults to Claude when a key is configured
    }
    assert json.loads(environment(scheduled, "schedule")["RATCHET_AGENTS"]) == {
        "acme": "acme.agents:agent"
    }


def test_the_functions_own_retries_of_a_failed_fire_end_within_the_hour(scheduled):
    (config,) = scheduled.of_type("AWS::Lambda::EventInvokeConfig").values()
    properties = config["Properties"]

    assert properties["FunctionName"] == {"Ref": function_id(scheduled, "schedule")}
    assert properties["MaximumRetryAttempts"] == FUNCTION_RETRIES
    assert properties["MaximumEventAgeInSeconds"] == RETRY_WITHIN.to_seconds()


def test_cdk_nag_and_cfn_lint_find_nothing_in_the_scheduled_stack(scheduled):
    report = AwsSolutionsChecks().validate_scope(scheduled.stack)
    assert [v.rule_name for v in report.violations] == []

    template = json.dumps(scheduled.template.to_json())
    config = ManualArgs(ignore_checks=IGNORED_CFN_LINT, regions=["us-east-1", "eu-west-1"])
    assert [str(match) for match in lint(template, config=config)] == []


def test_a_stack_without_schedules_deploys_no_schedule_function_role_or_schedule(
    synthesized: Synthesized,
):
    assert "schedule" not in function_names(synthesized)
    assert synthesized.of_type("AWS::Scheduler::Schedule") == {}
    assert "scheduler.amazonaws.com" not in json.dumps(synthesized.resources)


ENTRY = 'name = "n"\nagent = "acme"\n'
REFUSED = [
    (ENTRY + 'cron = "61 * * * *"', "schedules.0.cron: '61 * * * *' is not a five-field cron"),
    (ENTRY + 'every = "30s"', "schedules.0.every: 30s is under a minute, the shortest interval"),
    (
        ENTRY + 'every = "90s"',
        "schedules.0.every: 90 seconds is not a whole number of minutes, the unit of "
        "EventBridge Scheduler's rate()",
    ),
    (
        ENTRY + 'cron = "0 0 1 * 1"',
        "schedules.0.cron: '0 0 1 * 1' restricts both day-of-month and day-of-week",
    ),
    (
        ENTRY + 'cron = "0 9 * * *"\ntimezone = "Mars/Olympus"',
        "schedules.0.timezone: 'Mars/Olympus' is not a time zone",
    ),
    (ENTRY + 'cron = "0 9 * * *"\nevery = "1h"', "schedules.0.cron: give either cron or every"),
    (ENTRY, "schedules.0.cron: give either cron or every"),
    (
        ENTRY + 'every = "1h"\n[[tool.ratchet.schedules]]\n' + ENTRY + 'every = "2h"',
        "schedules.1.name: 'n' names schedules.0 too: name each once",
    ),
    (
        'name = "n"\nagent = "billing"\nevery = "1h"',
        "schedules.0.agent: 'billing' is not an agent this deployment registers",
    ),
    (ENTRY + 'crons = "0 9 * * *"', "schedules.0.crons: unknown key"),
]


@pytest.mark.parametrize(("entry", "said"), REFUSED)
def test_a_bad_schedule_fails_the_synth_in_one_line_naming_its_key(
    tmp_path: Path, entry: str, said: str
) -> None:
    project = write_project(tmp_path, "[[tool.ratchet.schedules]]\n" + entry + "\n")

    with pytest.raises(ValueError, match=r"\[tool\.ratchet\] schedules\.") as refused:
        synthesize(context={"ratchet:project": str(project)})

    message = str(refused.value)
    assert "\n" not in message
    assert str(project / "pyproject.toml") in message
    assert f"[tool.ratchet] {said}" in message

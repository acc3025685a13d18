"""A project's schedule on the deployed shape (moto, the state machine executing): the schedule
the stack synthesizes is created in EventBridge Scheduler as CloudFormation would create it,
and its target's input, with the fire's time filled in as Scheduler fills it in, is delivered
to the schedule function: the fire's run (its id derived from the schedule and the time) is
created and worked by one execution; the same fire delivered again starts nothing more. The
API's schedule routes say where schedules on AWS are declared."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import boto3
import pytest

from ratchet.adapters.stepfunctions import execution_name
from ratchet.handlers import schedule
from ratchet.handlers.schedule import SCHEDULED_TIME
from ratchet.schedules import fire_run_id
from ratchet.state import RunStatus
from ratchet.web.schedules import SCHEDULES_ON_AWS
from tests.infra.queries import function_id
from tests.infra.synth import Synthesized, synthesize
from tests.infra.test_schedules import write_project
from tests.integration.aws.harness import REGION, FakeContext, Stack, _placeholder_zip
from tests.integration.aws.test_api import call

SCHEDULES = """
[[tool.ratchet.schedules]]
name = "nightly"
agent = "rows"
cron = "30 2 * * 1-5"
timezone = "Europe/Berlin"
input = { batches = 2 }
"""
FUNCTION = "ratchet-schedule"
FIRED_AT = "2026-12-02T01:30:00Z"
"""A Wednesday at 02:30 in Berlin (CET): a time the schedule fires."""


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    # The project registers `rows` as the deployment on moto does (`harness.AGENTS`).
    project = write_project(tmp_path_factory.mktemp("project"), SCHEDULES)
    toml = project / "pyproject.toml"
    toml.write_text(toml.read_text().replace("agents = { acme =", "agents = { rows ="))
    return synthesize(context={"ratchet:project": str(project)})


@pytest.fixture
def scheduler(stack: Stack, synthesized: Synthesized) -> Any:
    """The synthesized schedule, created in moto's Scheduler with its function and role."""
    stack.lambdas.handlers[FUNCTION] = schedule.handler
    iam = boto3.client("iam")
    role = iam.create_role(RoleName="ratchet-scheduler", AssumeRolePolicyDocument="{}")["Role"]
    function = boto3.client("lambda", region_name=REGION).create_function(
        FunctionName=FUNCTION,
        Runtime="python3.13",
        Role=role["Arn"],
        Handler="unused",
        Code={"ZipFile": _placeholder_zip()},
    )["FunctionArn"]
    client = boto3.client("scheduler", region_name=REGION)
    (properties,) = synthesized.of_type("AWS::Scheduler::Schedule").values()
    properties = properties["Properties"]
    target = dict(properties["Target"])
    # What CloudFormation resolves: the schedule function's ARN, the scheduler role's.
    assert target.pop("Arn") == {"Fn::GetAtt": [function_id(synthesized, "schedule"), "Arn"]}
    target.pop("RoleArn")
    client.create_schedule(
        Name="nightly",
        **{k: v for k, v in properties.items() if k != "Target"},
        Target={**target, "Arn": function, "RoleArn": role["Arn"]},
    )
    return client


def _deliver(stack: Stack, scheduler: Any, at: str) -> dict[str, Any]:
    """Invoke the target with its input as Scheduler does at the fire time `at`."""
    target = scheduler.get_schedule(Name="nightly")["Target"]
    assert SCHEDULED_TIME in target["Input"]
    answer = boto3.client("lambda", region_name=REGION).invoke(
        FunctionName=target["Arn"], Payload=target["Input"].replace(SCHEDULED_TIME, at)
    )
    assert "FunctionError" not in answer, answer["Payload"].read()
    result: dict[str, Any] = json.loads(answer["Payload"].read())
    return result


def test_a_fire_starts_the_run_its_id_derives_and_a_repeated_fire_starts_nothing_more(
    stack: Stack, scheduler: Any
):
    described = scheduler.get_schedule(Name="nightly")
    assert described["ScheduleExpression"] == "cron(30 2 ? * MON-FRI *)"
    assert described["ScheduleExpressionTimezone"] == "Europe/Berlin"
    assert described["FlexibleTimeWindow"] == {"Mode": "OFF"}
    run_id = "nightly-20261202T013000Z"
    assert run_id == fire_run_id("nightly", datetime.fromisoformat(FIRED_AT))

    first = _deliver(stack, scheduler, FIRED_AT)

    assert first == {
        "run_id": run_id,
        "created": True,
        "execution_name": execution_name(run_id, 0),
        "refused": None,
    }
    assert stack.finished(first["execution_name"])["status"] == "SUCCEEDED"
    head = stack.head(run_id)
    assert (head.status, head.step) == (RunStatus.DONE, 2)  # input.batches = 2: two rows
    assert head.options.params["batches"] == 2

    again = _deliver(stack, scheduler, FIRED_AT)

    assert again == {**first, "created": False}
    assert [e["name"] for e in stack.executions()] == [execution_name(run_id, 0)]
    assert stack.head(run_id).version == head.version


def test_a_fire_the_start_refuses_is_answered_not_retried_and_writes_nothing(stack: Stack):
    # An agent the deployment no longer registers (the project changed, the schedule did not).
    before = stack.items()
    fire = {"schedule": "nightly", "agent": "retired", "scheduled_time": FIRED_AT}

    answer = schedule.handler(fire, FakeContext(FUNCTION, f"arn:{FUNCTION}"))

    assert answer["run_id"] == "nightly-20261202T013000Z"
    assert answer["refused"] is not None
    assert answer["refused"].startswith("unknown agent")
    assert answer["created"] is False
    assert stack.items() == before
    assert stack.executions() == []


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/schedules", None),
        ("POST", "/schedules", {"name": "nightly", "agent": "rows", "every": "1h"}),
        ("POST", "/schedules/nightly/pause", None),
        ("DELETE", "/schedules/nightly", None),
    ],
)
def test_the_apis_schedule_routes_answer_404_saying_where_schedules_are_declared(
    stack: Stack, method: str, path: str, body: dict[str, Any] | None
):
    before = stack.items()

    status, refused = call(method, path, body)

    assert status == 404
    assert refused["problems"] == [{"field": "(path)", "message": SCHEDULES_ON_AWS}]
    assert "[tool.ratchet] schedules" in SCHEDULES_ON_AWS
    assert stack.items() == before

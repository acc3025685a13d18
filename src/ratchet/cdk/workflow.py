"""The agent-run state machine, from `statemachine/agent_run.asl.json`.

The ASL file is the source of truth; the stack only fills in its `${...}` placeholders with
function ARNs and grants what its Task states call. A placeholder or an integration the stack
does not know fails the synth with a message that names it, instead of a state machine that
fails at run time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from ratchet.cdk.nag import acknowledge

PLACEHOLDER_FUNCTIONS = {
    "StepFunctionArn": "step",
    "NotifyFunctionArn": "notify",
    "DecideFunctionArn": "decide",
    "MarkFailedFunctionArn": "mark_failed",
    "OpenWaitFunctionArn": "open_wait",
    "RecordWaitFunctionArn": "record_wait",
    "RolloverFunctionArn": "rollover",
}
"""ASL placeholder -> the function (see `functions.py`) whose ARN fills it in."""

LAMBDA_INVOKE = "arn:aws:states:::lambda:invoke"
LAMBDA_INVOKE_WAIT = "arn:aws:states:::lambda:invoke.waitForTaskToken"
START_EXECUTION = "arn:aws:states:::states:startExecution"
INTEGRATIONS = {LAMBDA_INVOKE, LAMBDA_INVOKE_WAIT, START_EXECUTION}
"""The service integrations the state machine's role is granted for."""

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def state_machine_arn(scope: Construct, state_machine_name: str) -> str:
    """The machine's ARN built from its fixed name. What the machine's own definition refers to
    (its role's policy, a function it calls) cannot use `state_machine_arn`: that would make
    the machine depend on itself."""
    return Stack.of(scope).format_arn(
        service="states",
        resource="stateMachine",
        resource_name=state_machine_name,
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


class UnsupportedDefinition(ValueError):
    """The ASL file asks for something the stack does not provide."""


@dataclass(frozen=True)
class AslDefinition:
    """An ASL file, read and checked against what the stack can provide."""

    path: Path
    text: str
    placeholders: frozenset[str]
    resources: frozenset[str]

    @classmethod
    def load(cls, path: Path) -> AslDefinition:
        if not path.exists():
            raise UnsupportedDefinition(f"{path} does not exist: the stack needs the ASL file")
        text = path.read_text(encoding="utf-8")
        placeholders = frozenset(_PLACEHOLDER.findall(text))
        unknown = sorted(placeholders - PLACEHOLDER_FUNCTIONS.keys())
        if unknown:
            raise UnsupportedDefinition(
                f"{path} uses placeholders the stack does not fill in: "
                f"{', '.join('${' + name + '}' for name in unknown)}; known: "
                f"{', '.join('${' + name + '}' for name in sorted(PLACEHOLDER_FUNCTIONS))}"
            )
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise UnsupportedDefinition(f"{path} is not valid JSON: {error}") from error
        resources = frozenset(_task_resources(document))
        integrations = {
            resource
            for resource in resources
            if resource.startswith("arn:aws:states:::") and resource not in INTEGRATIONS
        }
        if integrations:
            raise UnsupportedDefinition(
                f"{path} calls integrations the stack grants nothing for: "
                f"{', '.join(sorted(integrations))}; supported: {', '.join(sorted(INTEGRATIONS))}"
            )
        return cls(path=path, text=text, placeholders=placeholders, resources=resources)

    @property
    def functions(self) -> list[str]:
        """The functions the definition calls, by name."""
        return sorted(PLACEHOLDER_FUNCTIONS[name] for name in self.placeholders)

    @property
    def starts_executions(self) -> bool:
        return START_EXECUTION in self.resources


def _task_resources(node: Any) -> Iterator[str]:
    """Every Task `Resource` in the document, including those in Parallel and Map states."""
    if isinstance(node, dict):
        if node.get("Type") == "Task" and isinstance(node.get("Resource"), str):
            yield node["Resource"]
        for value in node.values():
            yield from _task_resources(value)
    elif isinstance(node, list):
        for item in node:
            yield from _task_resources(item)


class AgentRunStateMachine(Construct):
    """A Standard state machine running the ASL file, logged in full and traced."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        definition: AslDefinition,
        functions: Mapping[str, lambda_.IFunction],
        state_machine_name: str,
        key: kms.IKey | None = None,
    ) -> None:
        """`key`: the deployment's own key, which the executions' data (inputs, outputs, the
        history) and the log group then use; CDK grants the machine's role its uses of it."""
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(
            self, "Logs", retention=logs.RetentionDays.ONE_MONTH, encryption_key=key
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=state_machine_name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_string(definition.text),
            definition_substitutions={
                name: functions[PLACEHOLDER_FUNCTIONS[name]].function_arn
                for name in sorted(definition.placeholders)
            },
            logs=sfn.LogOptions(
                destination=self.log_group,
                level=sfn.LogLevel.ALL,
                # Every state's entry and exit, without inputs and outputs: those hold the
                # approval task token (a bearer credential for the execution) and what a person
                # wrote. The execution history still shows them to whoever may read it.
                include_execution_data=False,
            ),
            tracing_enabled=True,
            encryption_configuration=(
                sfn.CustomerManagedEncryptionConfiguration(key) if key is not None else None
            ),
        )
        called = [functions[name] for name in definition.functions]
        if called:
            # The unqualified ARNs only: the Tasks call `$LATEST`, so CDK's grant_invoke (which
            # adds `<arn>:*` for every version and alias) would grant more than is used.
            self.state_machine.add_to_role_policy(
                iam.PolicyStatement(
                    actions=["lambda:InvokeFunction"],
                    resources=[function.function_arn for function in called],
                )
            )
        if definition.starts_executions:
            # Continue-as-new: the machine starts its own successor.
            self.state_machine.add_to_role_policy(
                iam.PolicyStatement(
                    actions=["states:StartExecution"],
                    resources=[state_machine_arn(self, state_machine_name)],
                )
            )
        acknowledge(
            self.state_machine,
            "AwsSolutions-IAM5[Resource::*]",
            (
                "Logging to CloudWatch Logs (logs:CreateLogDelivery, logs:PutResourcePolicy and "
                "the other log-delivery actions) and X-Ray tracing (xray:PutTraceSegments, "
                "xray:GetSamplingRules, ...) support no resource-level permissions."
            ),
        )

"""Finding things in a synthesized template: functions by handler, a function's policy, ..."""

from __future__ import annotations

from typing import Any

from tests.infra.synth import SynthesizedTemplate

HANDLERS = {
    "step": "ratchet_functions.step.handler",
    "notify": "ratchet_functions.notify.handler",
    "decide": "ratchet_functions.decide.handler",
    "mark_failed": "ratchet_functions.mark_failed.handler",
    "api": "ratchet_functions.api.handler",
    "rollover": "ratchet_functions.rollover.handler",
    "approvals": "ratchet_functions.approvals.handler",
    "open_wait": "ratchet_functions.open_wait.handler",
    "record_wait": "ratchet_functions.record_wait.handler",
    "hooks": "ratchet_functions.hooks.handler",
    "schedule": "ratchet_functions.schedule.handler",
    "sweep": "ratchet_functions.sweep.handler",
    "status_events": "ratchet_functions.status_events.handler",
}


def function_id(synth: SynthesizedTemplate, name: str) -> str:
    """The logical id of the function whose handler is `ratchet_functions.<name>.handler`."""
    found = [
        logical_id
        for logical_id, resource in synth.of_type("AWS::Lambda::Function").items()
        if resource["Properties"]["Handler"] == HANDLERS[name]
    ]
    assert len(found) == 1, f"{len(found)} functions with handler {HANDLERS[name]}"
    return found[0]


def function_names(synth: SynthesizedTemplate) -> set[str]:
    by_handler = {handler: name for name, handler in HANDLERS.items()}
    return {
        by_handler[resource["Properties"]["Handler"]]
        for resource in synth.of_type("AWS::Lambda::Function").values()
    }


def statements_of_role(synth: SynthesizedTemplate, role_id: str) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = []
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return statements


def statements_of_function(synth: SynthesizedTemplate, name: str) -> list[dict[str, Any]]:
    function = synth.resources[function_id(synth, name)]
    role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
    return statements_of_role(synth, role_id)


def environment(synth: SynthesizedTemplate, name: str) -> dict[str, Any]:
    """The environment variables of the function `name`."""
    function = synth.resources[function_id(synth, name)]
    variables: dict[str, Any] = function["Properties"]["Environment"]["Variables"]
    return variables


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def table_id(synth: SynthesizedTemplate, partition_key: str) -> str:
    found = [
        logical_id
        for logical_id, table in synth.of_type("AWS::DynamoDB::Table").items()
        if table["Properties"]["KeySchema"][0]["AttributeName"] == partition_key
    ]
    assert len(found) == 1, f"{len(found)} tables with partition key {partition_key}"
    return found[0]


TABLE_PARTITION_KEYS = {"checkpoints": "run_id", "idempotency": "key", "app": "pk"}


def tables_by_role(synth: SynthesizedTemplate) -> dict[str, str]:
    """Table role (`checkpoints`, `idempotency`, `app`) -> logical id."""
    return {role: table_id(synth, key) for role, key in TABLE_PARTITION_KEYS.items()}

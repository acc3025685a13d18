"""A template's fingerprint: what must not change when the stack's code moves.

The resources (logical ids and types), each function's handler, runtime, size and environment,
every IAM statement (policies, roles' trust and managed policies, Lambda permissions), the state
machine's definition, and the outputs; not the code asset's hash (it follows every edit of the
code) nor CDK's metadata (the construct paths). Statements are compared as sets: their order is
CDK's, not a permission.

`python -m tests.infra.fingerprint` writes the fingerprints of the templates the infra tests
synthesize (`tests/infra/fingerprints/`); do that, and review the diff, only when a change to
the stack is meant.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FINGERPRINTS = Path(__file__).resolve().parent / "fingerprints"

_IAM_POLICY_TYPES = {
    "AWS::IAM::Policy": "PolicyDocument",
    "AWS::S3::BucketPolicy": "PolicyDocument",
}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _statement(statement: Mapping[str, Any]) -> dict[str, Any]:
    normal = dict(statement)
    for key in ("Action", "NotAction"):
        if key in normal:
            normal[key] = sorted(_listed(normal[key]))
    for key in ("Resource", "NotResource"):
        if key in normal:
            normal[key] = sorted(_text(r) for r in _listed(normal[key]))
    return normal


def _statements(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    return sorted((_statement(s) for s in document["Statement"]), key=_text)


def fingerprint(template: Mapping[str, Any]) -> dict[str, Any]:
    resources: Mapping[str, Any] = template["Resources"]
    of_type: dict[str, dict[str, Any]] = {}
    for logical_id, resource in sorted(resources.items()):
        of_type.setdefault(resource["Type"], {})[logical_id] = resource.get("Properties", {})
    functions = {
        logical_id: {
            "handler": props["Handler"],
            "runtime": props["Runtime"],
            "architectures": props.get("Architectures"),
            "memory": props.get("MemorySize"),
            "timeout": props.get("Timeout"),
            "tracing": props.get("TracingConfig"),
            "role": props["Role"],
            "environment": props.get("Environment", {}).get("Variables", {}),
        }
        for logical_id, props in of_type.get("AWS::Lambda::Function", {}).items()
    }
    policies = {
        logical_id: {
            "attached_to": {
                key: sorted(_text(v) for v in props[key])
                for key in ("Roles", "Users", "Groups")
                if key in props
            }
            | ({"Bucket": _text(props["Bucket"])} if "Bucket" in props else {}),
            "statements": _statements(props[_IAM_POLICY_TYPES[resource_type]]),
        }
        for resource_type in _IAM_POLICY_TYPES
        for logical_id, props in of_type.get(resource_type, {}).items()
    }
    roles = {
        logical_id: {
            "trust": _statements(props["AssumeRolePolicyDocument"]),
            "managed": sorted(_text(arn) for arn in props.get("ManagedPolicyArns", [])),
            "inline": {
                policy["PolicyName"]: _statements(policy["PolicyDocument"])
                for policy in props.get("Policies", [])
            },
        }
        for logical_id, props in of_type.get("AWS::IAM::Role", {}).items()
    }
    permissions = {
        logical_id: {
            key: props.get(key) for key in ("Action", "FunctionName", "Principal", "SourceArn")
        }
        for logical_id, props in of_type.get("AWS::Lambda::Permission", {}).items()
    }
    machines = {
        logical_id: {
            "name": props.get("StateMachineName"),
            "type": props.get("StateMachineType"),
            "role": props.get("RoleArn"),
            "definition": _text(props.get("DefinitionString")),
            "substitutions": props.get("DefinitionSubstitutions"),
        }
        for logical_id, props in of_type.get("AWS::StepFunctions::StateMachine", {}).items()
    }
    return {
        "resources": {logical_id: r["Type"] for logical_id, r in sorted(resources.items())},
        "functions": functions,
        "iam": {"policies": policies, "roles": roles, "permissions": permissions},
        "state_machines": machines,
        "outputs": {
            name: {"description": output.get("Description"), "value": output["Value"]}
            for name, output in sorted(template.get("Outputs", {}).items())
        },
        "parameters": sorted(template.get("Parameters", {})),
    }


def _write_all() -> None:
    from tests.infra.conftest import VARIANTS

    FINGERPRINTS.mkdir(exist_ok=True)
    for name, build in VARIANTS.items():
        printed = fingerprint(build().template.to_json())
        path = FINGERPRINTS / f"{name}.json"
        path.write_text(json.dumps(printed, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{path}: {len(printed['resources'])} resources")


if __name__ == "__main__":
    _write_all()

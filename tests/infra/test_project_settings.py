"""A project's secrets, environment and permissions reach the step function and nothing else:
the billing example (the README's refund agent on AWS), unchanged but for its project file,
synthesizes into a stack whose step role may read its secret and call its one route, where no
other role gained anything; a wildcard comes with its reason or the synth refuses; every
mistake names the file and the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cdk_nag import AwsSolutionsChecks

from ratchet.cdk.project import Project, ProjectError
from tests.infra.queries import function_id, function_names, statements_of_function
from tests.infra.synth import Synthesized, synthesize

ROUTE = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/prod/POST/refunds"


def _statements(synth: Synthesized) -> dict[str, list[str]]:
    return {
        name: sorted(json.dumps(s, sort_keys=True) for s in statements_of_function(synth, name))
        for name in function_names(synth)
    }


def _variables(synth: Synthesized, name: str) -> dict[str, Any]:
    function = synth.resources[function_id(synth, name)]["Properties"]
    return dict(function["Environment"]["Variables"])


def test_only_the_step_role_gains_the_projects_secret_and_its_route(with_project, synthesized):
    gained, before = _statements(with_project), _statements(synthesized)

    assert {name for name in gained if gained[name] != before[name]} == {"step"}
    new = [json.loads(s) for s in gained["step"] if s not in before["step"]]
    assert sorted((s["Action"], json.dumps(s["Resource"], sort_keys=True)) for s in new) == sorted(
        [
            ("execute-api:Invoke", json.dumps(ROUTE)),
            ("secretsmanager:GetSecretValue", json.dumps(_secret_arn())),
        ]
    )


def test_only_the_step_function_is_told_the_secrets_and_the_environment(with_project):
    step = _variables(with_project, "step")

    assert json.loads(_rendered(step["RATCHET_SECRETS"])) == {
        "PAYMENTS_API_KEY": "secretsmanager:arn:${AWS::Partition}:secretsmanager:"
        "${AWS::Region}:${AWS::AccountId}:secret:billing/payments-api-key-??????"
    }
    assert step["PAYMENTS_URL"] == "https://payments.example.com/v1"
    for name in function_names(with_project) - {"step"}:
        assert not {"RATCHET_SECRETS", "PAYMENTS_URL"} & set(_variables(with_project, name))


def _secret_arn() -> dict[str, Any]:
    return {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                ":secretsmanager:",
                {"Ref": "AWS::Region"},
                ":",
                {"Ref": "AWS::AccountId"},
                ":secret:billing/payments-api-key-??????",
            ],
        ]
    }


def _rendered(value: Any) -> str:
    """A template value as text, each reference as `${Name}` (how CloudFormation reads it)."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return f"${{{value['Ref']}}}"
    separator, parts = value["Fn::Join"]
    return str(separator).join(_rendered(part) for part in parts)


def _project(tmp_path: Path, table: str) -> Path:
    (tmp_path / "src" / "acme").mkdir(parents=True)
    (tmp_path / "src" / "acme" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ratchet]\nagents = { acme = "acme:agent" }\nsource = "src"\n' + table
    )
    return tmp_path


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('secrets = { "payments key" = "ssm:/a" }\n', "secrets: 'payments key' is not a name"),
        ('secrets = { AWS_REGION = "ssm:/a" }\n', "secrets: 'AWS_REGION' is Lambda's"),
        ('secrets = { KEY = "vault:kv/a" }\n', "secrets: KEY: 'vault:kv/a' names no secret"),
        ('environment = { RATCHET_STORE = "x" }\n', "environment: 'RATCHET_STORE' is Lambda's"),
        (
            'secrets = { KEY = "ssm:/a" }\nenvironment = { KEY = "x" }\n',
            "environment.KEY: is a secret's name too",
        ),
        (
            '[[tool.ratchet.permissions]]\nactions = ["s3:GetObject"]\n'
            'resources = ["arn:aws:s3:::bucket/*"]\n',
            "permissions.0: arn:aws:s3:::bucket/* holds a wildcard: say why in reason",
        ),
        (
            '[[tool.ratchet.permissions]]\nactions = ["s3:*"]\nresources = ["*"]\n'
            'reason = "everything, for now"\n',
            "permissions.0.actions: 's3:*' allows every action of a service",
        ),
        (
            '[[tool.ratchet.permissions]]\nactions = ["GetObject"]\nresources = ["arn:x"]\n',
            "permissions.0.actions: 'GetObject' is not an IAM action",
        ),
    ],
)
def test_a_mistake_names_the_file_and_the_key(tmp_path, table, said):
    folder = _project(tmp_path, table)

    with pytest.raises(ProjectError) as refused:
        Project.load(folder)

    assert f"{folder / 'pyproject.toml'}: [tool.ratchet] {said}" in str(refused.value)


def test_a_wildcard_with_its_reason_is_granted_and_acknowledged(tmp_path):
    folder = _project(
        tmp_path,
        '[[tool.ratchet.permissions]]\nactions = ["s3:GetObject"]\n'
        'resources = ["arn:aws:s3:::acme-invoices/*"]\n'
        'reason = "Invoices are keyed by order id, unknown at deploy time."\n',
    )

    synth = synthesize(context={"ratchet:project": str(folder)})

    granted = [s for s in statements_of_function(synth, "step") if s["Action"] == "s3:GetObject"]
    assert [s["Resource"] for s in granted] == ["arn:aws:s3:::acme-invoices/*"]
    report = AwsSolutionsChecks().validate_scope(synth.stack)
    assert [v.rule_name for v in report.violations] == []


def test_cdk_nag_stays_clean_with_the_examples_settings(with_project):
    report = AwsSolutionsChecks().validate_scope(with_project.stack)
    assert [v.rule_name for v in report.violations] == []


def test_the_projects_own_models_reach_the_api_and_the_step(tmp_path):
    folder = _project(tmp_path, 'models = { house = "acme:model" }\n')

    synth = synthesize(context={"ratchet:project": str(folder)})

    told = {name for name in function_names(synth) if "RATCHET_MODELS" in _variables(synth, name)}
    assert told == {"api", "step"}
    assert json.loads(_variables(synth, "step")["RATCHET_MODELS"]) == {"house": "acme:model"}


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('models = { scripted = "acme:model" }\n', "models: 'scripted' is a built-in model's name"),
        (
            'models = { house = "nowhere:model" }\n',
            "models.house: 'nowhere:model' needs the package",
        ),
    ],
)
def test_a_bad_model_names_the_key(tmp_path, table, said):
    folder = _project(tmp_path, table)
    with pytest.raises(ProjectError, match=said):
        Project.load(folder)

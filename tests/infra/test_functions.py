"""The functions: the handlers they name exist, they share one asset, and their environment is
exactly what `ratchet.aws.settings` reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from aws_cdk import App

from cdk import contract
from cdk.bundling import ARCHITECTURE, RUNTIME
from cdk.config import DeployConfig
from cdk.workflow import AslDefinition
from ratchet.aws.settings import ENVIRONMENT, AwsSettings
from tests.infra.queries import HANDLERS, function_id, function_names, statements_of_function
from tests.infra.synth import ASL, REPO_ROOT, Synthesized, synthesize

CORE_FUNCTIONS = {"step", "notify", "decide", "mark_failed", "api"}
POWERTOOLS = {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_LOG_LEVEL"}
SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ratchet/anthropic-AbCdEf"


def _environment(synth: Synthesized, name: str) -> dict[str, object]:
    function = synth.resources[function_id(synth, name)]
    variables: dict[str, object] = function["Properties"]["Environment"]["Variables"]
    return variables


def test_the_stack_has_the_core_functions_and_those_the_definition_calls(
    synthesized: Synthesized,
) -> None:
    called = set(AslDefinition.load(ASL).functions)
    assert function_names(synthesized) == CORE_FUNCTIONS | called


@pytest.mark.parametrize("name", sorted(CORE_FUNCTIONS))
def test_each_handler_is_a_function_in_the_package(name: str) -> None:
    module, attribute = HANDLERS[name].rsplit(".", 1)
    source = REPO_ROOT / "lambdas" / Path(*module.split(".")).with_suffix(".py")
    assert source.exists(), f"{HANDLERS[name]}: no {source.relative_to(REPO_ROOT)}"
    defined = {
        node.name
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.FunctionDef)
    }
    assert attribute in defined


def test_functions_share_one_asset_and_match_the_bundling_platform(
    synthesized: Synthesized,
) -> None:
    functions = synthesized.of_type("AWS::Lambda::Function").values()
    assert len({repr(f["Properties"]["Code"]) for f in functions}) == 1
    for function in functions:
        props = function["Properties"]
        assert props["Runtime"] == RUNTIME.name
        assert props["Architectures"] == [ARCHITECTURE.name]
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert "LogGroup" in props["LoggingConfig"]


def test_every_function_logs_to_its_own_group_with_a_retention(synthesized: Synthesized) -> None:
    functions = synthesized.of_type("AWS::Lambda::Function").values()
    groups = [f["Properties"]["LoggingConfig"]["LogGroup"]["Ref"] for f in functions]
    assert len(set(groups)) == len(groups)
    for group in groups:
        assert synthesized.resources[group]["Properties"]["RetentionInDays"] == 30


@pytest.mark.parametrize("name", sorted(CORE_FUNCTIONS))
def test_each_function_gets_exactly_the_settings_it_reads(
    synthesized: Synthesized, name: str
) -> None:
    # Every handler builds `AwsSettings` (the tables are required); only the API starts
    # executions, so only it gets the state machine's ARN.
    expected = set(ENVIRONMENT.values()) - {ENVIRONMENT["state_machine_arn"]}
    if name == "api":
        expected.add(ENVIRONMENT["state_machine_arn"])

    assert set(_environment(synthesized, name)) == expected | POWERTOOLS


def test_the_settings_the_stack_passes_are_valid_settings(synthesized: Synthesized) -> None:
    environment = {
        key: value if isinstance(value, str) else "resolved-at-deploy"
        for key, value in _environment(synthesized, "api").items()
    }
    settings = AwsSettings.from_env(environment)
    assert settings.rollover_after == DeployConfig().rollover_after


def test_deploy_defaults_are_the_runtime_defaults() -> None:
    defaults = AwsSettings(checkpoints_table="ckp", idempotency_table="idm", app_table="app")
    config = DeployConfig()
    assert config.rollover_after == defaults.rollover_after
    assert config.approval_timeout_seconds == defaults.approval_timeout_seconds
    assert config.checkpoint_retention_days == defaults.checkpoint_retention_days


def test_context_overrides_the_runtime_settings() -> None:
    app = App(context={"ratchet:rolloverAfter": "50", "ratchet:approvalTimeoutSeconds": 600})
    config = DeployConfig.from_context(app)
    assert (config.rollover_after, config.approval_timeout_seconds) == (50, 600)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ratchet:rolloverAfter", "many"),
        ("ratchet:checkpointRetentionDays", "0"),
        ("ratchet:anthropicSecretArn", "ratchet/anthropic"),
    ],
)
def test_bad_context_fails_the_synth_with_its_key(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=key):
        DeployConfig.from_context(App(context={key: value}))


def test_without_a_secret_no_function_can_read_one(synthesized: Synthesized) -> None:
    for name in function_names(synthesized):
        assert contract.ANTHROPIC_SECRET_ARN not in _environment(synthesized, name)
        actions = {
            action
            for statement in statements_of_function(synthesized, name)
            for action in statement["Action"]
        }
        assert not any(action.startswith("secretsmanager:") for action in actions)


def test_the_names_outside_the_settings_are_the_ones_the_handlers_use() -> None:
    from ratchet.handlers import _wiring

    assert contract.ANTHROPIC_SECRET_ARN == _wiring.ANTHROPIC_SECRET_ARN
    assert contract.POWERTOOLS_SERVICE_NAME == _wiring.SERVICE
    assert contract.POWERTOOLS_METRICS_NAMESPACE == _wiring.METRICS_NAMESPACE


@pytest.fixture(scope="module")
def with_secret() -> Synthesized:
    return synthesize(context={"ratchet:anthropicSecretArn": SECRET_ARN})


@pytest.mark.parametrize("name", sorted(CORE_FUNCTIONS))
def test_a_configured_secret_reaches_the_step_and_the_api_only(
    with_secret: Synthesized, name: str
) -> None:
    environment = _environment(with_secret, name)
    reads = [
        statement
        for statement in statements_of_function(with_secret, name)
        if "secretsmanager:GetSecretValue" in statement["Action"]
    ]
    if name in {"step", "api"}:
        assert environment[contract.ANTHROPIC_SECRET_ARN] == SECRET_ARN
        assert [statement["Resource"] for statement in reads] == [SECRET_ARN]
    else:
        assert contract.ANTHROPIC_SECRET_ARN not in environment
        assert reads == []
